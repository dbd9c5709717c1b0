// Every //train:gpt flag and its default (listed by --help).
#include "train/gpt_flags.h"

#include "absl/flags/flag.h"

// Model.
ABSL_FLAG(int64_t, num_layers, 4, "Transformer layers");
ABSL_FLAG(int64_t, hidden_size, 256, "Hidden size");
ABSL_FLAG(int64_t, num_attention_heads, 8, "Attention heads");
ABSL_FLAG(int64_t, ffn_hidden_size, 0, "MLP hidden size (0: 4 x hidden)");
ABSL_FLAG(int64_t, seq_length, 128, "Tokens per sample");
ABSL_FLAG(int64_t, max_position_embeddings, 0, "Position table size (0: --seq-length)");
ABSL_FLAG(int64_t, make_vocab_size_divisible_by, 128, "Pad the vocabulary to a multiple of this x TP");
ABSL_FLAG(double, init_method_std, 0.02, "Std of the normal weight init");
ABSL_FLAG(double, hidden_dropout, 0.1, "Dropout after attention/MLP and on embeddings");
ABSL_FLAG(double, attention_dropout, 0.0, "Dropout on attention probabilities");
ABSL_FLAG(int64_t, seed, 1234, "Seed of weights, data order and dropout");
// Parallelism.
ABSL_FLAG(int, tensor_model_parallel_size, 1, "TP degree");
ABSL_FLAG(int, pipeline_model_parallel_size, 1, "PP degree");
ABSL_FLAG(int64_t, num_layers_per_virtual_pipeline_stage, 0,
          "Layers per model chunk for interleaved 1F1B (0: no interleaving)");
ABSL_FLAG(std::string, pipeline_schedule, "1f1b", "gpipe | 1f1b | interleaved");
ABSL_FLAG(bool, sequence_parallel, false, "Sequence parallelism (needs TP > 1)");
ABSL_FLAG(std::string, distributed_backend, "", "local | mpi | ucx | nccl; empty: --backend "
          "(nccl when --device=cuda)");
ABSL_FLAG(std::string, device, "cpu", "cpu | cuda (rank r uses GPU r mod the node's GPU count)");
ABSL_FLAG(bool, bf16, false, "bf16 weights and activations, f32 master weights and gradients "
          "(needs --device=cuda)");
ABSL_FLAG(double, distributed_timeout_minutes, 0, "Collective timeout (0: --comm-timeout-s)");
// Batches and schedule.
ABSL_FLAG(int64_t, micro_batch_size, 4, "Samples per micro-batch");
ABSL_FLAG(int64_t, global_batch_size, 16, "Samples per step over all DP ranks");
ABSL_FLAG(int64_t, train_iters, 1000, "Training steps");
ABSL_FLAG(double, lr, 1e-3, "Peak learning rate");
ABSL_FLAG(double, min_lr, 1e-4, "Final learning rate");
ABSL_FLAG(std::string, lr_decay_style, "cosine", "constant | linear | cosine");
ABSL_FLAG(int64_t, lr_warmup_iters, -1, "Linear warm-up steps (-1: min(20, --train-iters / 10))");
ABSL_FLAG(int64_t, lr_decay_iters, 0, "Decay steps (0: --train-iters)");
ABSL_FLAG(double, weight_decay, 0.01, "AdamW decoupled weight decay (not on biases/LayerNorm)");
ABSL_FLAG(double, clip_grad, 1.0, "Global gradient-norm clip (0: off)");
ABSL_FLAG(double, adam_beta1, 0.9, "Adam beta1");
ABSL_FLAG(double, adam_beta2, 0.95, "Adam beta2");
ABSL_FLAG(double, adam_eps, 1e-8, "Adam epsilon");
ABSL_FLAG(bool, use_distributed_optimizer, false, "ZeRO-1: shard Adam state over DP");
ABSL_FLAG(bool, overlap_grad_reduce, false, "Overlap DP gradient reduction with backward");
// Data.
ABSL_FLAG(std::string, data_path, "", "Dataset prefix (.bin/.idx); empty: the fortunes corpus");
ABSL_FLAG(std::string, split, "969,30,1", "Train/valid/test document split weights");
ABSL_FLAG(std::string, tokenizer_type, "ByteLevelTokenizer", "ByteLevelTokenizer | GPT2BPETokenizer");
ABSL_FLAG(std::string, vocab_file, "", "GPT-2 vocab.json (GPT2BPETokenizer)");
ABSL_FLAG(std::string, merge_file, "", "GPT-2 merges.txt (GPT2BPETokenizer)");
ABSL_FLAG(std::string, data_cache_dir, "", "Preprocessed corpus and sample indices (default ~/.cache/loom)");
// Logging and checkpoints.
ABSL_FLAG(int64_t, log_interval, 50, "Steps between log lines");
ABSL_FLAG(int64_t, eval_interval, 250, "Steps between validation runs (0: never)");
ABSL_FLAG(int64_t, eval_iters, 10, "Batches per validation run");
ABSL_FLAG(std::string, metrics_file, "", "JSON-lines metrics (see //train:plot)");
ABSL_FLAG(double, peak_flops, 0, "Per-rank peak FLOP/s for MFU (0: measure a GEMM at start)");
ABSL_FLAG(int64_t, sample_tokens, 200, "Tokens of text generated at the end (0: none)");
ABSL_FLAG(std::string, save, "", "Checkpoint directory");
ABSL_FLAG(std::string, load, "", "Checkpoint directory to resume from");
ABSL_FLAG(int64_t, save_interval, 0, "Steps between checkpoints (0: only at the end when --save)");
ABSL_FLAG(int64_t, load_iteration, -1, "Iteration to resume from with --load (-1: the one `latest` names)");
ABSL_FLAG(int32_t, keep_last, 0, "Keep only the newest K checkpoints in --save (0: keep all)");
ABSL_FLAG(bool, async_save, false, "Write checkpoints on a background thread from a snapshot");
ABSL_FLAG(bool, no_save_optim, false, "Leave the optimizer state (Adam moments) out of checkpoints");

