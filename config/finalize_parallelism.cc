#include <cstdint>

#include "absl/strings/str_cat.h"
#include "config/finalize.h"
#include "core/status_macros.h"

namespace loom::train::finalize {
namespace {

using pipeline::ScheduleKind;

// --num-layers-per-virtual-pipeline-stage: the chunks per stage, and the
// schedule it implies.
absl::Status VirtualStages(TrainConfig* c) {
  const int pp = c->pipeline_model_parallel_size;
  const int64_t layers = c->model.num_layers;
  c->virtual_pipeline_size = 1;
  if (pipeline::IsVShape(c->pipeline_schedule)) {
    // The V always holds two chunks per stage (virtual stages r and 2P-1-r), as torch's
    // ZBV and DualPipeV schedules infer; a typed chunk size must agree.
    const char* name = pipeline::ScheduleKindName(c->pipeline_schedule);
    if (layers % (2 * pp) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--pipeline-schedule=", name, " places two chunks per stage in a V: --num-layers (",
          layers, ") must be divisible by 2 x --pipeline-model-parallel-size (", 2 * pp, ")"));
    }
    const int64_t per = c->num_layers_per_virtual_pipeline_stage;
    if (per > 0 && per * 2 * pp != layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--pipeline-schedule=", name, " places two chunks per stage in a V, of --num-layers / "
          "(2 x --pipeline-model-parallel-size) = ", layers / (2 * pp),
          " layers each; --num-layers-per-virtual-pipeline-stage=", per,
          " disagrees (drop it)"));
    }
    if (c->device != DeviceKind::kCpu) {
      return absl::UnimplementedError(absl::StrCat(
          "--pipeline-schedule=", name, " has not run on --device=", core::EnumName(c->device),
          " yet (its buffered point-to-point links are untested on NCCL): use "
          "--pipeline-schedule=zb-h1 or 1f1b there"));
    }
    c->virtual_pipeline_size = 2;
    return absl::OkStatus();
  }
  if (c->num_layers_per_virtual_pipeline_stage > 0) {
    const int64_t per = c->num_layers_per_virtual_pipeline_stage;
    if (pp == 1) {
      return absl::InvalidArgumentError(
          "--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size > 1 "
          "(interleaving splits each stage's layers into chunks)");
    }
    if (layers % (pp * per) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--num-layers (", layers, ") is not divisible by --pipeline-model-parallel-size (", pp,
          ") x --num-layers-per-virtual-pipeline-stage (", per, ") = ", pp * per));
    }
    c->virtual_pipeline_size = static_cast<int>(layers / (pp * per));
    if (c->pipeline_schedule == ScheduleKind::k1F1B && c->virtual_pipeline_size > 1) {
      // Megatron: interleaving implies the schedule.
      c->pipeline_schedule = ScheduleKind::kInterleaved;
    }
    if (c->pipeline_schedule == ScheduleKind::kGPipe && c->virtual_pipeline_size > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--pipeline-schedule=gpipe runs one chunk per stage; --num-layers-per-virtual-"
          "pipeline-stage=",
          per, " gives ", c->virtual_pipeline_size,
          " chunks per stage (drop it, or use --pipeline-schedule=interleaved)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Parallelism(TrainConfig* c, int world_size) {
  const int tp = c->tensor_model_parallel_size, pp = c->pipeline_model_parallel_size;
  const int cp = c->context_parallel_size;
  if (tp < 1 || pp < 1 || cp < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tensor-model-parallel-size (", tp, "), --pipeline-model-parallel-size (", pp,
        ") and --context-parallel-size (", cp, ") must be >= 1"));
  }
  if (world_size % (tp * pp * cp) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "world size (", world_size, " ranks) is not divisible by --tensor-model-parallel-size (",
        tp, ") x --pipeline-model-parallel-size (", pp, ")",
        cp > 1 ? absl::StrCat(" x --context-parallel-size (", cp, ")") : "", " = ", tp * pp * cp,
        " (the world: --nproc-per-node, or the launcher's WORLD_SIZE)"));
  }
  if (cp > 1 && c->device != DeviceKind::kCpu) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--context-parallel-size=", cp, " runs on --device=cpu only (the ring attention uses the "
        "CPU flash blocks; a device ring is not built yet)"));
  }
  c->world_size = world_size;
  c->data_parallel_size = world_size / (tp * pp * cp);
  return absl::OkStatus();
}

