#ifndef LOOM_TRAIN_CONFIG_H_
#define LOOM_TRAIN_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "layers/gpt_config.h"
#include "train/lr_schedule.h"
#include "train/optimizer.h"

namespace loom::train {

// Everything a training run is configured by, named after Megatron's flags
// (train/flags.cc maps --flag-names to these fields). Derived fields are
// filled by Finalize().
struct TrainConfig {
  layers::GptConfig model;

  // Parallelism.
  int tensor_model_parallel_size = 1;
  int pipeline_model_parallel_size = 1;
  int num_layers_per_virtual_pipeline_stage = 0;  // 0: no interleaving
  std::string pipeline_schedule = "1f1b";         // gpipe | 1f1b | interleaved
  bool sequence_parallel = false;

  // Batches and iterations.
  int64_t micro_batch_size = 4;
  int64_t global_batch_size = 16;
  int64_t train_iters = 200;

  // Optimisation.
  LrSchedule lr;
  OptimizerConfig optimizer;
  float hidden_dropout = 0.1f;
  float attention_dropout = 0.0f;
  bool overlap_grad_reduce = false;

  // Data.
  std::string data_path;     // prefix of .bin/.idx ("" = default corpus)
  std::string split = "969,30,1";
  std::string tokenizer_type = "ByteLevelTokenizer";
  std::string vocab_file, merge_file;
  std::string data_cache_dir;  // where the default corpus and sample indices go

  // Logging, evaluation, checkpoints.
  int64_t log_interval = 10;
  int64_t eval_interval = 100;
  int64_t eval_iters = 10;
  std::string metrics_file;  // JSON lines ("" = none)
  std::string save, load;
  int64_t save_interval = 0;
  double peak_flops = 0;     // --peak-flops per rank for MFU (0: measure a GEMM at start)
  int64_t sample_tokens = 200;  // generated at the end (0: none)

  // Derived by Finalize().
  int world_size = 1;
  int data_parallel_size = 1;
  int virtual_pipeline_size = 1;
  int64_t num_micro_batches = 1;  // per DP rank per step

  // Placement: --device (cpu | cuda) and --bf16. Finalize sets
  // model.device (CUDA device index chosen later, per rank) and
  // model.compute_dtype from them.
  std::string device = "cpu";
  bool bf16 = false;
};

// Checks every flag combination before any work and fills the derived
// fields. Errors name the flags and the arithmetic, e.g.
// "--global-batch-size (30) is not divisible by --micro-batch-size (4) x
// data-parallel size (2) = 8".
absl::Status Finalize(TrainConfig* config, int world_size);

}  // namespace loom::train

#endif  // LOOM_TRAIN_CONFIG_H_
