// Every //train:gpt flag (listed with its default by --help). The defaults
// are TrainConfig{}'s: change them in config/config.h.
#include "train/gpt_flags.h"

#include <functional>
#include <optional>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "checkpoint/file_util.h"
#include "checkpoint/format.h"
#include "checkpoint/rank_state.h"
#include "checkpoint/reader.h"
#include "config/fault_spec.h"
#include "core/cli.h"
#include "core/status_macros.h"
#include "models/gpt/gpt_architecture.h"

namespace {
const loom::train::TrainConfig& D() {
  static const loom::train::TrainConfig* defaults = new loom::train::TrainConfig();
  return *defaults;
}
}  // namespace

// Model: the architecture's flags, one per row of models/gpt/gpt_architecture.h.
// (Its enum types, named unqualified in the table; Abseil's flags live at global scope.)
using loom::layers::Normalization;
using loom::layers::PositionEmbedding;
#define LOOM_ARCHITECTURE_FLAG(type, member, default_value, flag, sense, applies, defining, help) \
  ABSL_FLAG(type, flag, loom::layers::sense(D().model.member), help);
LOOM_GPT_ARCHITECTURE_FIELDS(LOOM_ARCHITECTURE_FLAG)
#undef LOOM_ARCHITECTURE_FLAG
ABSL_FLAG(float, layernorm_epsilon, D().model.layernorm_epsilon,
          "Megatron's older name of --norm-epsilon (--norm-epsilon wins when both are set)");
ABSL_FLAG(float, init_method_std, D().model.init_method_std, "Std of the normal weight init");
// Activation recomputation (Megatron's flags; models/gpt/gpt_config.h).
ABSL_FLAG(loom::layers::RecomputeGranularity, recompute_granularity, D().model.recompute_granularity,
          "Activation recomputation: full (rerun whole layers in the backward, with "
          "--recompute-method) | selective (rerun only the attention core); empty: none");
ABSL_FLAG(loom::layers::RecomputeMethod, recompute_method, D().model.recompute_method,
          "With --recompute-granularity=full: uniform (each chunk's layers in groups of "
          "--recompute-num-layers, only group inputs kept) | block (the first "
          "--recompute-num-layers layers of each chunk recomputed)");
ABSL_FLAG(int64_t, recompute_num_layers, D().model.recompute_num_layers,
          "N for --recompute-method: 1 .. layers per model chunk (0: unset)");
// Mixture of experts (Megatron's flags; layers/moe.h).
ABSL_FLAG(loom::layers::MoeLoadBalancing, moe_router_load_balancing_type, D().model.moe_router_load_balancing_type,
          "aux_loss (Switch load-balancing loss) | none");
ABSL_FLAG(float, moe_aux_loss_coeff, D().model.moe_aux_loss_coeff,
          "Weight of the load-balancing loss");
ABSL_FLAG(float, moe_z_loss_coeff, D().model.moe_z_loss_coeff, "Weight of the router z-loss");
ABSL_FLAG(float, moe_expert_capacity_factor, D().model.moe_expert_capacity_factor,
          "Expert capacity as a multiple of tokens x topk / experts; the least probable "
          "assignments over it are dropped (0: dropless)");
ABSL_FLAG(bool, moe_pad_expert_input_to_capacity, D().model.moe_pad_expert_input_to_capacity,
          "Pad every expert's input to the capacity (with --moe-expert-capacity-factor)");
ABSL_FLAG(bool, moe_grouped_gemm, D().model.moe_grouped_gemm,
          "Run the experts' GEMMs side by side (an expert per thread) instead of one after "
          "the other");
ABSL_FLAG(int64_t, moe_a2a_overlap_chunks, D().model.moe_a2a_overlap_chunks,
          "Under EP (--expert-model-parallel-size > 1), split each micro-batch's tokens into N "
          "chunks and pipeline the MoE dispatch/combine all-to-alls with the experts' compute "
          "(1: off)");
ABSL_FLAG(float, hidden_dropout, D().hidden_dropout, "Dropout after attention/MLP and on embeddings");
ABSL_FLAG(float, attention_dropout, D().attention_dropout, "Dropout on attention probabilities");
ABSL_FLAG(int64_t, seed, static_cast<int64_t>(D().model.seed),
          "Seed of weights, data order and dropout");
