#include "plan/auto_layout.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "plan/builtin_hardware.h"
#include "plan/layout.h"

namespace loom::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

// "TP 1 x PP 1 x DP 2, micro-batch 4, ZeRO-1": the trainer's own words.
std::string Describe(const train::TrainConfig& c) {
  std::string s = absl::StrCat("TP ", c.tensor_model_parallel_size, " x PP ",
                               c.pipeline_model_parallel_size);
  if (c.virtual_pipeline_size > 1) absl::StrAppend(&s, " (VP ", c.virtual_pipeline_size, ")");
  if (c.context_parallel_size > 1) absl::StrAppend(&s, " x CP ", c.context_parallel_size);
  absl::StrAppend(&s, " x DP ", c.data_parallel_size);
  if (c.sequence_parallel) absl::StrAppend(&s, " + SP");
  if (c.expert_model_parallel_size > 1) {
    absl::StrAppend(&s, ", EP ", c.expert_model_parallel_size);
  }
  absl::StrAppend(&s, ", micro-batch ", c.micro_batch_size);
  if (!c.model.recompute_granularity.empty()) {
    absl::StrAppend(&s, ", recompute ", c.model.recompute_granularity);
  }
  if (c.optimizer.distributed) absl::StrAppend(&s, ", ZeRO-1");
  return s;
}

std::string Bytes(double b) {
  if (b >= kGiB) return absl::StrFormat("%.3g GiB", b / kGiB);
  if (b >= 1024 * 1024) return absl::StrFormat("%.3g MiB", b / (1024 * 1024));
  return absl::StrFormat("%.3g KiB", b / 1024);
}

std::string Predicted(const Planned& p) {
  return absl::StrFormat("%.3g s/step, %s/rank peak", p.time.step, Bytes(p.memory.bytes.total()));
}

const char* Bool(bool b) { return b ? "true" : "false"; }

}  // namespace

const std::vector<std::string>& AutoLayoutFlagNames() {
  static const auto* names = new std::vector<std::string>{
      "tensor_model_parallel_size",
      "pipeline_model_parallel_size",
      "num_layers_per_virtual_pipeline_stage",
      "pipeline_schedule",
      "context_parallel_size",
      "expert_model_parallel_size",
      "sequence_parallel",
      "micro_batch_size",
      "recompute_granularity",
      "recompute_method",
      "recompute_num_layers",
      "use_distributed_optimizer",
  };
  return *names;
}

absl::Status CheckNoLayoutFlags(const std::set<std::string>& typed) {
  std::vector<std::string> given;
  for (const std::string& name : AutoLayoutFlagNames()) {
    if (typed.count(name) || typed.count(absl::StrCat("no", name))) {
      given.push_back(absl::StrCat("--", absl::StrReplaceAll(name, {{"_", "-"}})));
    }
  }
  if (given.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--auto-layout with ", absl::StrJoin(given, ", "),
      ": choose one (--auto-layout sets the layout flags itself; drop it, or drop ",
      given.size() == 1 ? "that flag" : "those flags",
      "; `bazel run //train:plan` lists the layouts it chooses from)"));
}

absl::StatusOr<Hardware> AutoLayoutHardware(const std::string& path, const std::string& device,
                                            std::string* what) {
  if (!path.empty()) {
    *what = path;
    return LoadHardware(path);  // its errors name --hardware=path and the field
  }
  if (device == "cuda") {
    *what = "built-in plan/testdata/h100_dgx.textproto";
    return ParseHardware(kBuiltinH100Hardware, *what);
  }
  *what = "built-in plan/testdata/cpu.textproto";
  return ParseHardware(kBuiltinCpuHardware, *what);
}

