#include "config/config.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/backend_registry.h"
#include "config/fault_spec.h"
#include "core/cpu/cpu_features.h"
#include "core/ops/kernel_choice.h"
#include "core/status_macros.h"

namespace loom::train {

std::string BackendOf(const TrainConfig& c) {
  if (!c.distributed_backend.empty()) return c.distributed_backend;
  return c.device == "cuda" ? "nccl" : "ucx";
}

absl::Status Finalize(TrainConfig* c, int world_size) {
  // LOOM_KERNEL_IMPL / LOOM_REFERENCE_KERNELS against the kernel manifest.
  LOOM_RETURN_IF_ERROR(core::ops::CheckKernelOverrides());
  const std::string backend = BackendOf(*c);
  // Any backend Loom knows (the registry's, built here or not: //plan sizes
  // NCCL jobs on CPU-only machines); whether it was built is CheckCommFlags'.
  absl::StatusOr<const comm::BackendInfo*> info =
      comm::LookupBackend(backend, c->distributed_backend_flag);
  if (!info.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(c->distributed_backend_flag, "=", backend,
                                                   ": expected one of ",
                                                   absl::StrJoin(comm::KnownBackends(), ", ")));
  }
  c->distributed_backend = backend;
  if (!(c->distributed_timeout_s > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--distributed-timeout-minutes (or --comm-timeout-s) must be > 0 (got ",
        c->distributed_timeout_s, " s)"));
  }
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world size (", world_size, ") must be >= 1"));
  }
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
  if (cp > 1 && c->device != "cpu") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--context-parallel-size=", cp, " runs on --device=cpu only (the ring attention uses the "
        "CPU flash blocks; a device ring is not built yet)"));
  }
  if (c->device != "cpu" && c->device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device=", c->device, ": expected cpu or cuda"));
  }
  if ((*info)->device == comm::BackendDevice::kCuda && c->device != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat(
        c->distributed_backend_flag, "=", backend, " needs --device=cuda (it moves GPU memory; "
        "with --device=", c->device, " use ",
        absl::StrJoin(comm::BackendsOn(comm::BackendDevice::kHost), ", "), ")"));
  }
  if (c->bf16 && c->device == "cpu") {
    // The CPU's --bf16 runs the GEMMs on AVX512_BF16 or AMX-BF16 (checked
    // here, before any work starts, by cpuid).
    const absl::Status bf16 = core::cpu::CheckBf16GemmSupport("--bf16 on --device=cpu");
    if (!bf16.ok()) return bf16;
  }
  c->model.device = c->device == "cuda" ? core::Device::CUDA(0) : core::Device::CPU();
  c->model.compute_dtype = c->bf16 ? core::DType::kBF16 : core::DType::kF32;
  c->world_size = world_size;
  c->data_parallel_size = world_size / (tp * pp * cp);
  const int dp = c->data_parallel_size;

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

  if (c->pipeline_schedule != "gpipe" && c->pipeline_schedule != "1f1b" &&
      c->pipeline_schedule != "interleaved") {
    return absl::InvalidArgumentError(absl::StrCat("--pipeline-schedule=", c->pipeline_schedule,
                                                   ": expected gpipe, 1f1b or interleaved"));
  }
  const int64_t layers = c->model.num_layers;
  c->virtual_pipeline_size = 1;
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
    if (c->pipeline_schedule == "1f1b" && c->virtual_pipeline_size > 1) {
      c->pipeline_schedule = "interleaved";  // Megatron: interleaving implies the schedule
    }
    if (c->pipeline_schedule == "gpipe" && c->virtual_pipeline_size > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--pipeline-schedule=gpipe runs one chunk per stage; --num-layers-per-virtual-"
          "pipeline-stage=",
          per, " gives ", c->virtual_pipeline_size,
          " chunks per stage (drop it, or use --pipeline-schedule=interleaved)"));
    }
  }
  if (c->pipeline_schedule == "interleaved" && c->virtual_pipeline_size < 2) {
    return absl::InvalidArgumentError(
        "--pipeline-schedule=interleaved needs --num-layers-per-virtual-pipeline-stage giving "
        "at least 2 chunks per stage");
  }
  if (c->pipeline_schedule == "interleaved" && c->num_micro_batches % pp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pipeline-schedule=interleaved: micro-batches per step (", c->num_micro_batches,
        " = --global-batch-size / (--micro-batch-size x DP)) must be a multiple of "
        "--pipeline-model-parallel-size (",
        pp, ")"));
  }
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
  // Also --seq-length against TP (SP) and CP, and the --recompute-* flags
  // (Megatron's rules), N against the layers of one chunk: --num-layers /
  // (PP x virtual stages).
  absl::Status layout = layers::ValidateLayout(c->model, tp, c->sequence_parallel, pp,
                                               c->virtual_pipeline_size, cp);
  if (!layout.ok()) return layout;

  // --skip-train takes no step: --train-iters=0 is then what it says (Megatron's spelling).
  if (c->train_iters < (c->skip_train ? 0 : 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--train-iters (", c->train_iters, ") must be >= 1",
                     c->skip_train ? "" : " (0 only with --skip-train)"));
  }
  if (c->lr.decay_iters == 0) c->lr.decay_iters = c->train_iters;
  if (c->lr.warmup_iters < 0) c->lr.warmup_iters = std::min<int64_t>(20, c->train_iters / 10);
  absl::Status lr = c->lr.Validate();
  if (!lr.ok()) return lr;
  if (c->hidden_dropout < 0 || c->hidden_dropout >= 1 || c->attention_dropout < 0 ||
      c->attention_dropout >= 1) {
    return absl::InvalidArgumentError(absl::StrCat("--hidden-dropout (", c->hidden_dropout,
                                                   ") and --attention-dropout (",
                                                   c->attention_dropout, ") must lie in [0, 1)"));
  }
  if (c->optimizer.clip_grad < 0 || c->optimizer.weight_decay < 0 || c->optimizer.eps <= 0 ||
      c->optimizer.beta1 < 0 || c->optimizer.beta1 >= 1 || c->optimizer.beta2 < 0 ||
      c->optimizer.beta2 >= 1) {
    return absl::InvalidArgumentError(
        "--clip-grad and --weight-decay must be >= 0, --adam-eps > 0, --adam-beta1/2 in [0, 1)");
  }
  if (c->log_interval < 1 || c->eval_interval < 0 || c->eval_iters < 0 || c->save_interval < 0) {
    return absl::InvalidArgumentError(
        "--log-interval must be >= 1; --eval-interval, --eval-iters, --save-interval >= 0");
  }
  if (c->tensorboard_log_interval < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--tensorboard-log-interval (",
                                                   c->tensorboard_log_interval, ") must be >= 1"));
  }
  if (c->tensorboard_dir.empty() &&
      (c->log_memory_to_tensorboard || c->log_validation_ppl_to_tensorboard)) {
    return absl::InvalidArgumentError(absl::StrCat(
        c->log_memory_to_tensorboard ? "--log-memory-to-tensorboard"
                                     : "--log-validation-ppl-to-tensorboard",
        " needs --tensorboard-dir=<directory>"));
  }
  if (c->timing_log_level < 0 || c->timing_log_level > 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--timing-log-level=", c->timing_log_level,
        ": expected 0 (save-checkpoint), 1 (+ forward-backward, optimizer, gradient "
        "reduction, params-all-gather) or 2 (+ per micro-batch compute, p2p, batch-generator)"));
  }
  if (c->log_timers_to_tensorboard && c->tensorboard_dir.empty()) {
    return absl::InvalidArgumentError(
        "--log-timers-to-tensorboard needs --tensorboard-dir=<directory>");
  }
  if (c->profile) {
    if (c->profile_dir.empty()) {
      return absl::InvalidArgumentError(
          "--profile needs --profile-dir=<directory>: each rank writes rank-R.json there and "
          "rank 0 the merged trace.json");
    }
    if (c->profile_step_start < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--profile-step-start=", c->profile_step_start,
          ": must be >= 0 (iterations completed when profiling starts)"));
    }
    if (c->profile_step_end <= c->profile_step_start) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--profile-step-end (", c->profile_step_end, ") must be > --profile-step-start (",
          c->profile_step_start, "): the steps profiled are [start, end)"));
    }
    if (c->profile_step_start >= c->train_iters) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--profile-step-start (", c->profile_step_start, ") must be < --train-iters (",
          c->train_iters, "): the window would never open"));
    }
  }
  if (c->optimizer.bucket_bytes < 4) {
    return absl::InvalidArgumentError(absl::StrCat("--ddp-bucket-size (", c->optimizer.bucket_bytes / 4,
                                                   ") must be >= 1 parameter"));
  }
  if (c->overlap_param_gather && !c->optimizer.distributed) {
    return absl::InvalidArgumentError(
        "--overlap-param-gather needs --use-distributed-optimizer (without it every rank updates "
        "all parameters and nothing is gathered)");
  }
  if (c->save_interval > 0 && c->save.empty()) {
    return absl::InvalidArgumentError("--save-interval needs --save=<directory>");
  }
  if (c->checkpoint.finetune && c->load.empty()) {
    return absl::InvalidArgumentError("--finetune needs --load=<checkpoint directory>");
  }
  if (c->exit_signal_handler && c->save.empty()) {
    return absl::InvalidArgumentError(
        "--exit-signal-handler needs --save=<directory>: on SIGTERM the run saves a checkpoint "
        "there, then exits 0");
  }
  if (c->exit_interval.has_value() && *c->exit_interval < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--exit-interval (", *c->exit_interval,
        ") must be >= 1: the run saves and exits when the iteration is a multiple of it "
        "(leave the flag out to run all --train-iters)"));
  }
  if (c->exit_duration_in_mins.has_value() && !(*c->exit_duration_in_mins > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--exit-duration-in-mins (", *c->exit_duration_in_mins,
        ") must be > 0: the run saves and exits once it has taken that many minutes "
        "(leave the flag out for no limit)"));
  }
  if (c->straggler_minmax_count < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--straggler-minmax-count (", c->straggler_minmax_count,
        ") must be >= 1: how many of the slowest and of the fastest ranks --log-straggler names"));
  }
  if (c->straggler_minmax_count != 1 && !c->log_straggler) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--straggler-minmax-count (", c->straggler_minmax_count,
        ") needs --log-straggler: it sets how many ranks the straggler report names"));
  }
  if (c->straggler_ctrlr_port.has_value() || c->disable_straggler_on_startup) {
    return absl::InvalidArgumentError(absl::StrCat(
        c->straggler_ctrlr_port.has_value() ? "--straggler-ctrlr-port"
                                            : "--disable-straggler-on-startup",
        " belongs to Megatron's run-time straggler controller (a port that switches the detector "
        "on and off), which Loom does not have: --log-straggler reports with every "
        "--log-interval from the start; leave the flag out"));
  }
  if (absl::Status faults = ValidateFaults(c->fault_injection, world_size, c->train_iters);
      !faults.ok()) {
    return faults;
  }
  if (c->skip_train && c->eval_iters < 1) {
    return absl::InvalidArgumentError(
        "--skip-train evaluates only: it needs --eval-iters >= 1 (validation batches)");
  }
  return absl::OkStatus();
}

}  // namespace loom::train