// Parallelism and placement.
ABSL_FLAG(int, tensor_model_parallel_size, D().tensor_model_parallel_size, "TP degree");
ABSL_FLAG(int, pipeline_model_parallel_size, D().pipeline_model_parallel_size, "PP degree");
ABSL_FLAG(int, num_layers_per_virtual_pipeline_stage, D().num_layers_per_virtual_pipeline_stage,
          "Layers per model chunk for interleaved 1F1B (0: no interleaving)");
ABSL_FLAG(loom::pipeline::ScheduleKind, pipeline_schedule, D().pipeline_schedule,
          "gpipe | 1f1b | interleaved | zb-h1 (zero bubble: 1F1B with each weight gradient "
          "deferred into the bubble; one chunk per stage) | zbv | dualpipev (two chunks per "
          "stage in a V, torch's ScheduleZBVZeroBubble and ScheduleDualPipeV orders)");
ABSL_FLAG(bool, sequence_parallel, D().sequence_parallel, "Sequence parallelism (needs TP > 1)");
ABSL_FLAG(bool, tp_comm_overlap, D().tp_comm_overlap,
          "Overlap TP communication with the GEMMs: the sequence all-gather and reduce-scatter "
          "of the TP linear layers as a ring, each block's GEMM while the next block travels "
          "(needs --sequence-parallel)");
ABSL_FLAG(int, expert_model_parallel_size, D().expert_model_parallel_size,
          "EP degree: each MoE layer's experts split over EP ranks carved out of DP, tokens "
          "moved by all-to-all-v");
ABSL_FLAG(int, context_parallel_size, D().context_parallel_size,
          "CP degree: the sequence split over CP ranks in 2 x CP zig-zag chunks, ring attention "
          "(--device=cpu)");
ABSL_FLAG(std::string, distributed_backend, D().distributed_backend,
          "local | mpi | ucx | nccl; not given: --backend (Loom's name for this flag) if "
          "given, else ucx (nccl with --device=cuda)");
ABSL_FLAG(double, distributed_timeout_minutes, 0,
          "Collective timeout in minutes (0: --comm-timeout-s)");
ABSL_FLAG(loom::train::DeviceKind, device, D().device,
          "cpu | cuda (rank r uses GPU r mod the node's GPU count)");
ABSL_FLAG(bool, bf16, D().bf16, "bf16 GEMMs, f32 master weights and gradients; cuda: bf16 "
          "weights and activations; cpu: bf16 GEMM operands only (needs AVX512_BF16 or AMX-BF16)");
// Batches and schedule.
ABSL_FLAG(int64_t, micro_batch_size, D().micro_batch_size, "Samples per micro-batch");
ABSL_FLAG(int64_t, global_batch_size, D().global_batch_size, "Samples per step over all DP ranks");
ABSL_FLAG(int64_t, train_iters, D().train_iters, "Training steps");
ABSL_FLAG(float, lr, D().lr.lr, "Peak learning rate");
ABSL_FLAG(float, min_lr, D().lr.min_lr, "Final learning rate");
ABSL_FLAG(loom::train::LrDecayStyle, lr_decay_style, D().lr.style, "constant | linear | cosine");
ABSL_FLAG(int64_t, lr_warmup_iters, D().lr.warmup_iters,
          "Linear warm-up steps (-1: min(20, --train-iters / 10))");
ABSL_FLAG(int64_t, lr_decay_iters, D().lr.decay_iters, "Decay steps (0: --train-iters)");
ABSL_FLAG(float, weight_decay, D().optimizer.weight_decay,
          "AdamW decoupled weight decay (not on biases/LayerNorm)");
ABSL_FLAG(float, clip_grad, D().optimizer.clip_grad, "Global gradient-norm clip (0: off)");
ABSL_FLAG(float, adam_beta1, D().optimizer.beta1, "Adam beta1");
ABSL_FLAG(float, adam_beta2, D().optimizer.beta2, "Adam beta2");
ABSL_FLAG(float, adam_eps, D().optimizer.eps, "Adam epsilon");
ABSL_FLAG(bool, use_distributed_optimizer, D().optimizer.distributed,
          "ZeRO-1: shard Adam state over DP (= --data-parallel-sharding-strategy=optim)");
