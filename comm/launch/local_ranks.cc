#include "comm/launch/local_ranks.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace loom::comm::launch {

bool LocalRanks::Exit::ok() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

std::string LocalRanks::Exit::Describe() const {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  return absl::StrCat("ended with wait status ", status);
}

LocalRanks::~LocalRanks() {
  if (running_ > 0) Stop(absl::ZeroDuration());
}

absl::Status LocalRanks::Start(const std::vector<std::vector<std::string>>& envs,
                               const std::vector<std::string>& argv) {
  // Everything the child needs is built before fork: no allocation after it.
  std::vector<std::vector<char*>> envps(envs.size());
  for (size_t r = 0; r < envs.size(); ++r) {
    for (const std::string& s : envs[r]) envps[r].push_back(const_cast<char*>(s.c_str()));
    envps[r].push_back(nullptr);
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  const pid_t parent = getpid();
  pids_.assign(envs.size(), -1);
  running_ = 0;
  for (size_t r = 0; r < envs.size(); ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);  // the agent already died
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      execve("/proc/self/exe", args.data(), envps[r].data());
      _exit(127);
    }
    if (pid < 0) {
      const int err = errno;
      Stop(absl::ZeroDuration());
      return absl::ResourceExhaustedError(
          absl::StrCat("fork of local rank ", r, " failed: ", std::strerror(err)));
    }
    pids_[r] = pid;
    ++running_;
  }
  return absl::OkStatus();
}

std::vector<LocalRanks::Exit> LocalRanks::Reap() {
  std::vector<Exit> out;
  for (size_t r = 0; r < pids_.size(); ++r) {
    if (pids_[r] <= 0) continue;
    int status = 0;
    const pid_t pid = waitpid(pids_[r], &status, WNOHANG);
    if (pid != pids_[r]) continue;  // still running (or EINTR: next time)
    out.push_back({static_cast<int>(r), pid, status});
    pids_[r] = -1;
    --running_;
  }
  return out;
}

void LocalRanks::Signal(int sig) {
  for (pid_t pid : pids_) {
    if (pid > 0) kill(pid, sig);
  }
}

void LocalRanks::Signal(int index, int sig) {
  if (pids_[index] > 0) kill(pids_[index], sig);
}

void LocalRanks::Stop(absl::Duration grace, std::vector<Exit>* exits) {
  Signal(SIGTERM);
  Signal(SIGCONT);
  const absl::Time kill_at = absl::Now() + grace;
  bool killed = false;
  while (running_ > 0) {
    std::vector<Exit> seen = Reap();
    if (exits != nullptr) exits->insert(exits->end(), seen.begin(), seen.end());
    if (running_ == 0) break;
    if (!killed && absl::Now() >= kill_at) {
      Signal(SIGKILL);
      killed = true;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

}  // namespace loom::comm::launch
