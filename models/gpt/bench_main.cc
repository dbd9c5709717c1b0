// bazel run //models/gpt:bench -- [--backend=ucx|mpi] [--hidden-size=768 ...]
//
// One transformer layer, forward + backward, at TP = 1 (one process) and
// TP = 2 (two processes through the launcher). For TP = 2 it separates
// compute (the same layer over a communicator that moves nothing), the
// communication alone (the layer's collectives on their own), and the
// overlap between them; GFLOP/s are set against a GEMM measured in the
// same run on the same processes.
//
// --tp-comm-overlap (with --sequence-parallel): instead, TP = 2 + SP only,
// the layer with and without the linear layers' ring overlap
// (layers/tp_overlap.h) in alternating repetitions, each against its own
// compute alone (the null communicator: the ring's path pays its GEMMs in
// p blocks there too) and its own communication alone, and the hidden
// fraction of that communication.
//
// --expert-model-parallel-size=EP (> 1, with --num-experts): instead, the MoE
// layer alone (router, dispatch, experts, combine) forward + backward over EP
// ranks as threads of this process (the `local` backend, cores/EP threads
// each), each rank with E/EP experts and its own s·b tokens: the layer's
// time, its all-to-alls' (MoeCommStats: counts exchange, dispatch and
// combine, forward and backward), the rest (expert compute, routing, gathers)
// and the share of the all-to-alls hidden behind computation.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "comm/launch/flags.h"
#include "comm/launch/run_ranks.h"
#include "core/bench_util/bench_util.h"
#include "core/cpu/matmul.h"
#include "core/status_macros.h"
#include "layers/tp_overlap.h"
#include "models/gpt/gpt_config.h"
#include "models/gpt/moe_block.h"
#include "models/gpt/test_util.h"
#include "models/gpt/transformer_block.h"

ABSL_DECLARE_FLAG(int, nproc_per_node);
ABSL_DECLARE_FLAG(std::string, backend);

ABSL_FLAG(int64_t, hidden_size, 768, "Hidden size");
ABSL_FLAG(int64_t, num_attention_heads, 12, "Heads");
ABSL_FLAG(int64_t, seq_length, 1024, "Sequence length");
ABSL_FLAG(int64_t, micro_batch_size, 1, "Micro-batch size");
ABSL_FLAG(int, reps, 5, "Timed repetitions (median reported)");
ABSL_FLAG(bool, sequence_parallel, false, "Measure TP = 2 with sequence parallelism");
ABSL_FLAG(bool, tp_comm_overlap, false,
          "With --sequence-parallel: time TP = 2 + SP with and without --tp-comm-overlap (the "
          "linear layers' all-gathers and reduce-scatters pipelined with their GEMMs), same run, "
          "and the hidden fraction of TP communication of each");
ABSL_FLAG(int64_t, num_experts, 0, "An MoE layer of this many experts (0: a dense MLP)");
ABSL_FLAG(int64_t, moe_router_topk, 2, "Experts per token of the MoE layer");
ABSL_FLAG(int, expert_model_parallel_size, 1,
          "EP > 1: time the MoE layer alone over EP ranks as threads (the local backend), "
          "with its all-to-all time and hidden fraction, instead of TP = 1 and 2");

