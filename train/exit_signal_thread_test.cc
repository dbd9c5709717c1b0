// TakeExitSignalOnOwnThread: SIGTERM reaches only its waiting thread. Each
// case runs in a forked child, whose signal mask and flag die with it.
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "train/exit_signal.h"

namespace loom::train {
namespace {

// Runs `body` in a child process; its return value is the child's exit status.
template <typename Body>
int InChild(Body body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status)) return 100 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return WEXITSTATUS(status);
}

bool TermBlockedHere() {
  sigset_t mask;
  pthread_sigmask(SIG_BLOCK, nullptr, &mask);
  return sigismember(&mask, SIGTERM) == 1;
}

bool FlagWithin(std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!ExitSignalReceived()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(ExitSignalThreadTest, LaterThreadsBlockSigtermAndTheWatcherSetsTheFlag) {
  EXPECT_EQ(InChild([] {
              TakeExitSignalOnOwnThread();
              if (!TermBlockedHere()) return 1;
              // A thread started afterwards (a compute or UCX thread) inherits the mask.
              bool worker_blocked = false;
              std::atomic<bool> stop{false};
              std::thread worker([&] {
                worker_blocked = TermBlockedHere();
                while (!stop.load()) std::this_thread::yield();
              });
              if (ExitSignalReceived()) return 2;
              kill(getpid(), SIGTERM);  // process-directed, as the agent sends it
              const bool got = FlagWithin(std::chrono::seconds(10));
              stop = true;
              worker.join();
              if (!worker_blocked) return 3;
              return got ? 0 : 4;
            }),
            0);
}

TEST(ExitSignalThreadTest, WithoutItSigtermStillEndsTheProcess) {
  // The mask is only taken on request: a rank without --exit-signal-handler dies.
  EXPECT_EQ(InChild([] {
              kill(getpid(), SIGTERM);
              pause();
              return 0;
            }),
            100 + SIGTERM);
}

TEST(ExitSignalThreadTest, EverySignalIsTaken) {
  // A second SIGTERM (the agent forwards each one it gets) is taken too: the
  // process neither dies of it nor leaves it pending.
  EXPECT_EQ(InChild([] {
              TakeExitSignalOnOwnThread();
              for (int i = 0; i < 3; ++i) {
                ResetExitSignalForTesting();
                kill(getpid(), SIGTERM);
                if (!FlagWithin(std::chrono::seconds(10))) return 1 + i;
              }
              return 0;
            }),
            0);
}

}  // namespace
}  // namespace loom::train
