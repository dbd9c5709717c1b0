#ifndef LOOM_CONFIG_FINALIZE_H_
#define LOOM_CONFIG_FINALIZE_H_

// Finalize's steps, one concern each (config/config.h's Finalize calls them
// in this order). Each checks its flags and fills its derived fields; the
// order is part of the contract: the first failing check names the error.

#include "absl/status/status.h"
#include "config/config.h"

namespace loom::train::finalize {

// finalize_launch.cc: kernel overrides, --distributed-backend, the collective
// timeout, the world size.
absl::Status Launch(TrainConfig* c, int world_size);
// finalize_launch.cc: --device, the backend's device, --bf16; model.device
// and model.compute_dtype.
absl::Status Device(TrainConfig* c);

// finalize_parallelism.cc: TP x PP x CP against the world; world_size and
// data_parallel_size.
absl::Status Parallelism(TrainConfig* c, int world_size);
// finalize_parallelism.cc: the batch sizes against DP; num_micro_batches.
absl::Status Batch(TrainConfig* c);
// finalize_parallelism.cc: --pipeline-schedule and virtual stages;
// virtual_pipeline_size.
absl::Status PipelineSchedule(TrainConfig* c);
// finalize_parallelism.cc: EP, SP and the model against the layout.
absl::Status Layout(TrainConfig* c);

// finalize_optimizer.cc: --train-iters, the LR schedule's defaults, dropout
// and AdamW.
absl::Status Optimizer(TrainConfig* c);
// finalize_optimizer.cc: DDP buckets and --overlap-param-gather.
absl::Status GradientReduction(const TrainConfig& c);

// finalize_logging.cc: intervals, TensorBoard and the timers.
absl::Status Logging(const TrainConfig& c);
// finalize_logging.cc: the --profile window.
absl::Status Profile(const TrainConfig& c);
// finalize_logging.cc: --log-straggler and Megatron's controller flags.
absl::Status Straggler(const TrainConfig& c);

// finalize_checkpoint.cc: --save, --load and --finetune.
absl::Status Checkpoint(const TrainConfig& c);
// finalize_checkpoint.cc: --exit-signal-handler and the --exit-* limits.
absl::Status EarlyExit(const TrainConfig& c);
// finalize_checkpoint.cc: LOOM_FAULT against the world and the iterations
// (its kind=save fault needs a save to fire in).
absl::Status Faults(const TrainConfig& c, int world_size);
// finalize_logging.cc: --skip-train needs validation batches.
absl::Status Evaluation(const TrainConfig& c);
// finalize_data.cc: --data-path or --train/valid/test-data-path (Megatron's
// blend lists, parsed; every corpus's .idx and .bin present) and --mock-data.
absl::Status Data(const TrainConfig& c);

}  // namespace loom::train::finalize

#endif  // LOOM_CONFIG_FINALIZE_H_
