#ifndef LOOM_CONFIG_CONFIG_H_
#define LOOM_CONFIG_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "config/lr_schedule.h"
#include "config/optimizer_config.h"
#include "core/enum_names.h"
#include "models/gpt/gpt_config.h"
#include "pipeline/schedule.h"
#include "train/data/tokenizer_type.h"

namespace loom::train {

// Checkpoint settings beyond --save, --load and --save-interval.
struct CheckpointFlags {
  std::optional<int64_t> load_iteration;  // --load-iteration (unset: the one `latest` names)
  int keep_last = 0;                      // --keep-last (0: keep all)
  bool async_save = false;                // --async-save
  bool save_optim = true;                 // false: --no-save-optim
  bool load_optim = true;                 // false: fresh Adam state after --load
  // --finetune: with --load, the checkpoint's weights only; iteration 0,
  // fresh Adam state, LR schedule and data position (Megatron's meaning).
  bool finetune = false;
};

// The model of the default job (README: 4 layers, hidden 256, 8 heads,
// sequence 128): GptConfig's own defaults are the small model of the layer tests.
inline layers::GptConfig DefaultModel() {
  layers::GptConfig m;
  m.num_layers = 4;
  m.hidden_size = 256;
  m.num_attention_heads = 8;
  m.seq_length = 128;
  return m;
}

// The default job's learning-rate schedule (LrSchedule's own defaults are neutral).
inline LrSchedule DefaultLrSchedule() {
  LrSchedule lr;
  lr.lr = 1e-3f;
  lr.min_lr = 1e-4f;
  lr.style = LrDecayStyle::kCosine;
  lr.warmup_iters = -1;  // Finalize: min(20, --train-iters / 10)
  lr.decay_iters = 0;    // Finalize: --train-iters
  return lr;
}

// The default job's AdamW settings (Megatron's GPT recipe: beta2 0.95).
inline OptimizerConfig DefaultOptimizer() {
  OptimizerConfig o;
  o.beta1 = 0.9f;
  o.beta2 = 0.95f;
  o.eps = 1e-8f;
  o.weight_decay = 0.01f;
  o.clip_grad = 1.0f;
  return o;
}

// --device: where a rank computes (cuda: GPU local_rank mod the node's GPUs).
enum class DeviceKind { kCpu, kCuda };
LOOM_ENUM_NAMES(DeviceKind, {DeviceKind::kCpu, "cpu"}, {DeviceKind::kCuda, "cuda"})

// Megatron's --data-parallel-sharding-strategy: what data parallelism shards
// (optim = ZeRO-1, optim_grads = ZeRO-2, optim_grads_params = ZeRO-3/FSDP).
// "" (unset): --use-distributed-optimizer decides (optim with it, else no_shard).
enum class ShardingStrategy { kUnset, kNoShard, kOptim, kOptimGrads, kOptimGradsParams };
LOOM_ENUM_NAMES(ShardingStrategy, {ShardingStrategy::kUnset, ""},
                {ShardingStrategy::kNoShard, "no_shard"}, {ShardingStrategy::kOptim, "optim"},
                {ShardingStrategy::kOptimGrads, "optim_grads"},
                {ShardingStrategy::kOptimGradsParams, "optim_grads_params"})

// Everything a training run is configured by, named after Megatron's flags.
// train/gpt_flags.cc maps //train:gpt's --flag-names to these fields, and
// every flag's default is the field's default here: `TrainConfig{}` is the
// default job (`bazel run //train:gpt` with no flags). Derived fields are
// filled by Finalize().
struct TrainConfig {
  // The model flags, activation recomputation (--recompute-granularity,
  // --recompute-method, --recompute-num-layers) included: models/gpt/gpt_config.h.
  layers::GptConfig model = DefaultModel();

  // Parallelism.
  int tensor_model_parallel_size = 1;
  int pipeline_model_parallel_size = 1;
  int num_layers_per_virtual_pipeline_stage = 0;  // 0: no interleaving
  // --pipeline-schedule (gpipe | 1f1b | interleaved | zb-h1 | zbv | dualpipev; the last two
  // place two chunks per stage in a V, CPU only until a device run).
  pipeline::ScheduleKind pipeline_schedule = pipeline::ScheduleKind::k1F1B;
  bool sequence_parallel = false;
  // --tp-comm-overlap (Megatron's name; needs --sequence-parallel): the TP linear layers'
  // sequence all-gather and reduce-scatter as a ring, each block's GEMM while the next block
  // travels (layers/tp_overlap.h).
  bool tp_comm_overlap = false;
  // Context parallelism: the sequence split over CP ranks, ring attention
  // (layers/context_parallel.h); CP ranks share DP's gradient reduction.
  int context_parallel_size = 1;
  // Expert parallelism: each MoE layer's experts split over EP ranks carved
  // out of DP (Megatron's --expert-model-parallel-size); tokens travel to
  // their experts by all-to-all-v (layers/moe.h).
  int expert_model_parallel_size = 1;