namespace loom::train {

TrainConfig ConfigFromFlags() {
  TrainConfig c;
  c.model.num_layers = absl::GetFlag(FLAGS_num_layers);
  c.model.hidden_size = absl::GetFlag(FLAGS_hidden_size);
  c.model.num_attention_heads = absl::GetFlag(FLAGS_num_attention_heads);
  c.model.ffn_hidden_size = absl::GetFlag(FLAGS_ffn_hidden_size);
  c.model.seq_length = absl::GetFlag(FLAGS_seq_length);
  c.model.max_position_embeddings = absl::GetFlag(FLAGS_max_position_embeddings);
  c.model.make_vocab_size_divisible_by = absl::GetFlag(FLAGS_make_vocab_size_divisible_by);
  c.model.init_method_std = static_cast<float>(absl::GetFlag(FLAGS_init_method_std));
  c.model.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  c.device = absl::GetFlag(FLAGS_device);
  c.bf16 = absl::GetFlag(FLAGS_bf16);
  c.hidden_dropout = static_cast<float>(absl::GetFlag(FLAGS_hidden_dropout));
  c.attention_dropout = static_cast<float>(absl::GetFlag(FLAGS_attention_dropout));
  c.tensor_model_parallel_size = absl::GetFlag(FLAGS_tensor_model_parallel_size);
  c.pipeline_model_parallel_size = absl::GetFlag(FLAGS_pipeline_model_parallel_size);
  c.num_layers_per_virtual_pipeline_stage = absl::GetFlag(FLAGS_num_layers_per_virtual_pipeline_stage);
  c.pipeline_schedule = absl::GetFlag(FLAGS_pipeline_schedule);
  c.sequence_parallel = absl::GetFlag(FLAGS_sequence_parallel);
  c.micro_batch_size = absl::GetFlag(FLAGS_micro_batch_size);
  c.global_batch_size = absl::GetFlag(FLAGS_global_batch_size);
  c.train_iters = absl::GetFlag(FLAGS_train_iters);
  c.lr.lr = static_cast<float>(absl::GetFlag(FLAGS_lr));
  c.lr.min_lr = static_cast<float>(absl::GetFlag(FLAGS_min_lr));
  c.lr.style = absl::GetFlag(FLAGS_lr_decay_style);
  c.lr.warmup_iters = absl::GetFlag(FLAGS_lr_warmup_iters);
  c.lr.decay_iters = absl::GetFlag(FLAGS_lr_decay_iters);
  c.optimizer.weight_decay = static_cast<float>(absl::GetFlag(FLAGS_weight_decay));
  c.optimizer.clip_grad = static_cast<float>(absl::GetFlag(FLAGS_clip_grad));
  c.optimizer.beta1 = static_cast<float>(absl::GetFlag(FLAGS_adam_beta1));
  c.optimizer.beta2 = static_cast<float>(absl::GetFlag(FLAGS_adam_beta2));
  c.optimizer.eps = static_cast<float>(absl::GetFlag(FLAGS_adam_eps));
  c.optimizer.distributed = absl::GetFlag(FLAGS_use_distributed_optimizer);
  c.overlap_grad_reduce = absl::GetFlag(FLAGS_overlap_grad_reduce);
  c.data_path = absl::GetFlag(FLAGS_data_path);
  c.split = absl::GetFlag(FLAGS_split);
  c.tokenizer_type = absl::GetFlag(FLAGS_tokenizer_type);
  c.vocab_file = absl::GetFlag(FLAGS_vocab_file);
  c.merge_file = absl::GetFlag(FLAGS_merge_file);
  c.data_cache_dir = absl::GetFlag(FLAGS_data_cache_dir);
  c.log_interval = absl::GetFlag(FLAGS_log_interval);
  c.eval_interval = absl::GetFlag(FLAGS_eval_interval);
  c.eval_iters = absl::GetFlag(FLAGS_eval_iters);
  c.metrics_file = absl::GetFlag(FLAGS_metrics_file);
  c.peak_flops = absl::GetFlag(FLAGS_peak_flops);
  c.sample_tokens = absl::GetFlag(FLAGS_sample_tokens);
  c.save = absl::GetFlag(FLAGS_save);
  c.load = absl::GetFlag(FLAGS_load);
  c.save_interval = absl::GetFlag(FLAGS_save_interval);
  return c;
}

std::string BackendFromFlags() { return absl::GetFlag(FLAGS_distributed_backend); }

double TimeoutSecondsFromFlags() { return absl::GetFlag(FLAGS_distributed_timeout_minutes) * 60; }

}  // namespace loom::train
