#ifndef LOOM_TRAIN_TEST_UTIL_H_
#define LOOM_TRAIN_TEST_UTIL_H_

// Tiny training runs over the `local` backend (ranks are threads), shared by
// the trainer's equivalence test and the checkpoint tests.

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "config/config.h"
#include "train/trainer.h"

namespace loom::train::testing {

struct Layout {
  int tp = 1, pp = 1, dp = 1;
  int vp_layers = 0;  // --num-layers-per-virtual-pipeline-stage
  bool sp = false;
  bool distributed = false;
  std::string schedule = "1f1b";
  bool overlap = false;  // --overlap-grad-reduce
  bool param_gather = false;  // --overlap-param-gather
  int cp = 1;                 // --context-parallel-size
  int ep = 1;                 // --expert-model-parallel-size (within DP)
  // --data-parallel-sharding-strategy=optim_grads (ZeRO-2); with it
  // `distributed` is on as well (OptimGrads() sets both).
  bool shard_grads = false;
  // --data-parallel-sharding-strategy=optim_grads_params (ZeRO-3; with
  // shard_grads and distributed: OptimGradsParams() sets all three).
  bool shard_params = false;
  int world() const { return tp * pp * cp * dp; }
  std::string Describe() const;
};
// `l` under ZeRO-2: the distributed optimizer with sharded gradients.
Layout OptimGrads(Layout l);
// `l` under ZeRO-3: parameters, gradients and optimizer state sharded.
Layout OptimGradsParams(Layout l);

// A small learnable corpus under TEST_TMPDIR (built once per process).
std::string Dataset();

// The tiny model every checkpoint test trains: 4 layers, hidden 32, 4 heads.
train::TrainConfig TinyConfig(const Layout& layout, int64_t train_iters);
// TinyConfig made Llama-style: RMSNorm, RoPE, SwiGLU (ffn 64), 2 query groups
// of the 4 heads, untied output layer, no linear biases.
train::TrainConfig TinyLlamaConfig(const Layout& layout, int64_t train_iters);

struct RunResult {
  absl::Status status;          // the lowest failing rank's ("rank r: ...")
  std::vector<double> losses;   // rank 0's (every step this run took)
  std::vector<std::string> log;  // rank 0's log lines
  double eval_loss = 0;          // rank 0's last validation loss (NaN: none)
};
// Called on every rank (from its thread) with its Trainer.
using TrainerHook = std::function<void(int rank, train::Trainer&)>;
// Called with each of rank 0's log lines as it is logged (from its thread).
using LogHook = std::function<void(const std::string& line)>;
// Creates a Trainer on every rank of a local world (ranks as threads,
// //comm/testing:ranks_as_threads) and runs Train(). A config on a device
// (--device=cuda: the fake device of //core/ops:fake_device in tests) gets
// each rank's communicator staged onto that device
// (//comm/testing:host_staged), so multi-rank device runs move device
// memory through their collectives as they would over NCCL. `after_create` runs
// before Train(), `after_train` after a successful one.
RunResult Run(const train::TrainConfig& config, const Layout& layout,
              TrainerHook after_create = nullptr, TrainerHook after_train = nullptr,
              LogHook on_log = nullptr);

// Expects got[i] within `relative_tolerance` of ref[first + i] for every i
// (a run resumed at iteration `first` against the uninterrupted one), and as
// many losses as ref holds after `first`. `what` names the run in failures.
void ExpectSameCurve(const std::vector<double>& got, const std::vector<double>& ref, size_t first,
                     double relative_tolerance, const std::string& what);

// A run's loss curve, its last step's global gradient norm (rank 0's,
// recomputed from the final gradients: clipping's input) and its last
// validation loss: what the layout-equivalence tests compare with one rank's.
struct Curve {
  std::vector<double> losses;
  double grad_norm = 0;
  double eval_loss = 0;
};
// Run() collecting a Curve; expects the run to succeed (naming the layout).
Curve TrainCurve(const train::TrainConfig& config, const Layout& layout);
// ExpectSameCurve from the first step, and the gradient norm, both within
// `relative_tolerance`.
void ExpectSameCurveAndNorm(const Curve& got, const Curve& want, double relative_tolerance,
                            const std::string& what);

}  // namespace loom::train::testing

#endif  // LOOM_TRAIN_TEST_UTIL_H_
