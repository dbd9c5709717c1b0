#ifndef LOOM_COMM_LAUNCH_LOCAL_RANKS_H_
#define LOOM_COMM_LAUNCH_LOCAL_RANKS_H_

// The processes one agent runs on its node: started together (this binary,
// re-executed with one environment each), watched without blocking, stopped
// together (SIGTERM, then SIGKILL after a grace period). Children die with the
// agent (PR_SET_PDEATHSIG): no orphans, whatever kills the agent.

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace loom::comm::launch {

class LocalRanks {
 public:
  struct Exit {
    int index = 0;  // into the envs given to Start
    pid_t pid = 0;
    int status = 0;  // as waitpid reports it
    bool ok() const;
    std::string Describe() const;  // "exited with status 3", "was killed by signal 9 (Killed)"
  };

  LocalRanks() = default;
  LocalRanks(const LocalRanks&) = delete;
  LocalRanks& operator=(const LocalRanks&) = delete;
  ~LocalRanks();  // kills (SIGKILL) and reaps whatever still runs

  // Starts argv once per entry of `envs` (each a full environment,
  // "NAME=value"). On a failed fork the ones started are killed again.
  absl::Status Start(const std::vector<std::vector<std::string>>& envs,
                     const std::vector<std::string>& argv);

  // Reaps the children that ended since the last call (never blocks).
  std::vector<Exit> Reap();
  int running() const { return running_; }
  int size() const { return static_cast<int>(pids_.size()); }
  pid_t pid(int index) const { return pids_[index]; }  // -1 once reaped

  // `sig` to every running child, or to child `index` (if it runs).
  void Signal(int sig);
  void Signal(int index, int sig);
  // SIGTERM (and SIGCONT, so a stopped child can act on it), then SIGKILL to
  // whatever still runs after `grace`; returns once every child is reaped.
  // The exits seen meanwhile are appended to `exits` when given.
  void Stop(absl::Duration grace, std::vector<Exit>* exits = nullptr);

 private:
  std::vector<pid_t> pids_;
  int running_ = 0;
};

}  // namespace loom::comm::launch

#endif  // LOOM_COMM_LAUNCH_LOCAL_RANKS_H_