namespace {

using loom::core::Tensor;
namespace comm = loom::comm;

// A communicator that moves nothing: the compute-only baseline of a TP
// layout. Collectives leave their outputs as they are.
class NullCommunicator : public comm::Communicator {
 public:
  NullCommunicator(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  loom::core::Device device() const override { return loom::core::Device::CPU(); }
  const std::string& group_name() const override { return name_; }
  const char* backend_name() const override { return "null"; }
  comm::WorkPtr AllReduce(const Tensor&, const Tensor&, comm::ReduceOp) override { return Done(); }
  comm::WorkPtr Broadcast(const Tensor&, const Tensor&, int) override { return Done(); }
  comm::WorkPtr Reduce(const Tensor&, const Tensor&, comm::ReduceOp, int) override { return Done(); }
  comm::WorkPtr AllGather(const Tensor&, const Tensor&) override { return Done(); }
  comm::WorkPtr ReduceScatter(const Tensor&, const Tensor&, comm::ReduceOp) override { return Done(); }
  comm::WorkPtr AllToAll(const Tensor&, const Tensor&) override { return Done(); }
  comm::WorkPtr AllToAllV(const Tensor&, const std::vector<int64_t>&, const Tensor&,
                          const std::vector<int64_t>&) override {
    return Done();
  }
  comm::WorkPtr Send(const Tensor&, int, int) override { return Done(); }
  comm::WorkPtr Recv(const Tensor&, int, int) override { return Done(); }
  comm::WorkPtr BatchSendRecv(const std::vector<comm::P2POp>&) override { return Done(); }
  comm::WorkPtr Barrier() override { return Done(); }
  comm::WorkPtr BarrierWithin(absl::Duration) override { return Done(); }
  absl::StatusOr<std::unique_ptr<comm::Communicator>> Split(int, int, const std::string&) override {
    return absl::UnimplementedError("NullCommunicator::Split");
  }

 private:
  static comm::WorkPtr Done() { return comm::CompletedWork(absl::OkStatus(), "null"); }
  int rank_, size_;
  std::string name_ = "null";
};

double MedianMs(int reps, const std::function<void()>& fn) {
  fn();  // warm-up
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(loom::core::bench::MillisecondsSince(t0));
  }
  return loom::core::bench::Median(std::move(ms));
}

double GemmGflops() {
  const int64_t n = 1024;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  const double ms = MedianMs(5, [&] {
    (void)loom::core::cpu::Sgemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                                 c.data(), n);
  });
  return 2.0 * n * n * n / (ms * 1e6);
}

struct Layer {
  loom::layers::ParamBuffer params;
  std::unique_ptr<loom::layers::TransformerBlock> block;
};

Layer MakeLayer(const loom::layers::GptConfig& c, loom::layers::TpGroup tp) {
  Layer l;
  l.params = *loom::layers::ParamBuffer::Create(loom::layers::BlockParamSpecs(c, 0), tp.rank(),
                                                tp.size(), c.seed);
  l.block = std::make_unique<loom::layers::TransformerBlock>(&l.params, c, 0, tp);
  return l;
}

void FwdBwd(const Layer& l, const Tensor& x) {
  loom::layers::TransformerBlock::Saved saved;
  loom::layers::DropoutStream d;
  auto y = l.block->Forward(x, d, &saved);
  if (!y.ok()) std::abort();
  if (!l.block->Backward(*y, d, saved).ok()) std::abort();
}

