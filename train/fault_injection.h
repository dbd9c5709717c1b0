#ifndef LOOM_TRAIN_FAULT_INJECTION_H_
#define LOOM_TRAIN_FAULT_INJECTION_H_

// Test only: fires the faults LOOM_FAULT names (syntax and parsing:
// config/fault_spec.h) in this rank, at the step or the save they name.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "comm/comm.h"
#include "config/fault_spec.h"

namespace loom::train {

// One rank's faults for this start of the job.
class FaultInjector {
 public:
  FaultInjector() = default;
  // The faults of `spec` for `global_rank` in the start `restart_count`.
  static absl::StatusOr<FaultInjector> Create(absl::string_view spec, int global_rank,
                                              int restart_count);

  bool empty() const { return faults_.empty(); }

  // Called as the step that makes iteration `iteration` starts. exit,
  // sigkill and hang do not return; collective returns the barrier's error
  // (after the collective timeout); otherwise OK.
  absl::Status AtStep(int64_t iteration, comm::Communicator* world) {
    return faults_.empty() ? absl::OkStatus() : FireAtStep(iteration, world);
  }
  // Called inside the forward-backward of the step that makes iteration
  // `iteration`: a kind=slow fault at or before it sleeps its ms here.
  void InCompute(int64_t iteration) {
    if (!faults_.empty()) SlowDown(iteration);
  }
  // Called before the checkpoint save at `iteration`: a kind=save fault
  // there arms the shard writer's hook (checkpoint/writer.h) to SIGKILL this
  // process when this rank's shard file is half written.
  void BeforeSave(int64_t iteration) {
    if (!faults_.empty()) ArmSave(iteration);
  }

 private:
  absl::Status FireAtStep(int64_t iteration, comm::Communicator* world);
  void ArmSave(int64_t iteration);
  void SlowDown(int64_t iteration);

  std::vector<Fault> faults_;  // this rank's, this start's
  std::vector<bool> slow_announced_;  // by faults_ index: kind=slow prints its line once
};

}  // namespace loom::train

#endif  // LOOM_TRAIN_FAULT_INJECTION_H_