absl::StatusOr<AutoLayout> ChooseLayout(const train::TrainConfig& config, int world_size,
                                        const Hardware& hw, const std::string& hardware_name) {
  SearchOptions search;  // //train:plan's defaults, so its row 1 is this choice
  search.gpus = world_size;
  search.devices_per_node = hw.devices_per_node();
  int rejected = 0;
  std::string first_error;
  absl::StatusOr<std::vector<Planned>> plans =
      PlanAll(config, hw, search, TimeOptions{}, &rejected, &first_error);
  if (!plans.ok()) return plans.status();
  if (plans->empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--auto-layout: no layout of this model is valid on ", world_size, " ranks (",
        rejected, " refused; the first: ", first_error,
        "); change --nproc-per-node / --nnodes or --global-batch-size"));
  }
  const Planned& best = plans->front();
  if (!best.fits) {
    const auto smallest = std::min_element(
        plans->begin(), plans->end(), [](const Planned& a, const Planned& b) {
          return a.memory.bytes.total() < b.memory.bytes.total();
        });
    return absl::FailedPreconditionError(absl::StrFormat(
        "--auto-layout: none of the %d valid layouts on %d ranks fits in %s per device%s "
        "(%s); the smallest, %s, needs %s per rank; add ranks, shrink the model or pass "
        "--hardware=FILE describing a larger device",
        static_cast<int>(plans->size()), world_size, Bytes(hw.device_memory_bytes()),
        hw.ranks_share_compute() ? ", shared by the node's ranks" : "", hardware_name,
        Describe(smallest->config), Bytes(smallest->memory.bytes.total())));
  }

  AutoLayout out;
  out.best = best;
  out.candidates = static_cast<int>(plans->size());
  if (plans->size() > 1 && (*plans)[1].fits) out.runners_up.push_back((*plans)[1]);

  // The chosen fields, as the enumeration set them (not Finalize's rewrites).
  const train::TrainConfig& c = best.config;
  train::TrainConfig& t = out.config;
  t = config;
  t.tensor_model_parallel_size = c.tensor_model_parallel_size;
  t.pipeline_model_parallel_size = c.pipeline_model_parallel_size;
  t.num_layers_per_virtual_pipeline_stage = c.num_layers_per_virtual_pipeline_stage;
  t.pipeline_schedule = "1f1b";
  t.context_parallel_size = c.context_parallel_size;
  t.expert_model_parallel_size = c.expert_model_parallel_size;
  t.sequence_parallel = c.sequence_parallel;
  t.micro_batch_size = c.micro_batch_size;
  t.model.recompute_granularity = c.model.recompute_granularity;
  t.model.recompute_method = c.model.recompute_method;
  t.model.recompute_num_layers = c.model.recompute_num_layers;
  t.optimizer.distributed = c.optimizer.distributed;
  if (!t.optimizer.distributed) t.overlap_param_gather = false;

  out.flags = {
      absl::StrCat("--tensor_model_parallel_size=", t.tensor_model_parallel_size),
      absl::StrCat("--pipeline_model_parallel_size=", t.pipeline_model_parallel_size),
      absl::StrCat("--num_layers_per_virtual_pipeline_stage=",
                   t.num_layers_per_virtual_pipeline_stage),
      absl::StrCat("--pipeline_schedule=", t.pipeline_schedule),
      absl::StrCat("--context_parallel_size=", t.context_parallel_size),
      absl::StrCat("--expert_model_parallel_size=", t.expert_model_parallel_size),
      absl::StrCat("--sequence_parallel=", Bool(t.sequence_parallel)),
      absl::StrCat("--micro_batch_size=", t.micro_batch_size),
      absl::StrCat("--recompute_granularity=", t.model.recompute_granularity),
      absl::StrCat("--recompute_method=", t.model.recompute_method),
      absl::StrCat("--recompute_num_layers=", t.model.recompute_num_layers),
      absl::StrCat("--use_distributed_optimizer=", Bool(t.optimizer.distributed)),
      absl::StrCat("--overlap_param_gather=", Bool(t.overlap_param_gather)),
  };

  out.log_line = absl::StrCat("loom: --auto-layout chose ", Describe(c), " (predicted ",
                              Predicted(best), " on ", hw.name(), "; ");
  if (out.runners_up.empty()) {
    absl::StrAppend(&out.log_line, "no other layout fits");
  } else {
    absl::StrAppend(&out.log_line, "second best: ", Describe(out.runners_up[0].config), ", ",
                    Predicted(out.runners_up[0]));
  }
  absl::StrAppend(&out.log_line, "; ", out.candidates, " layouts planned, hardware ",
                  hardware_name, ")");
  return out;
}

}  // namespace loom::plan
