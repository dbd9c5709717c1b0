#ifndef LOOM_PLAN_AUTO_LAYOUT_H_
#define LOOM_PLAN_AUTO_LAYOUT_H_

// //train:gpt --auto-layout: the planner's fastest layout that fits, for the
// world the launch plan gives, put into the TrainConfig the flags gave.
//
// The choice is a pure function of (config, world size, hardware text): the
// enumeration is deterministic and ties keep the report's order (PlanAll's
// stable sort), so every rank that recomputes it gets the same layout. It is
// row 1 of `//train:plan` run with the same flags (layout flags included:
// both take them as constraints), --gpus and --hardware.

#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/config.h"
#include "plan/hardware.h"
#include "plan/layout.h"
#include "plan/report.h"

namespace loom::plan {

// The hardware --auto-layout plans for: the file `path` when not empty (its
// errors name it), else the built-in description of `device` ("cpu":
// plan/testdata/cpu.textproto, "cuda": plan/testdata/h100_dgx.textproto).
// `what` receives the name shown in the log line.
absl::StatusOr<Hardware> AutoLayoutHardware(const std::string& path, const std::string& device,
                                            std::string* what);

struct AutoLayout {
  train::TrainConfig config;  // the input with the chosen layout, not Finalize()d
  Planned best;
  std::vector<Planned> runners_up;  // at most 1: the second best that fits
  int candidates = 0;               // valid layouts planned
  std::string log_line;             // "loom: --auto-layout chose TP 1 x PP 1 x DP 2, ..."
  std::vector<std::string> flags;   // //train:gpt flags that select the layout
};

// Plans every layout of `config`'s model on `world_size` ranks of `hw` and
// takes the fastest that fits. `fixed` (TypedLayoutFlags of the command line)
// are constraints: only layouts with `config`'s values of those flags. The
// log line marks them "(typed)". FailedPrecondition (with the typed flags, and
// the trainer's first refusal or the smallest predicted peak) when none is
// valid or none fits.
absl::StatusOr<AutoLayout> ChooseLayout(const train::TrainConfig& config, int world_size,
                                        const Hardware& hw, const std::string& hardware_name,
                                        const std::set<std::string>& fixed = {});

}  // namespace loom::plan

#endif  // LOOM_PLAN_AUTO_LAYOUT_H_
