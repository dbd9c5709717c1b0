// RouteSignalsToOwnThread: process-directed signals run their handlers on
// the routing thread, never on the main thread or a thread started later;
// default actions are unchanged. Each case runs in a forked child, whose
// masks and handlers die with it.
#include "core/signal_thread.h"

#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "gtest/gtest.h"

namespace loom::core {
namespace {

// Runs `body` in a child process. Returns its exit status, or 100 + the
// signal that ended it.
template <typename Body>
int InChild(Body body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) return 100 + WTERMSIG(status);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 99;
}

pid_t Tid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

std::atomic<int> g_handled{0};
std::atomic<pid_t> g_handler_tid{0};
void Record(int) {  // async-signal-safe: a system call and lock-free atomics
  g_handler_tid.store(Tid());
  g_handled.fetch_add(1);
}

bool HandledWithin(int count, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (g_handled.load() < count) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(SignalThreadTest, HandlersRunOnTheRoutingThreadOnly) {
  EXPECT_EQ(InChild([] {
              RouteSignalsToOwnThread({SIGTERM, SIGUSR1});
              signal(SIGTERM, Record);
              signal(SIGUSR1, Record);
              // A busy thread started afterwards (a compute or UCX thread).
              std::atomic<pid_t> worker_tid{0};
              std::atomic<bool> stop{false};
              std::thread worker([&] {
                worker_tid = Tid();
                while (!stop.load()) {
                }
              });
              while (worker_tid.load() == 0) std::this_thread::yield();
              int code = 0;
              const int sigs[] = {SIGTERM, SIGUSR1, SIGTERM, SIGUSR1};
              for (int i = 0; i < 4 && code == 0; ++i) {
                kill(getpid(), sigs[i]);  // process-directed, as the agent sends it
                if (!HandledWithin(i + 1, std::chrono::seconds(10))) code = 1 + i;
                const pid_t t = g_handler_tid.load();
                if (t == Tid() || t == worker_tid.load()) code = 10 + i;
              }
              stop = true;
              worker.join();
              return code;
            }),
            0);
}

TEST(SignalThreadTest, DefaultActionsAreUnchanged) {
  // Routed but not handled: SIGTERM still ends the process, as it would have.
  EXPECT_EQ(InChild([] {
              RouteSignalsToOwnThread({SIGTERM});
              kill(getpid(), SIGTERM);
              for (;;) pause();
              return 0;
            }),
            100 + SIGTERM);
}

TEST(SignalThreadTest, OtherSignalsAreLeftAlone) {
  // SIGUSR2 was not routed: a thread started afterwards does not block it.
  EXPECT_EQ(InChild([] {
              RouteSignalsToOwnThread({SIGTERM});
              int code = 0;
              std::thread([&] {
                sigset_t mask;
                pthread_sigmask(SIG_BLOCK, nullptr, &mask);
                if (sigismember(&mask, SIGTERM) != 1) code = 1;
                if (sigismember(&mask, SIGUSR2) != 0) code = 2;
              }).join();
              return code;
            }),
            0);
}

}  // namespace
}  // namespace loom::core