ABSL_FLAG(loom::train::ShardingStrategy, data_parallel_sharding_strategy,
          D().data_parallel_sharding_strategy,
          "What DP shards: no_shard | optim (ZeRO-1: Adam state) | optim_grads (ZeRO-2: Adam "
          "state and gradients, reduce-scattered per bucket in every micro-batch's backward) | "
          "optim_grads_params (ZeRO-3: also the parameters, all-gathered per layer before its "
          "forward and backward; prefetched with --overlap-param-gather; --device=cuda only with "
          "--allow-unproven-gpu-sharding). "
          "Default: optim with --use-distributed-optimizer, else no_shard");
// Megatron-LM's switch to its FSDP code path, where --data-parallel-sharding-strategy
// applies: accepted so Megatron command lines run. Loom has one data-parallel path
// (distributed::GradientSync) that runs every strategy, so it selects nothing.
ABSL_FLAG(bool, use_megatron_fsdp, false,
          "Accepted for Megatron-LM command lines (--use-megatron-fsdp "
          "--data-parallel-sharding-strategy=...): Loom runs every strategy on one path, so it "
          "changes nothing");
ABSL_FLAG(bool, allow_unproven_gpu_sharding, D().allow_unproven_gpu_sharding,
          "Run --data-parallel-sharding-strategy=optim_grads_params with --device=cuda although "
          "no device run has proven it yet");
ABSL_FLAG(int, num_distributed_optimizer_instances, D().num_distributed_optimizer_instances,
          "Hybrid sharding: the data-parallel ranks split into N instances of consecutive ranks; "
          "what --data-parallel-sharding-strategy shards is sharded within an instance and "
          "replicated across instances (gradients reduce-scattered within, then all-reduced "
          "across). Divides DP; 1: shard over all of DP");
ABSL_FLAG(bool, overlap_grad_reduce, D().overlap_grad_reduce,
          "Overlap DP gradient reduction with backward");
ABSL_FLAG(bool, overlap_param_gather, D().overlap_param_gather,
          "Overlap ZeRO-1's parameter all-gathers with the next forward "
          "(needs --use-distributed-optimizer)");
ABSL_FLAG(int64_t, ddp_bucket_size, D().optimizer.bucket_bytes / 4,
          "Parameters per data-parallel gradient bucket (a layer is never split)");
// Data.
ABSL_FLAG(std::string, data_path, D().data_path,
          "Dataset prefix (.bin/.idx), or a blend \"W1 PREFIX1 W2 PREFIX2 ...\" (Megatron's "
          "weights and prefixes), each corpus split by --split; empty: the fortunes corpus");
ABSL_FLAG(std::string, train_data_path, D().train_data_path,
          "The training split's prefix or blend, a whole corpus each (instead of --data-path)");
ABSL_FLAG(std::string, valid_data_path, D().valid_data_path,
          "The validation split's prefix or blend (with --train-data-path)");
ABSL_FLAG(std::string, test_data_path, D().test_data_path,
          "The test split's prefix or blend (checked; no test evaluation runs)");
ABSL_FLAG(bool, mock_data, D().mock_data,
          "Synthetic documents instead of a corpus (written once to --data-cache-path)");
ABSL_FLAG(bool, reset_position_ids, D().reset_position_ids,
          "Position ids restart at 0 after each end-of-document token (packed documents)");
ABSL_FLAG(bool, reset_attention_mask, D().reset_attention_mask,
          "Tokens after an end-of-document token do not attend to the tokens before it");
ABSL_FLAG(bool, eod_mask_loss, D().eod_mask_loss,
          "No loss where the input token is the end-of-document token");
ABSL_FLAG(bool, sft, D().sft,
          "Supervised fine-tuning: the loss counts only the tokens whose <prefix>_loss_mask "
          "(written by preprocess_data --sft) is 1, the assistant's");