  // Distributed run. The launcher's own flags (--nproc-per-node, --rank,
  // --master-addr, --network, --store, ...) are comm/launch/flags.h's.
  // --distributed-backend (or Loom's --backend): local | mpi | ucx | nccl;
  // "": ucx, or nccl with --device=cuda (Finalize fills it in).
  std::string distributed_backend;
  // The flag distributed_backend came from, for messages.
  std::string distributed_backend_flag = "--distributed-backend";
  // Collective timeout: --distributed-timeout-minutes x 60, else --comm-timeout-s.
  double distributed_timeout_s = 300;

  // Batches and iterations.
  // The default job: 700 steps of 8 x 128 tokens (0.72M tokens) train to a
  // validation loss well below the corpus's unigram entropy in under 4
  // minutes on a 2-core AVX2 machine (README, Default job).
  int64_t micro_batch_size = 4;
  int64_t global_batch_size = 8;
  int64_t train_iters = 700;

  // Optimisation.
  LrSchedule lr = DefaultLrSchedule();
  OptimizerConfig optimizer = DefaultOptimizer();
  float hidden_dropout = 0.1f;
  float attention_dropout = 0.0f;
  bool overlap_grad_reduce = false;   // --overlap-grad-reduce
  bool overlap_param_gather = false;  // --overlap-param-gather
  // --data-parallel-sharding-strategy as typed (kUnset: from
  // --use-distributed-optimizer); Finalize sets optimizer.distributed,
  // shard_gradients and shard_params from it.
  ShardingStrategy data_parallel_sharding_strategy = ShardingStrategy::kUnset;
  // optim_grads_params (ZeRO-3) with --device=cuda: proven on the fake device
  // (//train:sharded_device_test: every device-memory access and collective
  // of the CPU's run, bit for bit) but not yet by a GPU run (NCCL's streams,
  // docs/DEVICE_CHECK.md); refused without this flag.
  bool allow_unproven_gpu_sharding = false;
  // --num-distributed-optimizer-instances (Megatron's hybrid sharding): the
  // DP x CP gradient group splits into N instances of consecutive ranks; what
  // the strategy shards is sharded within an instance and replicated across
  // them (distributed/gradient_sync.h). 1: sharded over the whole group.
  int num_distributed_optimizer_instances = 1;

  // Data.
  // --data-path: a prefix of .bin/.idx, or Megatron's blend "W1 PREFIX1 W2
  // PREFIX2 ..." (train/data/blend.h), each corpus split by --split ("" =
  // default corpus). --train-data-path, --valid-data-path and
  // --test-data-path instead give each split its own corpus or blend (whole
  // corpora: --split does not apply). --mock-data: synthetic documents, no files.
  std::string data_path;
  std::string train_data_path, valid_data_path, test_data_path;
  bool mock_data = false;
  // Documents packed in a sample (Megatron's flags, train/data/packing.h):
  // --reset-position-ids, --reset-attention-mask, --eod-mask-loss. They read
  // the tokenizer's EOD id. GPU: only with allow_unproven_gpu_packing.
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  bool eod_mask_loss = false;
  // --sft: supervised fine-tuning data from preprocess_data --sft; the loss
  // counts only where each corpus's <prefix>_loss_mask twin is 1 (the
  // assistant's tokens), through the same per-token loss weights.
  bool sft = false;
  // The four above with --device=cuda: their GPU kernels (document starts in
  // the attention, RoPE at position ids, per-token loss weights) are written
  // and tested against the CPU but not yet proven by a device run
  // (docs/DEVICE_CHECK.md); refused without this flag.
  bool allow_unproven_gpu_packing = false;
  std::string split = "969,30,1";
  TokenizerType tokenizer_type = TokenizerType::kByteLevel;
  std::string vocab_file, merge_file;
  std::string tokenizer_model;  // HuggingFaceTokenizer (tokenizer.json or its folder), SentencePieceTokenizer
  // --data-cache-path (Megatron's name; --data-cache-dir too): where the
  // default corpus, sample and blend indices go ("" = ~/.cache/loom).
  std::string data_cache_dir;

