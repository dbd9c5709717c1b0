#ifndef LOOM_COMM_LAUNCH_HEARTBEAT_H_
#define LOOM_COMM_LAUNCH_HEARTBEAT_H_

// Progress reports from a rank to the agent that started it (launcher.h), so
// that a rank which stops making progress (SIGSTOP, a deadlock, a stuck file
// system) is found and named even before a collective times out.
//
// The agent creates one page of anonymous shared memory per local rank
// (memfd: nothing on disk, nothing left behind whatever kills the agent), which
// the rank inherits as a file descriptor named by LOOM_HEARTBEAT_FD; the rank
// maps it and a beat is a clock read (vDSO) and
// four relaxed stores to shared memory: no system call, no lock, nothing when
// no agent is watching.
// The agent reads the page every few tens of milliseconds; a rank past setup
// whose beat counter has not moved for --heartbeat-timeout-s is hung (setup,
// e.g. rank 0 tokenizing a corpus while the others wait, is bounded by its own
// barriers and the collective timeout instead).

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace loom::comm::launch {

// What the rank is doing (shown when it is declared hung).
enum class Phase : uint32_t {
  kStarting = 0,  // before the first beat (set by the agent)
  kSetup,         // groups, model, data, checkpoint load
  kTrain,         // a training step
  kEval,          // evaluation
  kSave,          // writing a checkpoint
  kExiting,       // done, shutting down
};
const char* PhaseName(Phase phase);

// Rank side: records progress in this process's heartbeat page, if an agent
// gave it one (otherwise nothing). Thread-safe; any rank thread may beat.
void Beat(int64_t iteration, Phase phase);

// Agent side: one rank's page.
struct HeartbeatReading {
  uint64_t beats = 0;  // increases with every Beat
  int64_t iteration = 0;
  Phase phase = Phase::kStarting;
  int64_t at_unix_ns = 0;  // when the last beat was taken (0: none yet)
};

class HeartbeatPage {
 public:
  // A new page, mapped here; fd() is inherited by the processes this one starts.
  static absl::StatusOr<std::unique_ptr<HeartbeatPage>> Create();
  ~HeartbeatPage();
  HeartbeatReading Read() const;
  // Back to "no beat yet" (before the rank is started again).
  void Reset();
  int fd() const { return fd_; }

 private:
  HeartbeatPage() = default;
  int fd_ = -1;
  void* page_ = nullptr;
};

}  // namespace loom::comm::launch

#endif  // LOOM_COMM_LAUNCH_HEARTBEAT_H_
