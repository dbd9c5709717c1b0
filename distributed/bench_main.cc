// bazel run //distributed:bench -- [--nproc-per-node=2] [--backend=ucx] [--steps=3] [--only=NAME]
//
// How much of data parallelism's communication GradientSync hides behind
// computation. Each rank trains its own micro-batches of a GPT (default: 12
// layers, hidden 768, vocab 50257, seq 64, micro-batch 4, 2 micro-batches a
// step) and runs every mode on the same model in one run:
//
//   all-reduce             the DP all-reduce after the backward, then with
//                          --overlap-grad-reduce (buckets reduced during it)
//   ZeRO-1                 reduce-scatter + parameter all-gather, then with
//                          --overlap-grad-reduce, then also with
//                          --overlap-param-gather (gathers during the forward)
//   ZeRO-1, N = DP         hybrid sharding with every rank its own instance
//                          (--num-distributed-optimizer-instances = DP): all
//                          the traffic is the replicas' all-reduce of each
//                          bucket, then with --overlap-grad-reduce (each
//                          bucket's started behind the backward).
//   ZeRO-2                 (--data-parallel-sharding-strategy=optim_grads)
//                          a reduce-scatter per bucket in every micro-batch,
//                          only the owned gradient shard kept; the same three
//                          overlap settings. Last: it takes the model's
//                          gradient buffer away.
//   ZeRO-3                 (optim_grads_params, on a second model built
//                          without parameter or gradient buffers) each
//                          unit's parameters all-gathered before its forward
//                          and its backward; then with --overlap-grad-reduce,
//                          then also --overlap-param-gather (the next unit's
//                          gather prefetched behind the current one's compute),
//                          first within a pass only (as before #37's
//                          prefetch across passes), then across passes too.
//
// Per mode: ms per step, and the DP communication left exposed (the wait for
// the gradients after the last backward, the waits for gathered
// parameters), slowest rank, mean over the timed steps. Hidden = 1 - exposed
// with overlap / exposed without it, in the same run. Gradient MiB: the
// rank's gradient storage after the timed steps (the flat buffer, or under
// ZeRO-2 the shard and the bucket buffers). No optimizer runs: the
// parameters do not change, the traffic is the same.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "comm/launch/flags.h"
#include "comm/launch/run_ranks.h"
#include "core/status_macros.h"
#include "distributed/gradient_sync.h"
#include "layers/test_util.h"
#include "models/gpt/gpt_model.h"

ABSL_FLAG(int64_t, num_layers, 12, "Layers");
ABSL_FLAG(int64_t, hidden_size, 768, "Hidden size");
ABSL_FLAG(int64_t, num_attention_heads, 12, "Heads");
ABSL_FLAG(int64_t, vocab_size, 50257, "Vocabulary");
ABSL_FLAG(int64_t, seq_length, 64, "Sequence length");
ABSL_FLAG(int64_t, micro_batch_size, 4, "Samples per micro-batch");
ABSL_FLAG(int64_t, micro_batches, 2, "Micro-batches per step");
ABSL_FLAG(int64_t, ddp_bucket_size, 4 << 20 >> 2, "Parameters per gradient bucket");
ABSL_FLAG(int, steps, 3, "Timed steps per mode (after one warm-up step)");
ABSL_FLAG(bool, zero3_only, false, "Only the ZeRO-3 modes");
ABSL_FLAG(std::string, only, "",
          "Only the modes whose name contains this (and the baselines they are compared with), "
          "e.g. 'N = DP'");