// The MoE layer alone under expert parallelism (see the top of the file).
int ExpertParallelBench(int ep) {
  namespace layers = loom::layers;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  layers::GptConfig c;
  c.hidden_size = absl::GetFlag(FLAGS_hidden_size);
  c.num_attention_heads = absl::GetFlag(FLAGS_num_attention_heads);
  c.seq_length = absl::GetFlag(FLAGS_seq_length);
  c.num_experts = absl::GetFlag(FLAGS_num_experts);
  c.moe_router_topk = absl::GetFlag(FLAGS_moe_router_topk);
  c.add_bias_linear = false;
  const int64_t s = c.seq_length, b = absl::GetFlag(FLAGS_micro_batch_size), h = c.hidden_size;
  const int64_t E = c.num_experts;
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  if (E <= 0 || E % ep != 0) {
    std::fprintf(stderr,
                 "bench: --expert-model-parallel-size=%d needs --num-experts a multiple "
                 "of it (got %lld)\n",
                 ep, (long long)E);
    return 1;
  }
  const int threads = std::max(1, cores / ep);
  using loom::core::bench::Median;

  // The reference: EP = 1, every expert, rank 0's tokens, with an EP rank's
  // threads: the same rows through the experts' GEMMs as each EP rank's
  // (K per token, all of them here), without the all-to-alls.
  omp_set_num_threads(threads);
  double ep1_ms = 0;
  int64_t ep1_rows = 0;
  {
    layers::ParamBuffer params =
        *layers::ParamBuffer::Create(layers::BlockParamSpecs(c, 0), 0, 1, c.seed);
    const layers::MoeMlp moe = layers::MoeMlpForLayer(&params, c, 0, {}, {});
    const Tensor x = layers::testing::RandomTensor(loom::core::Shape{s, b, h}, 1);
    ep1_ms = MedianMs(reps, [&] {
      layers::MoeMlp::Saved saved;
      auto y = moe.Forward(x, &saved);
      if (!y.ok() || !moe.Backward(*y, 1.0f, saved).ok()) std::abort();
      ep1_rows = saved.expert_in.dim(0);
    });
  }

  // EP ranks as threads: per rep (after one warm-up), the layer's time and
  // its all-to-alls' (a barrier first, so the ranks start together).
  struct RankTimes {
    std::vector<double> layer, span, forward, backward, blocked, rest, hidden;
    int64_t rows = 0;
  };
  std::vector<RankTimes> times(ep);
  absl::Status status =
      layers::testing::RunRanks(ep, [&](int rank, comm::Communicator* world) -> absl::Status {
        omp_set_num_threads(threads);
        const layers::EpGroup group{world};
        LOOM_ASSIGN_OR_RETURN(layers::ParamBuffer params,
                              layers::ParamBuffer::Create(
                                  layers::BlockParamSpecs(c, 0, group.shard()), 0, 1, c.seed));
        layers::MoeMlp moe = layers::MoeMlpForLayer(&params, c, 0, {}, group);
        layers::MoeCommStats stats;
        moe.set_comm_stats(&stats);
        const Tensor x = layers::testing::RandomTensor(loom::core::Shape{s, b, h}, 1 + rank);
        RankTimes& t = times[rank];
        for (int i = 0; i <= reps; ++i) {
          LOOM_RETURN_IF_ERROR(world->Barrier()->Wait());
          stats = {};
          layers::MoeMlp::Saved saved;
          const auto t0 = std::chrono::steady_clock::now();
          LOOM_ASSIGN_OR_RETURN(Tensor y, moe.Forward(x, &saved));
          LOOM_ASSIGN_OR_RETURN(Tensor dx, moe.Backward(y, 1.0f, saved));
          const double ms = loom::core::bench::MillisecondsSince(t0);
          t.rows = saved.expert_in.dim(0);
          if (i == 0) continue;  // warm-up
          t.layer.push_back(ms);
          t.span.push_back(stats.forward_ms + stats.backward_ms);
          t.forward.push_back(stats.forward_ms);
          t.backward.push_back(stats.backward_ms);
          t.blocked.push_back(stats.blocked_ms);
          t.rest.push_back(ms - stats.blocked_ms);
          t.hidden.push_back(stats.hidden_fraction());
        }
        return absl::OkStatus();
      });
  if (!status.ok()) {
    std::fprintf(stderr, "bench: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  std::printf(
      "MoE layer alone fwd+bwd (router, dispatch, experts, combine): s=%lld b=%lld "
      "h=%lld, %lld experts top-%lld, per rank's tokens; EP=%d as threads over the "
      "local backend, %d thread(s) per rank; median of %d after a warm-up\n",
      (long long)s, (long long)b, (long long)h, (long long)E, (long long)c.moe_router_topk, ep,
      threads, reps);
  std::printf(
      "| layout | rows at its experts | layer ms | all-to-all ms (fwd + bwd, issue to "
      "completion) | blocked on all-to-all ms | compute and rest ms | hidden fraction "
      "|\n|---|---|---|---|---|---|---|\n");
  std::printf(
      "| EP=1 (%lld experts, %d thread(s), rank 0's tokens) | %lld | %.1f | 0 | 0 | %.1f "
      "| - |\n",
      (long long)E, threads, (long long)ep1_rows, ep1_ms, ep1_ms);
  for (int r = 0; r < ep; ++r) {
    const RankTimes& t = times[r];
    std::printf(
        "| EP=%d rank %d (%lld experts, %d thread(s)) | %lld | %.1f | %.2f (%.2f + %.2f) "
        "| %.2f | %.1f | %.2f |\n",
        ep, r, (long long)(E / ep), threads, (long long)t.rows, Median(t.layer), Median(t.span),
        Median(t.forward), Median(t.backward), Median(t.blocked), Median(t.rest), Median(t.hidden));
  }
  std::printf(
      "hidden fraction = 1 - blocked / issue-to-completion; the layer waits on each "
      "all-to-all as soon as it issues it, so nothing is hidden. The all-to-all times "
      "include waiting for the other ranks to arrive (load imbalance).\n");
  return 0;
}

// TP = 1 on rank 0, then TP = 2 over `tp_comm` (2 ranks).
absl::Status TpBench(comm::Communicator& tp_comm) {
  if (tp_comm.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "needs 2 ranks (--nproc-per-node=2), not ", tp_comm.size()));
  }
  const int rank = tp_comm.rank();
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  loom::layers::GptConfig c;
  c.hidden_size = absl::GetFlag(FLAGS_hidden_size);
  c.num_attention_heads = absl::GetFlag(FLAGS_num_attention_heads);
  c.seq_length = absl::GetFlag(FLAGS_seq_length);
  const int64_t s = c.seq_length, b = absl::GetFlag(FLAGS_micro_batch_size), h = c.hidden_size;
  const bool sp = absl::GetFlag(FLAGS_sequence_parallel);
  const int reps = absl::GetFlag(FLAGS_reps);
  // An MoE layer: no biases, every token through K experts' MLPs (8h² each,
  // x6 for forward + backward) and the router (E·h).
  const int64_t experts = absl::GetFlag(FLAGS_num_experts);
  const int64_t topk = absl::GetFlag(FLAGS_moe_router_topk);
  if (experts > 0) {
    c.num_experts = experts;
    c.moe_router_topk = topk;
    c.add_bias_linear = false;
  }
  // Forward + backward FLOPs of one layer (docs/PARALLELISM.md's MFU terms).
  const double mlp = experts > 0 ? 48.0 * h * h * topk + 6.0 * experts * h : 48.0 * h * h;
  const double flops = (24.0 * h * h + mlp + 12.0 * h * s) * s * b;

  // TP = 1: rank 0 alone, with every core.
  double tp1_ms = 0, gemm1 = 0;
  if (rank == 0) {
    omp_set_num_threads(cores);
    gemm1 = GemmGflops();
    Layer l = MakeLayer(c, {});
    Tensor x = loom::layers::testing::RandomTensor(loom::core::Shape{s, b, h}, 1);
    tp1_ms = MedianMs(reps, [&] { FwdBwd(l, x); });
    if (experts > 0) {  // the same layer with --moe-grouped-gemm, alternating with the loop
      loom::layers::GptConfig g = c;
      g.moe_grouped_gemm = true;
      Layer grouped = MakeLayer(g, {});
      std::vector<double> loop_ms, grouped_ms;
      for (int i = 0; i < reps; ++i) {
        loop_ms.push_back(MedianMs(1, [&] { FwdBwd(l, x); }));
        grouped_ms.push_back(MedianMs(1, [&] { FwdBwd(grouped, x); }));
      }
      std::sort(loop_ms.begin(), loop_ms.end());
      std::sort(grouped_ms.begin(), grouped_ms.end());
      std::printf("MoE layer (%lld experts, top-%lld), TP=1, %d threads: experts one after the "
                  "other %.1f ms, side by side (--moe-grouped-gemm) %.1f ms: %.2fx\n",
                  (long long)experts, (long long)topk, cores, loop_ms[reps / 2],
                  grouped_ms[reps / 2], loop_ms[reps / 2] / grouped_ms[reps / 2]);
    }
  }
  // The idle rank waits without spinning, so rank 0's TP = 1 run has every core.
  comm::WorkPtr done = tp_comm.Barrier();
  while (!done->Poll()) std::this_thread::sleep_for(std::chrono::milliseconds(2));

  // TP = 2: one process per half of the cores.
  omp_set_num_threads(std::max(1, cores / 2));
  const double gemm2 = GemmGflops();  // per rank, both ranks at once
  (void)tp_comm.Barrier()->Wait();
  const int64_t s_local = sp ? s / 2 : s;
  Tensor x = loom::layers::testing::RandomTensor(loom::core::Shape{s_local, b, h}, 1);
  Layer real = MakeLayer(c, {&tp_comm, sp});
  const double total_ms = MedianMs(reps, [&] { FwdBwd(real, x); });
  NullCommunicator null_comm(rank, 2);
  Layer compute_only = MakeLayer(c, {&null_comm, sp});
  const double compute_ms = MedianMs(reps, [&] { FwdBwd(compute_only, x); });
  (void)tp_comm.Barrier()->Wait();
  // The layer's collectives alone: 2 all-reduces of [s, b, h] forward and 2
  // backward (SP: the same bytes as all-gather / reduce-scatter pairs).
  Tensor full = loom::layers::testing::RandomTensor(loom::core::Shape{s, b, h}, 2);
  Tensor part = loom::layers::testing::RandomTensor(loom::core::Shape{s / 2, b, h}, 3);
  const double comm_ms = MedianMs(reps, [&] {
    for (int i = 0; i < 4; ++i) {
      if (sp) {
        (void)tp_comm.AllGather(part, full)->Wait();
        (void)tp_comm.ReduceScatter(full, part, comm::ReduceOp::kSum)->Wait();
      } else {
        (void)tp_comm.AllReduce(full, comm::ReduceOp::kSum)->Wait();
      }
    }
  });
  if (rank == 0) {
    const double hidden = std::max(0.0, compute_ms + comm_ms - total_ms);
    std::printf("One transformer layer fwd+bwd: s=%lld b=%lld h=%lld heads=%lld%s, %.2f GFLOP, "
                "backend %s%s\n",
                (long long)s, (long long)b, (long long)h, (long long)c.num_attention_heads,
                experts > 0 ? (", MoE " + std::to_string(experts) + " experts top-" +
                               std::to_string(topk)).c_str()
                            : "",
                flops / 1e9, tp_comm.backend_name(), sp ? ", sequence parallel" : "");
    std::printf("| layout | time ms | compute ms | comm ms | overlap (comm hidden) | GFLOP/s | "
                "GEMM GFLOP/s (same run) | ratio |\n|---|---|---|---|---|---|---|---|\n");
    std::printf("| TP=1 (1 process, %d threads) | %.1f | %.1f | 0 | - | %.1f | %.1f | %.2f |\n",
                cores, tp1_ms, tp1_ms, flops / (tp1_ms * 1e6), gemm1,
                flops / (tp1_ms * 1e6) / gemm1);
    std::printf("| TP=2 (2 processes) | %.1f | %.1f | %.1f | %.0f%% | %.1f | %.1f (2 ranks) | "
                "%.2f |\n",
                total_ms, compute_ms, comm_ms, comm_ms > 0 ? 100.0 * hidden / comm_ms : 0.0,
                flops / (total_ms * 1e6), 2 * gemm2, flops / (total_ms * 1e6) / (2 * gemm2));
  }
  return absl::OkStatus();
}


