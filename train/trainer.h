#ifndef LOOM_TRAIN_TRAINER_H_
#define LOOM_TRAIN_TRAINER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/checkpointer.h"
#include "comm/comm.h"
#include "comm/grid.h"
#include "config/config.h"
#include "core/memory_stats.h"
#include "distributed/gradient_sync.h"
#include "layers/stage_model.h"
#include "pipeline/executor.h"
#include "pipeline/schedule.h"
#include "profile/profiler.h"
#include "train/data/blend.h"
#include "train/data/gpt_dataset.h"
#include "train/data/indexed_dataset.h"
#include "train/data/tokenizer.h"
#include "train/fault_injection.h"
#include "train/metrics.h"
#include "train/optimizer.h"
#include "train/straggler.h"
#include "train/tensorboard/events.h"
#include "train/timers.h"

namespace loom::train {

// One rank's training run: flags -> groups -> model -> data -> optimizer ->
// loop. Every rank of the world constructs one and calls Train(); ranks of a
// process-per-rank backend each own theirs, ranks of the `local` backend are
// threads that each own one.
class Trainer {
 public:
  // Why Train() stopped before --train-iters (Megatron's exit flags).
  enum class ExitReason { kNone, kSignal, kInterval, kDuration };

  // Where log lines go (rank 0 only prints); defaults to stdout.
  using LogFn = std::function<void(const std::string&)>;

  // Collective over `world`: splits it into TP/PP/DP groups, builds this
  // rank's model chunks, the pipeline executor, the data and the optimizer.
  // `world` must outlive the Trainer.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainConfig& config,
                                                         comm::Communicator* world,
                                                         LogFn log = nullptr);

  // Runs iterations [iteration(), config.train_iters), logging every
  // --log-interval (with Megatron's "(min, max) time across ranks" block of
  // the --timing-log-level timers, train/timers.h, and with --log-straggler
  // a "straggler:" line, train/straggler.h) and evaluating every
  // --eval-interval; --profile records the steps of its window and writes
  // the merged Chrome trace (profile/profiler.h). With --skip-train:
  // one evaluation, logged, and nothing else. --exit-signal-handler,
  // --exit-interval, --exit-duration-in-mins: stops after the step where the
  // ranks agree one holds, saves (with --save), logs one line and returns OK
  // with exit_reason() set.
  //
  // Restarts (comm/launch/launcher.h): in a start with RestartCount() > 0,
  // --save set and no --load, Create() resumes from the checkpoint `latest`
  // names in --save, as --load would (full state), when it was written by
  // this run (same --train-iters, batch, LR schedule, model and optimizer
  // state saved); otherwise it starts from iteration 0 as the first start did.
  absl::Status Train();
  // kNone unless Train() stopped early.
  ExitReason exit_reason() const { return exit_reason_; }
  // One step; returns the mean loss of the global batch.
  absl::StatusOr<double> TrainStep();
  // Mean loss over --eval-iters batches of the validation split (no dropout).
  absl::StatusOr<double> Evaluate();
  // Continues `prompt` by `tokens` sampled tokens (temperature 0.8, fixed
  // seed). Needs PP = 1; collective over TP.
  absl::StatusOr<std::string> Generate(const std::string& prompt, int64_t tokens);

  // Collective: writes a checkpoint of the current state to --save (also
  // done every --save-interval and at the end of Train()). With
  // --async-save it returns once the snapshot is taken.
  absl::Status SaveCheckpoint();
  // Waits for an in-flight --async-save; returns its status.
  absl::Status WaitForCheckpoint();

  // The loss of every step so far, in order (rank-independent).
  const std::vector<double>& losses() const { return losses_; }
  int64_t iteration() const { return iteration_; }
  // The validation loss of the last Evaluate() Train() ran (NaN: none).
  double last_eval_loss() const { return last_eval_loss_; }
  int64_t consumed_samples() const { return consumed_samples_; }
  // The training state a checkpoint saves and restores.
  void set_position(int64_t iteration, int64_t consumed_samples) {
    iteration_ = iteration;
    consumed_samples_ = consumed_samples;
  }
  layers::StageModel& model() { return *model_; }
  Optimizer& optimizer() { return *optimizer_; }
  // The gradients between the backward and the optimizer (buckets, owned
  // ranges; under ZeRO-2 their storage).
  const distributed::GradientSync& gradients() const { return *gradients_; }
  const TrainConfig& config() const { return config_; }
  const comm::Grid& grid() const { return grid_; }
  int global_rank() const { return world_->rank(); }

  // Memory (core/memory_stats.h). Each Trainer charges its own ledger: the
  // calls above run with it as their thread's ledger, so the figures are
  // this rank's even when ranks are threads of one process. Tags: the model
  // (parameters and their compute copy) is kParameters, the flat gradient
  // buffer kGradients (under ZeRO-2 the owned shard and the bucket pool), the Adam moments kOptimizer, the steps' forwards and
  // backwards (and evaluation, generation) kActivations, the communicators'
  // staging made by this rank kCommunication. Peaks restart at the end of
  // the setup: they are the training's.
  const std::shared_ptr<core::MemoryLedger>& memory_ledger() const { return memory_; }
  // This rank's figures on the model's device, with the caching allocator's
  // reserved bytes on a GPU.
  core::MemoryStats RankMemory() const;