ABSL_FLAG(bool, allow_unproven_gpu_packing, D().allow_unproven_gpu_packing,
          "Run --reset-position-ids, --reset-attention-mask, --eod-mask-loss and --sft with "
          "--device=cuda although no device run has proven their GPU kernels yet");
ABSL_FLAG(std::string, split, D().split, "Train/valid/test document split weights");
ABSL_FLAG(loom::train::TokenizerType, tokenizer_type, D().tokenizer_type,
          "ByteLevelTokenizer | GPT2BPETokenizer | HuggingFaceTokenizer | SentencePieceTokenizer");
ABSL_FLAG(std::string, vocab_file, D().vocab_file, "GPT-2 vocab.json (GPT2BPETokenizer)");
ABSL_FLAG(std::string, merge_file, D().merge_file, "GPT-2 merges.txt (GPT2BPETokenizer)");
ABSL_FLAG(std::string, tokenizer_model, D().tokenizer_model,
          "HuggingFaceTokenizer: folder holding tokenizer.json (or the file); "
          "SentencePieceTokenizer: the .model file");
ABSL_FLAG(std::string, data_cache_path, D().data_cache_dir,
          "Preprocessed corpus, sample and blend indices, created if missing "
          "(empty: ~/.cache/loom)");
ABSL_FLAG(std::string, data_cache_dir, D().data_cache_dir,
          "Loom's older name of --data-cache-path (that one wins when both are given)");
// Logging and checkpoints.
ABSL_FLAG(int64_t, log_interval, D().log_interval, "Steps between log lines");
ABSL_FLAG(int64_t, eval_interval, D().eval_interval, "Steps between validation runs (0: never)");
ABSL_FLAG(int64_t, eval_iters, D().eval_iters, "Batches per validation run");
ABSL_FLAG(std::string, metrics_file, D().metrics_file, "JSON-lines metrics (see //train:plot)");
ABSL_FLAG(bool, memory_report, D().memory_report,
          "After the first step, log every rank's peak memory per category (parameters, "
          "gradients, optimizer, activations, communication) and what would shrink it");
ABSL_FLAG(std::string, tensorboard_dir, D().tensorboard_dir,
          "Folder for a TensorBoard event file (rank 0 writes it; created if missing)");
ABSL_FLAG(int64_t, tensorboard_log_interval, D().tensorboard_log_interval,
          "Steps between TensorBoard scalars (loss, learning rate, grad norm, batch size)");
ABSL_FLAG(bool, log_memory_to_tensorboard, D().log_memory_to_tensorboard,
          "Also write rank 0's memory (mem-allocated-bytes, mem-max-allocated-bytes, ...)");
ABSL_FLAG(bool, log_validation_ppl_to_tensorboard, D().log_validation_ppl_to_tensorboard,
          "Also write the validation perplexity");
ABSL_FLAG(int, timing_log_level, D().timing_log_level,
          "Megatron's timers after each log line, (min, max) over ranks: 0 save-checkpoint, 1 "
          "+ forward-backward, optimizer, gradient reduction, params-all-gather, 2 + per "
          "micro-batch forward/backward-compute, p2p, batch-generator");
ABSL_FLAG(bool, log_timers_to_tensorboard, D().log_timers_to_tensorboard,
          "Also write the timers as <timer>-time scalars (max over ranks, s per iteration)");
ABSL_FLAG(bool, log_straggler, D().log_straggler,
          "With each log line, one 'straggler:' line naming the slowest and fastest ranks by "
          "compute time (forward-backward + optimizer) against the median");
ABSL_FLAG(int, straggler_minmax_count, D().straggler_minmax_count,
          "How many of the slowest and of the fastest ranks --log-straggler names (>= 1)");
ABSL_FLAG(bool, disable_straggler_on_startup, D().disable_straggler_on_startup,
          "Megatron's; refused: Loom has no run-time straggler controller");
ABSL_FLAG(std::optional<int>, straggler_ctrlr_port, D().straggler_ctrlr_port,
          "Megatron's; refused: Loom has no run-time straggler controller");
ABSL_FLAG(bool, profile, D().profile,
          "Write a Chrome trace (Perfetto, chrome://tracing) of steps --profile-step-start .. "
          "--profile-step-end of every rank into --profile-dir (merged: trace.json)");
