#include "plan/auto_layout.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/enum_names.h"
#include "plan/builtin_hardware.h"
#include "plan/layout.h"

namespace loom::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

// " (typed)" after a field the user fixed with `flag`.
std::string Mark(const std::set<std::string>& fixed, const char* flag) {
  return fixed.count(flag) ? " (typed)" : "";
}

// "TP 1 x PP 1 x DP 2, micro-batch 4, ZeRO-1": the trainer's own words. A
// typed field is marked and shown even at its default ("no ZeRO-1 (typed)").
std::string Describe(const train::TrainConfig& c, const std::set<std::string>& fixed = {}) {
  auto typed = [&](const char* flag) { return fixed.count(flag) > 0; };
  std::string s = absl::StrCat(
      "TP ", c.tensor_model_parallel_size, Mark(fixed, "tensor_model_parallel_size"), " x PP ",
      c.pipeline_model_parallel_size, Mark(fixed, "pipeline_model_parallel_size"));
  if (c.virtual_pipeline_size > 1 || typed("num_layers_per_virtual_pipeline_stage")) {
    absl::StrAppend(&s, " (VP ", c.virtual_pipeline_size,
                    Mark(fixed, "num_layers_per_virtual_pipeline_stage"), ")");
  }
  if (c.context_parallel_size > 1 || typed("context_parallel_size")) {
    absl::StrAppend(&s, " x CP ", c.context_parallel_size, Mark(fixed, "context_parallel_size"));
  }
  absl::StrAppend(&s, " x DP ", c.data_parallel_size);
  if (c.sequence_parallel) absl::StrAppend(&s, " + SP", Mark(fixed, "sequence_parallel"));
  if (!c.sequence_parallel && typed("sequence_parallel")) absl::StrAppend(&s, ", no SP (typed)");
  if (c.expert_model_parallel_size > 1 || typed("expert_model_parallel_size")) {
    absl::StrAppend(&s, ", EP ", c.expert_model_parallel_size,
                    Mark(fixed, "expert_model_parallel_size"));
  }
  if (typed("pipeline_schedule")) {
    absl::StrAppend(&s, ", schedule ", core::EnumName(c.pipeline_schedule), " (typed)");
  }
  absl::StrAppend(&s, ", micro-batch ", c.micro_batch_size, Mark(fixed, "micro_batch_size"));
  const bool recompute_typed =
      typed("recompute_granularity") || typed("recompute_method") || typed("recompute_num_layers");
  if (c.model.recompute_granularity != layers::RecomputeGranularity::kNone) {
    absl::StrAppend(&s, ", recompute ", core::EnumName(c.model.recompute_granularity),
                    recompute_typed ? " (typed)" : "");
  } else if (recompute_typed) {
    absl::StrAppend(&s, ", no recompute (typed)");
  }
  if (c.optimizer.shard_params) {
    absl::StrAppend(&s, ", ZeRO-3", Mark(fixed, "data_parallel_sharding_strategy"));
  } else if (c.optimizer.shard_gradients) {
    absl::StrAppend(&s, ", ZeRO-2", Mark(fixed, "data_parallel_sharding_strategy"));
  } else if (c.optimizer.distributed) {
    absl::StrAppend(&s, ", ZeRO-1", Mark(fixed, "use_distributed_optimizer"));
  } else if (typed("use_distributed_optimizer")) {
    absl::StrAppend(&s, ", no ZeRO-1 (typed)");
  }
  if (c.num_distributed_optimizer_instances > 1) {
    absl::StrAppend(&s, " in ", c.num_distributed_optimizer_instances, " instances",
                    Mark(fixed, "num_distributed_optimizer_instances"));
  }
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

// Why no layout is valid: the trainer's first refusal, or (when the search
// reached no candidate) Finalize's verdict on the flags as typed.
std::string NoLayoutReason(const train::TrainConfig& config, int world_size,
                           const std::string& first_error) {
  if (!first_error.empty()) return absl::StrCat("the first refusal: ", first_error);
  train::TrainConfig typed = config;
  absl::Status s = train::Finalize(&typed, world_size);
  return s.ok() ? "the search reached no candidate" : std::string(s.message());
}

}  // namespace

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
                                        const Hardware& hw, const std::string& hardware_name,
                                        const std::set<std::string>& fixed) {
  SearchOptions search;  // //train:plan's defaults, so its row 1 is this choice
  search.gpus = world_size;
  search.devices_per_node = hw.devices_per_node();
  search.fixed = fixed;
  // "--auto-layout --tensor-model-parallel-size=3": the constraints as typed.
  const std::string typed =
      absl::StrCat("--auto-layout", fixed.empty() ? "" : " ", FixedFlags(config, fixed));
  int rejected = 0;
  std::string first_error;
  TimeOptions time;
  time.tp_comm_overlap = config.tp_comm_overlap;  // as //train:plan with the same flags
  absl::StatusOr<std::vector<Planned>> plans =
      PlanAll(config, hw, search, time, &rejected, &first_error);
  if (!plans.ok()) {
    return absl::Status(plans.status().code(), absl::StrCat(typed, ": ", plans.status().message()));
  }
  if (plans->empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(typed, ": no layout of this model ", fixed.empty() ? "" : "with these values ",
                     "is valid on ", world_size, " ranks (", rejected, " refused; ",
                     NoLayoutReason(config, world_size, first_error), "); change ",
                     fixed.empty() ? "" : "or drop the typed layout flags, ",
                     "--nproc-per-node / --nnodes or --global-batch-size"));
  }
  const Planned& best = plans->front();
  if (!best.fits) {
    const auto smallest = std::min_element(
        plans->begin(), plans->end(), [](const Planned& a, const Planned& b) {
          return a.memory.bytes.total() < b.memory.bytes.total();
        });
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: none of the %d valid layouts on %d ranks fits in %s per device%s "
        "(%s); the smallest, %s, needs %s per rank; add ranks, shrink the model%s or pass "
        "--hardware=FILE describing a larger device",
        typed, static_cast<int>(plans->size()), world_size, Bytes(hw.device_memory_bytes()),
        hw.ranks_share_compute() ? ", shared by the node's ranks" : "", hardware_name,
        Describe(smallest->config, fixed), Bytes(smallest->memory.bytes.total()),
        fixed.empty() ? "" : ", drop the typed layout flags"));
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
  if (!fixed.count("pipeline_schedule")) t.pipeline_schedule = pipeline::ScheduleKind::k1F1B;
  t.context_parallel_size = c.context_parallel_size;
  t.expert_model_parallel_size = c.expert_model_parallel_size;
  t.sequence_parallel = c.sequence_parallel;
  t.micro_batch_size = c.micro_batch_size;
  t.model.recompute_granularity = c.model.recompute_granularity;
  t.model.recompute_method = c.model.recompute_method;
  t.model.recompute_num_layers = c.model.recompute_num_layers;
  t.optimizer.distributed = c.optimizer.distributed;
  t.optimizer.shard_gradients = c.optimizer.shard_gradients;
  t.optimizer.shard_params = c.optimizer.shard_params;
  t.num_distributed_optimizer_instances = c.num_distributed_optimizer_instances;
  if (!t.optimizer.distributed) t.overlap_param_gather = false;

  out.flags = {
      absl::StrCat("--tensor_model_parallel_size=", t.tensor_model_parallel_size),
      absl::StrCat("--pipeline_model_parallel_size=", t.pipeline_model_parallel_size),
      absl::StrCat("--num_layers_per_virtual_pipeline_stage=",
                   t.num_layers_per_virtual_pipeline_stage),
      absl::StrCat("--pipeline_schedule=", core::EnumName(t.pipeline_schedule)),
      absl::StrCat("--context_parallel_size=", t.context_parallel_size),
      absl::StrCat("--expert_model_parallel_size=", t.expert_model_parallel_size),
      absl::StrCat("--sequence_parallel=", Bool(t.sequence_parallel)),
      absl::StrCat("--micro_batch_size=", t.micro_batch_size),
      absl::StrCat("--recompute_granularity=", core::EnumName(t.model.recompute_granularity)),
      absl::StrCat("--recompute_method=", core::EnumName(t.model.recompute_method)),
      absl::StrCat("--recompute_num_layers=", t.model.recompute_num_layers),
      absl::StrCat("--use_distributed_optimizer=", Bool(t.optimizer.distributed)),
      absl::StrCat("--data_parallel_sharding_strategy=",
                   t.optimizer.shard_params      ? "optim_grads_params"
                   : t.optimizer.shard_gradients ? "optim_grads"
                   : t.optimizer.distributed   ? "optim"
                                               : "no_shard"),
      absl::StrCat("--num_distributed_optimizer_instances=",
                   t.num_distributed_optimizer_instances),
      absl::StrCat("--overlap_param_gather=", Bool(t.overlap_param_gather)),
  };

  out.log_line = absl::StrCat("loom: --auto-layout chose ", Describe(c, fixed), " (predicted ",
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