absl::Status Batch(TrainConfig* c) {
  const int tp = c->tensor_model_parallel_size, pp = c->pipeline_model_parallel_size;
  const int cp = c->context_parallel_size;
  const int dp = c->data_parallel_size, world_size = c->world_size;
  if (c->micro_batch_size < 1 || c->global_batch_size < 1) {
    return absl::InvalidArgumentError("--micro-batch-size and --global-batch-size must be >= 1");
  }
  if (c->global_batch_size % (c->micro_batch_size * dp) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--global-batch-size (", c->global_batch_size, ") is not divisible by --micro-batch-size (",
        c->micro_batch_size, ") x data-parallel size (", dp, ") = ", c->micro_batch_size * dp,
        " (data-parallel size = world ", world_size, " / (TP ", tp, " x PP ", pp,
        cp > 1 ? absl::StrCat(" x CP ", cp) : "", "))"));
  }
  c->num_micro_batches = c->global_batch_size / (c->micro_batch_size * dp);
  return absl::OkStatus();
}

absl::Status PipelineSchedule(TrainConfig* c) {
  const int pp = c->pipeline_model_parallel_size;
  LOOM_RETURN_IF_ERROR(VirtualStages(c));
  if (c->pipeline_schedule == ScheduleKind::kZBH1 && c->virtual_pipeline_size > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pipeline-schedule=zb-h1 runs one chunk per stage; --num-layers-per-virtual-pipeline-"
        "stage=",
        c->num_layers_per_virtual_pipeline_stage, " gives ", c->virtual_pipeline_size,
        " chunks per stage (drop it, or use --pipeline-schedule=interleaved)"));
  }
  if (c->pipeline_schedule == ScheduleKind::kInterleaved && c->virtual_pipeline_size < 2) {
    return absl::InvalidArgumentError(
        "--pipeline-schedule=interleaved needs --num-layers-per-virtual-pipeline-stage giving "
        "at least 2 chunks per stage");
  }
  if (c->pipeline_schedule == ScheduleKind::kDualPipeV && c->num_micro_batches < 2 * pp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pipeline-schedule=dualpipev needs at least 2 x --pipeline-model-parallel-size = ",
        2 * pp, " micro-batches per step; --global-batch-size / (--micro-batch-size x DP) gives ",
        c->num_micro_batches));
  }
  if (c->pipeline_schedule == ScheduleKind::kInterleaved && c->num_micro_batches % pp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pipeline-schedule=interleaved: micro-batches per step (", c->num_micro_batches,
        " = --global-batch-size / (--micro-batch-size x DP)) must be a multiple of "
        "--pipeline-model-parallel-size (",
        pp, ")"));
  }
  return absl::OkStatus();
}

absl::Status Layout(TrainConfig* c) {
  const int tp = c->tensor_model_parallel_size, pp = c->pipeline_model_parallel_size;
  const int cp = c->context_parallel_size;
  const int dp = c->data_parallel_size;
  if (const int ep = c->expert_model_parallel_size; ep != 1) {
    if (ep > 1 && !c->model.moe()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--expert-model-parallel-size=", ep, " needs MoE layers (--num-experts > 0)"));
    }
    if (ep < 1 || c->model.num_experts % ep != 0 || dp % ep != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--expert-model-parallel-size (", ep, ") must divide --num-experts (",
          c->model.num_experts, ") and the data-parallel size (", dp,
          "): EP ranks are carved out of DP"));
    }
  }
  if (c->sequence_parallel && tp == 1) c->sequence_parallel = false;  // nothing to split
  if (c->tp_comm_overlap && tp > 1 && !c->sequence_parallel) {
    return absl::InvalidArgumentError(
        "--tp-comm-overlap needs --sequence-parallel: tensor-parallel communication/GEMM "
        "overlap can happen only when sequence parallelism is enabled (as in Megatron)");
  }
  if (tp == 1) c->tp_comm_overlap = false;  // no TP communication to hide
  if (c->model.moe_a2a_overlap_chunks > 1 && c->expert_model_parallel_size < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--moe-a2a-overlap-chunks=", c->model.moe_a2a_overlap_chunks,
        " pipelines the expert-parallel all-to-alls and needs --expert-model-parallel-size > 1 "
        "(got ", c->expert_model_parallel_size, "): drop it or set EP"));
  }
  // Also --seq-length against TP (SP) and CP, and the --recompute-* flags
  // (Megatron's rules), N against the layers of one chunk: --num-layers /
  // (PP x virtual stages).
  absl::Status layout = layers::ValidateLayout(c->model, tp, c->sequence_parallel, pp,
                                               c->virtual_pipeline_size, cp);
  if (!layout.ok()) return layout;
  return absl::OkStatus();
}

}  // namespace loom::train::finalize