namespace loom::distributed {
namespace {

using core::Tensor;

struct Mode {
  const char* name;
  bool zero1, overlap_grad, overlap_gather;
  bool zero2 = false;
  bool zero3 = false;
  bool across_passes = true;  // GradientSyncOptions::prefetch_across_passes
  // --num-distributed-optimizer-instances = DP: every rank its own
  // instance, so all the gradient traffic is the replicas' all-reduce.
  bool hybrid = false;
};
constexpr Mode kModes[] = {
    {"all-reduce", false, false, false},
    {"all-reduce + --overlap-grad-reduce", false, true, false},
    {"ZeRO-1", true, false, false},
    {"ZeRO-1 + --overlap-grad-reduce", true, true, false},
    {"ZeRO-1 + both overlaps", true, true, true},
    {"ZeRO-1, N = DP", true, false, false, false, false, true, true},
    {"ZeRO-1 + --overlap-grad-reduce, N = DP", true, true, false, false, false, true, true},
    {"ZeRO-2", true, false, false, true},
    {"ZeRO-2 + --overlap-grad-reduce", true, true, false, true},
    {"ZeRO-2 + both overlaps", true, true, true, true},
    {"ZeRO-3", true, false, false, true, true},
    {"ZeRO-3 + --overlap-grad-reduce", true, true, false, true, true},
    {"ZeRO-3 + both overlaps, prefetch within a pass", true, true, true, true, true, false},
    {"ZeRO-3 + both overlaps, prefetch across passes", true, true, true, true, true},
};
constexpr size_t kFirstZero3 = 10;

struct Timing {
  double step_ms = 0, grad_ms = 0, gather_ms = 0;  // means over the timed steps
  int early = 0;                                    // buckets started during the backward
  int replica_early = 0;  // hybrid: replica all-reduces started during the backward
  size_t buckets = 0;
  double grad_mib = 0;  // gradient storage
  int cold = 0;         // ZeRO-3: units gathered without a prefetch, per step
};

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// The slowest rank's figure (collectives, so every rank reports the same).
absl::StatusOr<double> Slowest(comm::Communicator& world, double x) {
  LOOM_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty({1}, core::DType::kF32));
  t.data<float>()[0] = static_cast<float>(x);
  LOOM_RETURN_IF_ERROR(world.AllReduce(t, comm::ReduceOp::kMax)->Wait());
  return static_cast<double>(t.data<float>()[0]);
}

absl::StatusOr<Timing> RunMode(comm::Communicator& world, layers::GptModel* model,
                               const Mode& mode) {
  GradientSyncGroups groups;
  groups.dp = &world;
  GradientSyncOptions options;
  options.micro_batches = absl::GetFlag(FLAGS_micro_batches);
  options.bucket_bytes = absl::GetFlag(FLAGS_ddp_bucket_size) * 4;
  options.distributed_optimizer = mode.zero1;
  options.overlap_grad_reduce = mode.overlap_grad;
  options.overlap_param_gather = mode.overlap_gather;
  options.shard_gradients = mode.zero2;
  options.shard_params = mode.zero3;
  options.prefetch_across_passes = mode.across_passes;
  if (mode.hybrid) options.instances = world.size();
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<GradientSync> sync,
                        GradientSync::Create(model, groups, options));
  const layers::GptConfig& c = model->config();
  const int steps = absl::GetFlag(FLAGS_steps);
  Timing t;
  t.buckets = sync->buckets().size();
  for (int step = -1; step < steps; ++step) {  // step -1: warm-up
    const auto start = std::chrono::steady_clock::now();
    LOOM_RETURN_IF_ERROR(sync->StartStep());
    for (int64_t m = 0; m < options.micro_batches; ++m) {
      Tensor ids = layers::testing::RandomIds(c.seq_length, absl::GetFlag(FLAGS_micro_batch_size),
                                              c.vocab_size, 1000 * world.rank() + m);
      layers::GptModel::Saved saved;
      double loss;
      LOOM_RETURN_IF_ERROR(model->Forward(0, ids, ids, {}, &saved, &loss).status());
      LOOM_RETURN_IF_ERROR(
          model->Backward(0, Tensor(), 1.0f / options.micro_batches, {}, saved).status());
    }
    LOOM_RETURN_IF_ERROR(sync->FinishGradients());
    // ZeRO-3: the waits for each unit's gather during this step's forwards
    // and backwards (StartParamGather gathers nothing and resets the figure).
    const double zero3_gather_s = sync->exposed_gather_seconds();
    t.cold = sync->cold_gathers();
    // This step's forwards waited for the gathers the last step started
    // (overlapped); without overlap, StartParamGather below waits itself.
    double gather_s = mode.overlap_gather ? sync->exposed_gather_seconds() : 0;
    LOOM_RETURN_IF_ERROR(sync->StartParamGather());
    if (!mode.overlap_gather) gather_s = sync->exposed_gather_seconds();
    if (mode.zero3) gather_s = zero3_gather_s;
    const double step_s = Seconds(start);
    if (step < 0) continue;
    t.step_ms += 1e3 * step_s / steps;
    t.grad_ms += 1e3 * sync->exposed_grad_seconds() / steps;
    t.gather_ms += 1e3 * gather_s / steps;
    t.early += sync->buckets_started_early();
    t.replica_early += sync->replica_reductions_started_early();
  }
  LOOM_RETURN_IF_ERROR(sync->FinishParamGather());
  t.grad_mib = (mode.zero2 ? 4 * sync->owned_numel() + sync->grad_buffer_bytes()
                           : 4 * model->params().padded_numel()) /
               (1024.0 * 1024.0);
  LOOM_ASSIGN_OR_RETURN(t.step_ms, Slowest(world, t.step_ms));
  LOOM_ASSIGN_OR_RETURN(t.grad_ms, Slowest(world, t.grad_ms));
  LOOM_ASSIGN_OR_RETURN(t.gather_ms, Slowest(world, t.gather_ms));
  return t;
}

// The baseline of mode i: the same reduction without any overlap.
size_t BaselineOf(size_t i) {
  const Mode& m = kModes[i];
  size_t b = 0;
  while (kModes[b].zero1 != m.zero1 || kModes[b].zero2 != m.zero2 ||
         kModes[b].zero3 != m.zero3 || kModes[b].hybrid != m.hybrid || kModes[b].overlap_grad ||
         kModes[b].overlap_gather) {
    ++b;
  }
  return b;
}

std::string Hidden(double exposed, double baseline) {
  if (baseline <= 0) return "-";
  return absl::StrFormat("%.0f%%", 100.0 * (1.0 - exposed / baseline));
}