// --tp-comm-overlap: TP = 2 + SP over `tp_comm` with and without the ring
// (see the top of the file). One layer's TP communication with SP: forward
// all-gathers X before QKV and FC1 and reduce-scatters after the projection
// and FC2; backward all-gathers dY before the projection's and FC2's dgrad,
// re-gathers the inputs of QKV and FC1 for their weight gradients and
// reduce-scatters their dX: 6 all-gathers and 4 reduce-scatters of [s, b, h].
// The ring replaces 4 and 4 of them (the re-gathers stay one collective
// each, overlapped with dgrad as before).
absl::Status TpOverlapBench(comm::Communicator& tp_comm) {
  namespace layers = loom::layers;
  if (tp_comm.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("needs 2 ranks (--nproc-per-node=2), not ", tp_comm.size()));
  }
  const int rank = tp_comm.rank();
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  layers::GptConfig c;
  c.hidden_size = absl::GetFlag(FLAGS_hidden_size);
  c.num_attention_heads = absl::GetFlag(FLAGS_num_attention_heads);
  c.seq_length = absl::GetFlag(FLAGS_seq_length);
  const int64_t s = c.seq_length, b = absl::GetFlag(FLAGS_micro_batch_size), h = c.hidden_size;
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  omp_set_num_threads(std::max(1, cores / 2));
  const Tensor x = layers::testing::RandomTensor(loom::core::Shape{s / 2, b, h}, 1);
  NullCommunicator null_comm(rank, 2);
  layers::TpCommStats plain_stats, ring_stats;
  const layers::TpGroup plain{&tp_comm, true, false, &plain_stats};
  const layers::TpGroup ring{&tp_comm, true, true, &ring_stats};
  Layer plain_layer = MakeLayer(c, plain), ring_layer = MakeLayer(c, ring);
  Layer plain_compute = MakeLayer(c, {&null_comm, true, false});
  Layer ring_compute = MakeLayer(c, {&null_comm, true, true});
  // First the numbers over these real processes: one step of each path from
  // the same weights (the grads are zero until now), output, input gradient
  // and every weight gradient (max relative error over the tensor).
  double diff[3] = {0, 0, 0};
  {
    using layers::testing::MaxRelativeError;
    using layers::testing::ToVector;
    layers::DropoutStream d;
    layers::TransformerBlock::Saved ps, rs;
    LOOM_ASSIGN_OR_RETURN(const Tensor py, plain_layer.block->Forward(x, d, &ps));
    LOOM_ASSIGN_OR_RETURN(const Tensor ry, ring_layer.block->Forward(x, d, &rs));
    LOOM_ASSIGN_OR_RETURN(const Tensor pdx, plain_layer.block->Backward(py, d, ps));
    LOOM_ASSIGN_OR_RETURN(const Tensor rdx, ring_layer.block->Backward(ry, d, rs));
    diff[0] = MaxRelativeError(ToVector(ry), ToVector(py));
    diff[1] = MaxRelativeError(ToVector(rdx), ToVector(pdx));
    const std::vector<layers::Param>& pp = plain_layer.params.params();
    const std::vector<layers::Param>& rp = ring_layer.params.params();
    for (size_t i = 0; i < pp.size(); ++i) {
      diff[2] = std::max(diff[2], MaxRelativeError(ToVector(rp[i].grad), ToVector(pp[i].grad)));
    }
  }
  LOOM_ASSIGN_OR_RETURN(Tensor full, Tensor::Empty(loom::core::Shape{s, b, h},
                                                   loom::core::DType::kF32));
  LOOM_ASSIGN_OR_RETURN(Tensor part, Tensor::Empty(loom::core::Shape{s / 2, b, h},
                                                   loom::core::DType::kF32));
  auto check = [](absl::Status st) {
    if (!st.ok()) {
      std::fprintf(stderr, "bench: %s\n", std::string(st.message()).c_str());
      std::abort();
    }
  };
  const layers::BlockFn nothing = [](int, const Tensor&) { return absl::OkStatus(); };
  // Each path's communication alone, in the layer's sizes and numbers.
  auto plain_comm = [&] {
    for (int i = 0; i < 6; ++i) check(tp_comm.AllGather(part, full)->Wait());
    for (int i = 0; i < 4; ++i) check(tp_comm.ReduceScatter(full, part, comm::ReduceOp::kSum)->Wait());
  };
  auto ring_comm = [&] {
    for (int i = 0; i < 2; ++i) check(tp_comm.AllGather(part, full)->Wait());
    Tensor gathered;
    for (int i = 0; i < 4; ++i) check(layers::RingAllGatherSeq(ring, part, &gathered, nothing));
    for (int i = 0; i < 4; ++i) {
      check(layers::RingReduceScatterSeq(ring, part.shape(), part, nothing).status());
    }
  };
  const std::vector<std::pair<const char*, std::function<void()>>> runs = {
      {"plain step", [&] { FwdBwd(plain_layer, x); }},
      {"plain compute", [&] { FwdBwd(plain_compute, x); }},
      {"plain comm", plain_comm},
      {"ring step", [&] { FwdBwd(ring_layer, x); }},
      {"ring compute", [&] { FwdBwd(ring_compute, x); }},
      {"ring comm", ring_comm},
  };
  // Alternating repetitions (after one warm-up of each), the ranks starting
  // each run together, so a load change on the machine hits both paths.
  // The steps also count the time the rank sat blocked in TP waits.
  std::vector<std::vector<double>> ms(runs.size());
  std::vector<double> blocked[2];
  for (int i = 0; i <= reps; ++i) {
    for (size_t j = 0; j < runs.size(); ++j) {
      LOOM_RETURN_IF_ERROR(tp_comm.Barrier()->Wait());
      plain_stats = ring_stats = {};
      const auto t0 = std::chrono::steady_clock::now();
      runs[j].second();
      if (i == 0) continue;
      ms[j].push_back(loom::core::bench::MillisecondsSince(t0));
      if (j == 0) blocked[0].push_back(plain_stats.blocked_ms);
      if (j == 3) blocked[1].push_back(ring_stats.blocked_ms);
    }
  }
  if (rank != 0) return absl::OkStatus();
  using loom::core::bench::Median;
  std::printf("One transformer layer fwd+bwd: s=%lld b=%lld h=%lld heads=%lld, TP=2 + SP, "
              "backend %s, %d thread(s) per rank; median of %d alternating reps after a "
              "warm-up\n",
              (long long)s, (long long)b, (long long)h, (long long)c.num_attention_heads,
              tp_comm.backend_name(), std::max(1, cores / 2), reps);
  std::printf("ring vs plain, one step over %s: max relative difference of the output %.1e, "
              "the input gradient %.1e, the weight gradients %.1e (rank 0)\n",
              tp_comm.backend_name(), diff[0], diff[1], diff[2]);
  std::printf("| TP communication | step ms | compute alone ms | comm alone ms | blocked on "
              "TP comm ms | hidden fraction | hidden fraction by times |\n"
              "|---|---|---|---|---|---|---|\n");
  const char* names[] = {"collectives (plain)", "ring (--tp-comm-overlap)"};
  double step[2];
  for (int k = 0; k < 2; ++k) {
    step[k] = Median(ms[3 * k]);
    const double compute = Median(ms[3 * k + 1]), comm_ms = Median(ms[3 * k + 2]);
    const double waited = Median(blocked[k]);
    std::printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", names[k], step[k], compute,
                comm_ms, waited, comm_ms > 0 ? 1.0 - waited / comm_ms : 0.0,
                comm_ms > 0 ? (comm_ms + compute - step[k]) / comm_ms : 0.0);
  }
  const double fastest[2] = {*std::min_element(ms[0].begin(), ms[0].end()),
                             *std::min_element(ms[3].begin(), ms[3].end())};
  std::printf("step with overlap / without: %.3f median, %.3f fastest of each (%.2f / %.2f ms; "
              "< 1: the overlap pays); chunking's own cost (ring compute alone - plain compute "
              "alone, medians): %+.2f ms\n",
              step[1] / step[0], fastest[1] / fastest[0], fastest[1], fastest[0],
              Median(ms[4]) - Median(ms[1]));
  std::printf("hidden fraction = 1 - blocked / comm alone: blocked = the step's host time in "
              "TP waits (layers/mappings.h WaitTp; includes waiting for the other rank to "
              "arrive), comm alone = the path's communication timed on its own: 6 all-gathers "
              "and 4 reduce-scatters of [s, b, h] (the ring: 2 all-gathers and 4 + 4 ring "
              "passes with the reduce-scatters' additions). By times = (comm alone + compute "
              "alone - step) / comm alone, compute alone = the same layer over a communicator "
              "that moves nothing: the issue's definition, but a difference of two compute "
              "times, so machine noise larger than the communication swamps it\n");
  return absl::OkStatus();
}
}  // namespace

int main(int argc, char** argv) {
  absl::SetFlag(&FLAGS_nproc_per_node, 2);
  absl::SetFlag(&FLAGS_backend, "ucx");
  comm::launch::ParseFlags(argc, argv, "Times one transformer layer at TP = 1 and TP = 2.");
  if (absl::GetFlag(FLAGS_tp_comm_overlap) && !absl::GetFlag(FLAGS_sequence_parallel)) {
    std::fprintf(stderr, "bench: --tp-comm-overlap needs --sequence-parallel\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_expert_model_parallel_size) > 1) {
    return ExpertParallelBench(absl::GetFlag(FLAGS_expert_model_parallel_size));
  }
  comm::launch::RunRanksOptions options;
  options.default_nproc_per_node = 2;
  comm::launch::RanksOutcome out = comm::launch::RunRanks(
      comm::launch::GetCommFlags(), options, argc, argv,
      [](comm::Communicator& world, const comm::launch::RankContext&) {
        return absl::GetFlag(FLAGS_tp_comm_overlap) ? TpOverlapBench(world) : TpBench(world);
      });
  if (!out.status.ok()) {
    std::fprintf(stderr, "bench: %s\n", std::string(out.status.message()).c_str());
  }
  return out.ExitCode();
}