 private:
  Trainer(const TrainConfig& config, comm::Communicator* world, comm::Grid grid, LogFn log)
      : config_(config), world_(world), grid_(grid), log_(std::move(log)),
        created_(std::chrono::steady_clock::now()), timers_(config.timing_log_level),
        straggler_(config.log_straggler, config.straggler_minmax_count) {}
  absl::Status Setup();
  absl::Status SetupData();
  // Micro-batch m of the step that starts at `consumed` samples.
  absl::StatusOr<pipeline::MicroBatch> MakeMicroBatch(const BlendedDataset& data, int64_t consumed,
                                                      int m, bool training) const;
  void Log(const std::string& line) const;
  // The ranks that hold the same parameters and average their gradients and
  // losses: DP, or DP x CP under context parallelism (Megatron's
  // data-parallel-with-CP group). ZeRO-1 shards the optimizer over it.
  comm::Communicator* GradientGroup() const {
    return groups_.dp_cp ? groups_.dp_cp.get() : groups_.dp.get();
  }
  checkpoint::RankView CheckpointView();
  // Loads checkpoint `dir` (iteration: the one `latest` names when unset).
  // `restart` > 0: a restart resuming from --save (full state, its own log line).
  absl::Status LoadCheckpoint(const std::string& dir, std::optional<int64_t> iteration,
                              int restart);
  // Collective: the iteration of the checkpoint in --save restart `restart`
  // resumes from (rank 0 decides, logging why), nullopt: start from 0.
  absl::StatusOr<std::optional<int64_t>> RestartCheckpoint(int restart);
  // Collective when --exit-signal-handler or --exit-duration-in-mins is on:
  // whether (and why) the ranks stop after this step.
  absl::StatusOr<ExitReason> AgreeOnExit();
  // Saves (with --save), logs why the run stops, sets exit_reason_.
  absl::Status ExitEarly(ExitReason reason);
  // On a GPU, checkpoints read and write host mirrors of the parameters and
  // Adam moments: staged before a save, copied back after a load.
  absl::Status EnsureHostMirror();
  absl::Status StageToHost();
  absl::Status UnstageFromHost();
  // Collective: the largest total peak over the ranks (log lines).
  absl::StatusOr<int64_t> MaxMemoryPeak();
  // Collective: --memory-report's table, logged by rank 0.
  absl::Status ReportMemory();
  // A validation loss into --metrics-file and --tensorboard-dir (rank 0).
  absl::Status RecordEval(double valid);
  // --tensorboard-dir (rank 0): Megatron's scalar `tag` at the iteration,
  // and with `vs_samples` also "<tag> vs samples" at the samples consumed.
  void AddTensorBoardScalar(const std::string& tag, double value, bool vs_samples);
  // Collective: --timing-log-level's timers over the ranks since the last
  // log line (`iterations` of them) as Megatron's block ("\n"-separated
  // lines to append to the log line; "" when the level has none), and
  // (--log-timers-to-tensorboard) their <timer>-time scalars.
  absl::StatusOr<std::string> IntervalTimers(int64_t iterations);
  // Collective with --profile: closes an open window (training stopped inside it).
  absl::Status CloseProfile();
  // Every --tensorboard-log-interval: the step's loss, learning rate, grad
  // norm, batch size (and memory); flushed, so TensorBoard sees progress.
  absl::Status WriteTensorBoardStep(double loss);

  TrainConfig config_;
  // This rank's ledger (its tensors keep it alive as long as they live).
  std::shared_ptr<core::MemoryLedger> memory_ = std::make_shared<core::MemoryLedger>();
  comm::Communicator* world_;
  comm::Grid grid_;
  comm::GridCoord coord_;
  LogFn log_;
  comm::ParallelGroups groups_;
  // Expert parallelism (EP > 1): the EP group (the DP ranks dp / EP alike,
  // holding different experts) and the expert-data-parallel group (dp % EP
  // alike, holding the same experts). Null otherwise.
  std::unique_ptr<comm::Communicator> ep_, expert_dp_;
  std::unique_ptr<layers::StageModel> model_;
  std::optional<pipeline::Executor> executor_, eval_executor_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<distributed::GradientSync> gradients_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<std::unique_ptr<IndexedDataset>> corpora_;  // what the datasets read
  std::unique_ptr<BlendedDataset> train_data_, valid_data_;
  // --sft: the loss masks, sample for sample the splits above (train/data/sft_data.h).
  std::vector<std::unique_ptr<IndexedDataset>> mask_corpora_;
  std::unique_ptr<BlendedDataset> train_mask_, valid_mask_;
  MetricsFile metrics_;
  std::unique_ptr<tensorboard::EventWriter> tensorboard_;  // rank 0 with --tensorboard-dir
  double peak_flops_ = 0;
  double last_grad_norm_ = 0;
  int64_t iteration_ = 0;
  int64_t consumed_samples_ = 0;
  std::vector<double> losses_;
  double last_eval_loss_ = std::numeric_limits<double>::quiet_NaN();
  std::unique_ptr<checkpoint::Checkpointer> checkpointer_;
  int64_t last_saved_iteration_ = -1;
  const std::chrono::steady_clock::time_point created_;  // --exit-duration-in-mins counts from here
  ExitReason exit_reason_ = ExitReason::kNone;
  bool memory_reported_ = false;  // --memory-report: once, after the first step
  FaultInjector faults_;  // LOOM_FAULT (tests only): empty unless set
  std::unique_ptr<layers::ParamBuffer> host_params_;  // device runs only
  core::Tensor host_exp_avg_, host_exp_avg_sq_;
  core::Tensor host_owned_values_;  // device runs under ZeRO-3: the owned values' mirror
  // Megatron's timers (--timing-log-level); with --profile also the spans.
  Timers timers_;
  ExecutorTimers executor_timers_{&timers_};
  std::unique_ptr<profile::Profiler> profiler_;  // --profile
  // --log-straggler: this rank's forward-backward + optimizer time, reported
  // with each log line (train/straggler.h).
  StragglerDetector straggler_;
};

}  // namespace loom::train

#endif  // LOOM_TRAIN_TRAINER_H_