ABSL_FLAG(std::string, profile_dir, D().profile_dir,
          "Folder of --profile's traces (created if missing; shared by the hosts)");
ABSL_FLAG(int64_t, profile_step_start, D().profile_step_start,
          "--profile starts before the step that begins with this many iterations done");
ABSL_FLAG(int64_t, profile_step_end, D().profile_step_end,
          "--profile stops after the step that leaves this many iterations done");
ABSL_FLAG(double, peak_flops, D().peak_flops,
          "Per-rank peak FLOP/s for MFU (0: measure a GEMM at start)");
ABSL_FLAG(int64_t, sample_tokens, D().sample_tokens,
          "Tokens of text generated at the end (0: none)");
ABSL_FLAG(std::string, save, D().save, "Checkpoint directory");
ABSL_FLAG(std::string, load, D().load, "Checkpoint directory to resume from");
ABSL_FLAG(int64_t, save_interval, D().save_interval,
          "Steps between checkpoints (0: only at the end when --save)");
ABSL_FLAG(int64_t, load_iteration, D().checkpoint.load_iteration.value_or(-1),
          "Iteration to resume from with --load (-1: the one `latest` names)");
ABSL_FLAG(int32_t, keep_last, D().checkpoint.keep_last,
          "Keep only the newest K checkpoints in --save (0: keep all)");
ABSL_FLAG(bool, async_save, D().checkpoint.async_save,
          "Write checkpoints on a background thread from a snapshot");
ABSL_FLAG(bool, no_save_optim, !D().checkpoint.save_optim,
          "Leave the optimizer state (Adam moments) out of checkpoints");
ABSL_FLAG(bool, finetune, D().checkpoint.finetune,
          "With --load: the checkpoint's weights only; start at iteration 0 with fresh optimizer "
          "state, LR schedule and data position (e.g. an imported Hugging Face model)");
ABSL_FLAG(bool, skip_train, D().skip_train,
          "Only evaluate the (--load'ed) model on --eval-iters validation batches and print the "
          "loss: no training step, nothing saved");
ABSL_FLAG(bool, no_load_optim, !D().checkpoint.load_optim,
          "With --load: fresh Adam state instead of the checkpoint's");
// Stopping early (Megatron's): finish the step, save (with --save), exit 0.
ABSL_FLAG(bool, exit_signal_handler, D().exit_signal_handler,
          "On SIGTERM (a scheduler's preemption): finish the step, save a checkpoint to --save "
          "and exit 0");
ABSL_FLAG(std::optional<int64_t>, exit_interval, D().exit_interval,
          "Save (with --save) and exit 0 when the iteration is a multiple of N (unset: never)");
ABSL_FLAG(std::optional<double>, exit_duration_in_mins, D().exit_duration_in_mins,
          "Save (with --save) and exit 0 once the run has taken M minutes (unset: no limit)");

namespace loom::train {

namespace {

// A --data-path value with each prefix resolved (core::ResolveUserPath) and
// its weights as typed: "0.3 a 0.7 b" -> "0.3 /home/me/a 0.7 /home/me/b".
// Entries that stand where a weight goes are kept; Finalize parses the list.
std::string ResolveDataPath(const std::string& value) {
  std::vector<std::string> entries =
      absl::StrSplit(value, absl::ByAnyChar(" \t\n"), absl::SkipEmpty());
  double weight;
  const bool weighted = entries.size() > 1 && absl::SimpleAtod(entries[0], &weight);
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!weighted || i % 2 == 1) entries[i] = core::ResolveUserPath(entries[i]);
  }
  return absl::StrJoin(entries, " ");
}

}  // namespace

