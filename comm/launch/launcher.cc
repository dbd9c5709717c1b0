#include "comm/launch/launcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/launch/discovery.h"

extern char** environ;

namespace loom::comm::launch {
namespace {

volatile sig_atomic_t g_forward_signal = 0;  // set by the handler only
void OnSignal(int sig) { g_forward_signal = sig; }

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  return absl::StrCat("ended with wait status ", status);
}

}  // namespace

bool IsLaunchedChild() {
  const char* v = std::getenv("LOOM_LAUNCHED");
  return v != nullptr && std::string(v) == "1";
}

int RestartCount() {
  const char* v = std::getenv("LOOM_RESTART_COUNT");
  int n = 0;
  return v != nullptr && absl::SimpleAtoi(v, &n) && n > 0 ? n : 0;
}

absl::StatusOr<int> PickFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("picking a free port: ", std::strerror(errno)));
  }
  close(fd);
  return ntohs(addr.sin_port);
}

absl::Status LaunchAndWait(const LaunchOptions& o, int argc, char** argv) {
  const int n = o.nproc_per_node;
  if (n < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nproc-per-node=", n, " must be >= 1"));
  }
  // A rank started by someone else never starts ranks of its own (see plan.h).
  if (IsLaunchedChild()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--nproc-per-node=", n, ": this process is already a rank started by --nproc-per-node"));
  }
  if (std::vector<std::string> ext = ExternalRankSettings({}, RealEnv()); !ext.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--nproc-per-node=", n, " would start ", n, " ranks here, but this process is already "
        "one rank of a job started by someone else (", absl::StrJoin(ext, ", "),
        "): its launcher (torchrun, mpirun, srun) starts the ranks. Drop --nproc-per-node, or "
        "unset those variables"));
  }
  int port = o.master_port;
  if (port == 0) {
    absl::StatusOr<int> p = PickFreePort();
    if (!p.ok()) return p.status();
    port = *p;
  }
  // Environment for each child, built before fork (no allocation after it).
  static const char* kOverridden[] = {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=",
                                      "MASTER_ADDR=", "MASTER_PORT=", "LOOM_LAUNCHED="};
  std::vector<std::string> base;
  for (char** e = environ; *e; ++e) {
    bool skip = false;
    for (const char* k : kOverridden) skip = skip || absl::StartsWith(*e, k);
    if (!skip) base.push_back(*e);
  }
  std::vector<std::vector<std::string>> envs(n, base);
  std::vector<std::vector<char*>> envps(n);
  for (int r = 0; r < n; ++r) {
    envs[r].push_back(absl::StrCat("RANK=", r));
    envs[r].push_back(absl::StrCat("WORLD_SIZE=", n));
    envs[r].push_back(absl::StrCat("LOCAL_RANK=", r));
    envs[r].push_back(absl::StrCat("LOCAL_WORLD_SIZE=", n));
    envs[r].push_back(absl::StrCat("MASTER_ADDR=", o.master_addr));
    envs[r].push_back(absl::StrCat("MASTER_PORT=", port));
    envs[r].push_back("LOOM_LAUNCHED=1");
    for (auto& s : envs[r]) envps[r].push_back(s.data());
    envps[r].push_back(nullptr);
  }
  std::vector<char*> args(argv, argv + argc);
  args.push_back(nullptr);

  struct sigaction sa {}, old_int{}, old_term{};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  g_forward_signal = 0;

  const pid_t parent = getpid();
  std::vector<pid_t> pids(n, -1);
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);  // the launcher already died
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      execve("/proc/self/exe", args.data(), envps[r].data());
      _exit(127);
    }
    if (pid < 0) {
      for (int q = 0; q < r; ++q) kill(pids[q], SIGKILL);
      for (int q = 0; q < r; ++q) waitpid(pids[q], nullptr, 0);
      sigaction(SIGINT, &old_int, nullptr);
      sigaction(SIGTERM, &old_term, nullptr);
      return absl::ResourceExhaustedError(absl::StrCat("fork of rank ", r, " failed: ",
                                                       std::strerror(errno)));
    }
    pids[r] = pid;
  }

  int alive = n;
  absl::Status result;
  bool stopping = false;
  absl::Time kill_at = absl::InfiniteFuture();
  auto stop_all = [&](int sig) {
    for (int r = 0; r < n; ++r) {
      if (pids[r] > 0) kill(pids[r], sig);
    }
  };
  while (alive > 0) {
    if (g_forward_signal != 0) {
      int sig = g_forward_signal;
      g_forward_signal = 0;
      stop_all(sig);
      if (result.ok()) {
        result = absl::CancelledError(absl::StrCat("launcher received signal ", sig, " (",
                                                   strsignal(sig), "); forwarded it to the ranks"));
      }
      if (!stopping) {
        stopping = true;
        kill_at = absl::Now() + o.kill_grace;
      }
    }
    if (stopping && absl::Now() >= kill_at) {
      stop_all(SIGKILL);
      kill_at = absl::InfiniteFuture();
    }
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid == 0 || (pid < 0 && errno == EINTR)) {
      usleep(10000);
      continue;
    }
    if (pid < 0) break;  // no children left
    int r = 0;
    while (r < n && pids[r] != pid) ++r;
    if (r == n) continue;  // not ours
    pids[r] = -1;
    --alive;
    bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (failed && !stopping) {
      result = absl::InternalError(absl::StrCat("rank ", r, " (pid ", pid, ") ",
                                                DescribeExit(status),
                                                "; stopped the other ranks"));
      stopping = true;
      stop_all(SIGTERM);
      kill_at = absl::Now() + o.kill_grace;
    }
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  return result;
}

}  // namespace loom::comm::launch