absl::Status RunRank(comm::Communicator& world) {
  layers::GptConfig c;
  c.num_layers = absl::GetFlag(FLAGS_num_layers);
  c.hidden_size = absl::GetFlag(FLAGS_hidden_size);
  c.num_attention_heads = absl::GetFlag(FLAGS_num_attention_heads);
  c.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  c.seq_length = absl::GetFlag(FLAGS_seq_length);
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<layers::GptModel> model,
                        layers::GptModel::Create(c, layers::TpGroup{}, {{0, c.num_layers, true, true}},
                                                 /*buffer_multiple=*/world.size()));
  // Which modes run: the selected ones and their baselines.
  std::vector<bool> runs(std::size(kModes), false);
  for (size_t i = 0; i < std::size(kModes); ++i) {
    if (absl::GetFlag(FLAGS_zero3_only) && i < kFirstZero3) continue;
    if (!absl::StrContains(kModes[i].name, absl::GetFlag(FLAGS_only))) continue;
    runs[i] = runs[BaselineOf(i)] = true;
  }
  std::vector<Timing> timings(std::size(kModes));
  for (size_t i = 0; i < kFirstZero3; ++i) {
    if (!runs[i]) continue;
    LOOM_ASSIGN_OR_RETURN(timings[i], RunMode(world, model.get(), kModes[i]));
  }
  // ZeRO-3 takes a model with no parameter (or gradient) buffer.
  model.reset();
  layers::GptConfig c3 = c;
  c3.allocate_gradients = c3.allocate_parameters = false;
  LOOM_ASSIGN_OR_RETURN(model,
                        layers::GptModel::Create(c3, layers::TpGroup{}, {{0, c.num_layers, true, true}},
                                                 /*buffer_multiple=*/world.size()));
  for (size_t i = kFirstZero3; i < std::size(kModes); ++i) {
    if (!runs[i]) continue;
    LOOM_ASSIGN_OR_RETURN(timings[i], RunMode(world, model.get(), kModes[i]));
  }
  if (world.rank() != 0) return absl::OkStatus();
  std::printf("DP %d over %s; GPT %lld layers, hidden %lld, vocab %lld, seq %lld, %lld x %lld "
              "samples a step per rank; %.1fM parameters (padded), buckets of <= %lld parameters\n",
              world.size(), world.backend_name(), static_cast<long long>(c.num_layers),
              static_cast<long long>(c.hidden_size), static_cast<long long>(c.vocab_size),
              static_cast<long long>(c.seq_length),
              static_cast<long long>(absl::GetFlag(FLAGS_micro_batches)),
              static_cast<long long>(absl::GetFlag(FLAGS_micro_batch_size)),
              model->params().padded_numel() / 1e6,
              static_cast<long long>(absl::GetFlag(FLAGS_ddp_bucket_size)));
  std::printf("| mode | buckets | ms/step | exposed grad ms | exposed gather ms | grad hidden | "
              "gather hidden | gradient MiB | cold gathers/step |\n"
              "|---|---|---|---|---|---|---|---|---|\n");
  const int steps = absl::GetFlag(FLAGS_steps);
  for (size_t i = 0; i < timings.size(); ++i) {
    if (!runs[i]) continue;
    const Timing& t = timings[i];
    const Mode& m = kModes[i];
    const Timing& base = timings[BaselineOf(i)];
    const std::string early =
        m.hybrid ? absl::StrFormat("%d early, %d to the replicas early", t.early / std::max(steps, 1),
                                   t.replica_early / std::max(steps, 1))
                 : absl::StrFormat("%d early", t.early / std::max(steps, 1));
    std::printf("| %s | %zu (%s) | %.1f | %.1f | %.1f | %s | %s | %.1f | %s |\n", m.name,
                t.buckets, early.c_str(), t.step_ms, t.grad_ms, t.gather_ms,
                m.overlap_grad ? Hidden(t.grad_ms, base.grad_ms).c_str() : "-",
                m.overlap_gather ? Hidden(t.gather_ms, base.gather_ms).c_str() : "-", t.grad_mib,
                m.zero3 ? absl::StrFormat("%d", t.cold).c_str() : "-");
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  comm::launch::ParseFlags(argc, argv, "bazel run //distributed:bench -- [--nproc-per-node=2]");
  comm::launch::CommFlags flags = comm::launch::GetCommFlags();
  if (!flags.backend_given) flags.backend = "ucx";
  comm::launch::RunRanksOptions options;
  options.default_nproc_per_node = 2;
  comm::launch::RanksOutcome out = comm::launch::RunRanks(
      flags, options, argc, argv,
      [](comm::Communicator& world, const comm::launch::RankContext&) { return RunRank(world); });
  if (!out.status.ok()) {
    std::fprintf(stderr, "bench: %s\n", std::string(out.status.message()).c_str());
  }
  return out.ExitCode();
}

}  // namespace
}  // namespace loom::distributed

int main(int argc, char** argv) { return loom::distributed::Main(argc, argv); }