  // Logging, evaluation, checkpoints.
  int64_t log_interval = 50;
  int64_t eval_interval = 250;
  int64_t eval_iters = 10;
  std::string metrics_file;  // JSON lines ("" = none)
  // --memory-report: after the first step, rank 0 logs every rank's peak
  // bytes per category (core/memory_stats.h) and what would shrink them.
  bool memory_report = false;
  // TensorBoard (Megatron's flags): rank 0 writes an event file into
  // tensorboard_dir ("" = none; train/tensorboard): the step's scalars every
  // tensorboard_log_interval steps, iteration time and throughput with each
  // log line, the validation loss with each evaluation.
  std::string tensorboard_dir;
  int64_t tensorboard_log_interval = 1;
  bool log_memory_to_tensorboard = false;          // mem-* scalars
  bool log_validation_ppl_to_tensorboard = false;  // "lm loss validation ppl"
  // Megatron's timers (train/timers.h, Megatron's levels): after each log
  // line, "(min, max) time across ranks (ms):" of the timers at or below
  // --timing-log-level (0: save-checkpoint only, after each save; 1: the
  // step's phases; 2: per micro-batch compute, p2p, batch-generator).
  int timing_log_level = 0;
  // With --tensorboard-dir: "<timer>-time" scalars (the max over ranks, s
  // per iteration) with each log line.
  bool log_timers_to_tensorboard = false;
  // --log-straggler (Megatron's): with each log line, rank 0 logs one
  // "straggler:" line naming the straggler_minmax_count slowest and fastest
  // ranks by compute time against the median (train/straggler.h).
  bool log_straggler = false;
  int straggler_minmax_count = 1;  // >= 1; more than the ranks lists them all
  // Megatron's run-time controller of the detector (an HTTP port that turns
  // it on and off): not in Loom, so Finalize refuses these when given.
  bool disable_straggler_on_startup = false;
  std::optional<int> straggler_ctrlr_port;
  // --profile: every rank records the steps that start with
  // profile_step_start .. profile_step_end - 1 iterations completed (the
  // timers as spans, every collective and p2p op) and writes a Chrome trace;
  // rank 0 merges them into <profile_dir>/trace.json (profile/profiler.h).
  bool profile = false;
  std::string profile_dir;
  int64_t profile_step_start = 10;
  int64_t profile_step_end = 12;
  std::string save, load;
  int64_t save_interval = 0;
  CheckpointFlags checkpoint;
  // --skip-train: evaluate the (loaded) model on --eval-iters validation
  // batches, print the loss and stop (no step, nothing saved).
  bool skip_train = false;
  // Stopping early (Megatron's flags): Train() finishes the step, saves a
  // checkpoint (with --save), logs why and returns OK with
  // Trainer::exit_reason() set; //train:gpt then exits 0 without a sample.
  // The ranks agree: the signal and the clock are all-reduced (MAX) over the
  // world after every step (only when one of the two is on).
  bool exit_signal_handler = false;              // --exit-signal-handler: on SIGTERM (needs --save)
  std::optional<int64_t> exit_interval;          // --exit-interval: when iteration % N == 0
  std::optional<double> exit_duration_in_mins;   // --exit-duration-in-mins: once the run took M min
  // Test only: the value of LOOM_FAULT (config/fault_spec.h); "" = none.
  std::string fault_injection;
  double peak_flops = 0;     // --peak-flops per rank for MFU (0: measure a GEMM at start)
  int64_t sample_tokens = 200;  // generated at the end (0: none)

  // Derived by Finalize().
  int world_size = 1;
  int data_parallel_size = 1;
  int virtual_pipeline_size = 1;
  int64_t num_micro_batches = 1;  // per DP rank per step

  // Placement: --device and --bf16. Finalize sets model.device (CUDA
  // device index chosen later, per rank) and model.compute_dtype from them.
  DeviceKind device = DeviceKind::kCpu;
  bool bf16 = false;
};

// --distributed-backend as given, or its default for the config's device
// (nccl for cuda, ucx otherwise). Needed before Finalize: which backend
// decides how the ranks are started, hence the world size.
std::string BackendOf(const TrainConfig& config);

// Checks every flag combination before any work and fills the derived
// fields (and distributed_backend: BackendOf). `world_size` is the world
// the ranks form: a launcher calls it before it starts any rank. Errors name
// the flags (with dashes, as Megatron users type them) and the arithmetic, e.g.
// "--global-batch-size (30) is not divisible by --micro-batch-size (4) x
// data-parallel size (2) = 8".
absl::Status Finalize(TrainConfig* config, int world_size);

}  // namespace loom::train

#endif  // LOOM_CONFIG_CONFIG_H_