TrainConfig ConfigFromFlags() {
  using core::ResolveUserPath;
  const comm::launch::CommFlags comm = comm::launch::GetCommFlags();
  TrainConfig c;
#define LOOM_READ_ARCHITECTURE_FLAG(type, member, default_value, flag, sense, ...) \
  c.model.member = layers::sense(absl::GetFlag(FLAGS_##flag));
  LOOM_GPT_ARCHITECTURE_FIELDS(LOOM_READ_ARCHITECTURE_FLAG)
#undef LOOM_READ_ARCHITECTURE_FLAG
  if (c.model.layernorm_epsilon == D().model.layernorm_epsilon) {
    c.model.layernorm_epsilon = absl::GetFlag(FLAGS_layernorm_epsilon);
  }
  c.model.init_method_std = absl::GetFlag(FLAGS_init_method_std);
  c.model.moe_router_load_balancing_type = absl::GetFlag(FLAGS_moe_router_load_balancing_type);
  c.model.moe_aux_loss_coeff = absl::GetFlag(FLAGS_moe_aux_loss_coeff);
  c.model.moe_z_loss_coeff = absl::GetFlag(FLAGS_moe_z_loss_coeff);
  c.model.moe_expert_capacity_factor = absl::GetFlag(FLAGS_moe_expert_capacity_factor);
  c.model.moe_pad_expert_input_to_capacity = absl::GetFlag(FLAGS_moe_pad_expert_input_to_capacity);
  c.model.moe_grouped_gemm = absl::GetFlag(FLAGS_moe_grouped_gemm);
  c.model.moe_a2a_overlap_chunks = absl::GetFlag(FLAGS_moe_a2a_overlap_chunks);
  c.model.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  c.model.recompute_granularity = absl::GetFlag(FLAGS_recompute_granularity);
  c.model.recompute_method = absl::GetFlag(FLAGS_recompute_method);
  c.model.recompute_num_layers = absl::GetFlag(FLAGS_recompute_num_layers);
  c.device = absl::GetFlag(FLAGS_device);
  c.bf16 = absl::GetFlag(FLAGS_bf16);
  c.hidden_dropout = absl::GetFlag(FLAGS_hidden_dropout);
  c.attention_dropout = absl::GetFlag(FLAGS_attention_dropout);
  c.tensor_model_parallel_size = absl::GetFlag(FLAGS_tensor_model_parallel_size);
  c.pipeline_model_parallel_size = absl::GetFlag(FLAGS_pipeline_model_parallel_size);
  c.num_layers_per_virtual_pipeline_stage = absl::GetFlag(FLAGS_num_layers_per_virtual_pipeline_stage);
  c.pipeline_schedule = absl::GetFlag(FLAGS_pipeline_schedule);
  c.sequence_parallel = absl::GetFlag(FLAGS_sequence_parallel);
  c.tp_comm_overlap = absl::GetFlag(FLAGS_tp_comm_overlap);
  c.context_parallel_size = absl::GetFlag(FLAGS_context_parallel_size);
  c.expert_model_parallel_size = absl::GetFlag(FLAGS_expert_model_parallel_size);
  c.distributed_backend = absl::GetFlag(FLAGS_distributed_backend);
  if (c.distributed_backend.empty() && comm.backend_given) {
    c.distributed_backend = comm.backend;
    c.distributed_backend_flag = "--backend";
  }
  const double minutes = absl::GetFlag(FLAGS_distributed_timeout_minutes);
  c.distributed_timeout_s = minutes != 0 ? minutes * 60 : comm.timeout_s;
  c.micro_batch_size = absl::GetFlag(FLAGS_micro_batch_size);
  c.global_batch_size = absl::GetFlag(FLAGS_global_batch_size);
  c.train_iters = absl::GetFlag(FLAGS_train_iters);
  c.lr.lr = absl::GetFlag(FLAGS_lr);
  c.lr.min_lr = absl::GetFlag(FLAGS_min_lr);
  c.lr.style = absl::GetFlag(FLAGS_lr_decay_style);
  c.lr.warmup_iters = absl::GetFlag(FLAGS_lr_warmup_iters);
  c.lr.decay_iters = absl::GetFlag(FLAGS_lr_decay_iters);
  c.optimizer.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  c.optimizer.clip_grad = absl::GetFlag(FLAGS_clip_grad);
  c.optimizer.beta1 = absl::GetFlag(FLAGS_adam_beta1);
  c.optimizer.beta2 = absl::GetFlag(FLAGS_adam_beta2);
  c.optimizer.eps = absl::GetFlag(FLAGS_adam_eps);
  c.optimizer.distributed = absl::GetFlag(FLAGS_use_distributed_optimizer);
  c.data_parallel_sharding_strategy = absl::GetFlag(FLAGS_data_parallel_sharding_strategy);
  c.allow_unproven_gpu_sharding = absl::GetFlag(FLAGS_allow_unproven_gpu_sharding);
  c.num_distributed_optimizer_instances = absl::GetFlag(FLAGS_num_distributed_optimizer_instances);
  c.overlap_grad_reduce = absl::GetFlag(FLAGS_overlap_grad_reduce);
  c.overlap_param_gather = absl::GetFlag(FLAGS_overlap_param_gather);
  c.optimizer.bucket_bytes = absl::GetFlag(FLAGS_ddp_bucket_size) * 4;  // f32 gradients
  c.data_path = ResolveDataPath(absl::GetFlag(FLAGS_data_path));
  c.train_data_path = ResolveDataPath(absl::GetFlag(FLAGS_train_data_path));
  c.valid_data_path = ResolveDataPath(absl::GetFlag(FLAGS_valid_data_path));
  c.test_data_path = ResolveDataPath(absl::GetFlag(FLAGS_test_data_path));
  c.mock_data = absl::GetFlag(FLAGS_mock_data);
  c.reset_position_ids = absl::GetFlag(FLAGS_reset_position_ids);
  c.reset_attention_mask = absl::GetFlag(FLAGS_reset_attention_mask);
  c.eod_mask_loss = absl::GetFlag(FLAGS_eod_mask_loss);
  c.sft = absl::GetFlag(FLAGS_sft);
  c.allow_unproven_gpu_packing = absl::GetFlag(FLAGS_allow_unproven_gpu_packing);
  c.split = absl::GetFlag(FLAGS_split);
  c.tokenizer_type = absl::GetFlag(FLAGS_tokenizer_type);
  c.vocab_file = ResolveUserPath(absl::GetFlag(FLAGS_vocab_file));
  c.merge_file = ResolveUserPath(absl::GetFlag(FLAGS_merge_file));
  c.tokenizer_model = ResolveUserPath(absl::GetFlag(FLAGS_tokenizer_model));
  c.data_cache_dir = ResolveUserPath(absl::GetFlag(FLAGS_data_cache_path).empty()
                                         ? absl::GetFlag(FLAGS_data_cache_dir)
                                         : absl::GetFlag(FLAGS_data_cache_path));
  c.log_interval = absl::GetFlag(FLAGS_log_interval);
  c.eval_interval = absl::GetFlag(FLAGS_eval_interval);
  c.eval_iters = absl::GetFlag(FLAGS_eval_iters);
  c.metrics_file = ResolveUserPath(absl::GetFlag(FLAGS_metrics_file));
  c.memory_report = absl::GetFlag(FLAGS_memory_report);
  c.tensorboard_dir = ResolveUserPath(absl::GetFlag(FLAGS_tensorboard_dir));
  c.tensorboard_log_interval = absl::GetFlag(FLAGS_tensorboard_log_interval);
  c.log_memory_to_tensorboard = absl::GetFlag(FLAGS_log_memory_to_tensorboard);
  c.log_validation_ppl_to_tensorboard = absl::GetFlag(FLAGS_log_validation_ppl_to_tensorboard);
  c.timing_log_level = absl::GetFlag(FLAGS_timing_log_level);
  c.log_timers_to_tensorboard = absl::GetFlag(FLAGS_log_timers_to_tensorboard);
  c.log_straggler = absl::GetFlag(FLAGS_log_straggler);
  c.straggler_minmax_count = absl::GetFlag(FLAGS_straggler_minmax_count);
  c.disable_straggler_on_startup = absl::GetFlag(FLAGS_disable_straggler_on_startup);
  c.straggler_ctrlr_port = absl::GetFlag(FLAGS_straggler_ctrlr_port);
  c.profile = absl::GetFlag(FLAGS_profile);
  c.profile_dir = ResolveUserPath(absl::GetFlag(FLAGS_profile_dir));
  c.profile_step_start = absl::GetFlag(FLAGS_profile_step_start);
  c.profile_step_end = absl::GetFlag(FLAGS_profile_step_end);
  c.peak_flops = absl::GetFlag(FLAGS_peak_flops);
  c.sample_tokens = absl::GetFlag(FLAGS_sample_tokens);
  c.save = ResolveUserPath(absl::GetFlag(FLAGS_save));
  c.load = ResolveUserPath(absl::GetFlag(FLAGS_load));
  c.save_interval = absl::GetFlag(FLAGS_save_interval);
  if (absl::GetFlag(FLAGS_load_iteration) >= 0) {
    c.checkpoint.load_iteration = absl::GetFlag(FLAGS_load_iteration);
  }
  c.checkpoint.keep_last = absl::GetFlag(FLAGS_keep_last);
  c.checkpoint.async_save = absl::GetFlag(FLAGS_async_save);
  c.checkpoint.save_optim = !absl::GetFlag(FLAGS_no_save_optim);
  c.checkpoint.load_optim = !absl::GetFlag(FLAGS_no_load_optim);
  c.checkpoint.finetune = absl::GetFlag(FLAGS_finetune);
  c.skip_train = absl::GetFlag(FLAGS_skip_train);
  c.exit_signal_handler = absl::GetFlag(FLAGS_exit_signal_handler);
  c.exit_interval = absl::GetFlag(FLAGS_exit_interval);
  c.exit_duration_in_mins = absl::GetFlag(FLAGS_exit_duration_in_mins);
  c.fault_injection = FaultSpecFromEnvironment();  // test only: LOOM_FAULT
  return c;
}

absl::StatusOr<std::string> ApplyCheckpointModelArgs(TrainConfig* config,
                                                     const std::set<std::string>& typed) {
  if (config->load.empty()) return std::string();
  absl::StatusOr<std::string> path =
      checkpoint::ResolveCheckpoint(config->load, config->checkpoint.load_iteration);
  if (!path.ok()) return std::string();  // the load itself reports it
  const std::string file = checkpoint::JoinPath(*path, "manifest.pb");
  absl::StatusOr<std::string> bytes = checkpoint::ReadFile(file);
  if (!bytes.ok()) return std::string();  // the load itself reports it (with its hints)
  absl::StatusOr<checkpoint::Manifest> manifest = checkpoint::DecodeManifest(*bytes, file);
  if (!manifest.ok()) return std::string();
  LOOM_ASSIGN_OR_RETURN(const layers::GptConfig saved,
                        checkpoint::GptConfigFromProto(manifest->model(), file));
  layers::GptConfig& m = config->model;
  auto typed_flag = [&](absl::string_view name) {
    return typed.count(std::string(name)) > 0 || typed.count(absl::StrCat("no", name)) > 0;
  };
  std::vector<std::string> taken;
  for (const layers::ArchitectureField& f : layers::ArchitectureFields()) {
    if (!f.applies(saved) || typed_flag(f.flag)) continue;
    if (f.flag == "norm_epsilon" && typed_flag("layernorm_epsilon")) continue;  // its old name
    const layers::FieldValue value = f.get(saved);
    if (f.get(m) == value) continue;
    LOOM_RETURN_IF_ERROR(f.set(m, value));
    taken.push_back(absl::StrCat(f.dashed(), "=", layers::FieldValueString(value)));
  }
  // What the user typed must match: the checkpoint's comparison, naming the
  // flag (the vocabulary is the tokenizer's, compared when the trainer loads).
  layers::GptConfig check = m;
  check.vocab_size = saved.vocab_size;
  LOOM_RETURN_IF_ERROR(checkpoint::CheckModelConfig(manifest->model(), check, *path));
  if (taken.empty()) return std::string();
  return absl::StrCat("model flags from checkpoint ", *path, " (not given on the command line): ",
                      absl::StrJoin(taken, " "));
}

comm::launch::CommFlags CommFlagsFor(const TrainConfig& config) {
  comm::launch::CommFlags f = comm::launch::GetCommFlags();
  f.backend = BackendOf(config);
  f.backend_given = true;
  f.timeout_s = config.distributed_timeout_s;
  return f;
}

}  // namespace loom::train
