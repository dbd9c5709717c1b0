// bazel run //models/gpt:moe_overlap_bench -- [--backend=ucx] [--nproc-per-node=2]
//     [--hidden-size=512 --ffn-hidden-size=1024 --seq-length=1024 ...]
//     [--moe-a2a-overlap-chunks=2,4]
//
// The MoE layer alone (router, dispatch, experts, combine) forward + backward
// under expert parallelism over real processes (one per EP rank, the UCX
// backend by default, cores / EP OpenMP threads each), without chunks and
// with each --moe-a2a-overlap-chunks value, alternating rep by rep so load
// changes hit every setting alike. Per setting and rank: the layer's time;
// the wall time with an all-to-all in flight, from its issue to its real
// completion (comm's flight-recorder sink, called by whichever thread
// completes it: the backend's progress thread while the rank computes); the
// time the rank was blocked on them (MoeCommStats: issue calls, Polls,
// Waits); the hidden fraction 1 - blocked / in flight; and the blocked time
// against the unchunked layer's.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "comm/launch/flags.h"
#include "comm/launch/run_ranks.h"
#include "core/bench_util/bench_util.h"
#include "core/status_macros.h"
#include "models/gpt/gpt_config.h"
#include "models/gpt/moe_block.h"
#include "models/gpt/test_util.h"
#include "profile/profiler.h"  // comm::flight's Sink, which the profiler implements too

ABSL_DECLARE_FLAG(int, nproc_per_node);
ABSL_DECLARE_FLAG(std::string, backend);

ABSL_FLAG(int64_t, hidden_size, 512, "Hidden size");
ABSL_FLAG(int64_t, ffn_hidden_size, 1024, "Each expert's FFN hidden size");
ABSL_FLAG(int64_t, seq_length, 1024, "Sequence length (each rank's own tokens)");
ABSL_FLAG(int64_t, micro_batch_size, 1, "Micro-batch size");
ABSL_FLAG(int64_t, num_experts, 8, "Experts (a multiple of the EP size = the process count)");
ABSL_FLAG(int64_t, moe_router_topk, 2, "Experts per token");
ABSL_FLAG(bool, swiglu, false, "SwiGLU experts (else GELU)");
ABSL_FLAG(std::vector<std::string>, moe_a2a_overlap_chunks, std::vector<std::string>({"2", "4"}),
          "The chunk counts to compare with the unchunked layer (1)");
ABSL_FLAG(int, reps, 7, "Timed repetitions per setting (median reported)");

namespace {

using loom::core::Tensor;
namespace comm = loom::comm;
namespace layers = loom::layers;

namespace flight = loom::comm::flight;
using Clock = std::chrono::steady_clock;

// The all-to-alls' in-flight intervals, issue to completion, of this process
// (a process-wide flight-recorder sink: never destroyed).
class AllToAllClock : public flight::Sink {
 public:
  void OnIssue(const flight::CommInfo& info, uint64_t id, flight::OpKind kind, uint64_t,
               loom::core::DType, uint64_t, int, int) override {
    if (kind != flight::OpKind::kAllToAll && kind != flight::OpKind::kAllToAllV) return;
    const Clock::time_point now = Clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    issued_[{&info, id}] = now;
  }
  void OnComplete(const flight::CommInfo& info, uint64_t id, bool) override {
    const Clock::time_point now = Clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    auto it = issued_.find({&info, id});
    if (it == issued_.end()) return;
    done_.push_back({it->second, now});
    issued_.erase(it);
  }
  // The union of the intervals completed since the last call, in ms.
  double TakeUnionMs() {
    std::vector<std::pair<Clock::time_point, Clock::time_point>> d;
    {
      std::lock_guard<std::mutex> lock(mu_);
      d.swap(done_);
    }
    std::sort(d.begin(), d.end());
    Clock::duration total{0};
    for (size_t i = 0; i < d.size();) {
      Clock::time_point begin = d[i].first, end = d[i].second;
      for (++i; i < d.size() && d[i].first <= end; ++i) end = std::max(end, d[i].second);
      total += end - begin;
    }
    return std::chrono::duration<double, std::milli>(total).count();
  }

 private:
  std::mutex mu_;
  std::map<std::pair<const flight::CommInfo*, uint64_t>, Clock::time_point> issued_;
  std::vector<std::pair<Clock::time_point, Clock::time_point>> done_;
};

// Medians of one setting on one rank, in the order printed.
enum Column { kLayer, kSpan, kBlocked, kHidden, kColumns };

absl::Status Bench(comm::Communicator& world) {
  const int ep = world.size(), rank = world.rank();
  layers::GptConfig c;
  c.hidden_size = absl::GetFlag(FLAGS_hidden_size);
  c.ffn_hidden_size = absl::GetFlag(FLAGS_ffn_hidden_size);
  c.seq_length = absl::GetFlag(FLAGS_seq_length);
  c.num_experts = absl::GetFlag(FLAGS_num_experts);
  c.moe_router_topk = absl::GetFlag(FLAGS_moe_router_topk);
  c.swiglu = absl::GetFlag(FLAGS_swiglu);
  c.add_bias_linear = false;
  const int64_t s = c.seq_length, b = absl::GetFlag(FLAGS_micro_batch_size), h = c.hidden_size;
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  std::vector<int64_t> settings = {1};
  for (const std::string& v : absl::GetFlag(FLAGS_moe_a2a_overlap_chunks)) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(v, &n) || n < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--moe-a2a-overlap-chunks: '", v, "' is not a chunk count >= 1"));
    }
    if (n > 1) settings.push_back(n);
  }
  if (c.num_experts % ep != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--num-experts (", c.num_experts,
                                                   ") must be a multiple of the EP size (", ep,
                                                   " processes)"));
  }
  LOOM_RETURN_IF_ERROR(layers::ValidateMoe(c));
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const int threads = std::max(1, cores / ep);
  omp_set_num_threads(threads);

  static AllToAllClock* const a2a_clock = new AllToAllClock;
  flight::SetSink(a2a_clock);
  const layers::EpGroup group{&world};
  LOOM_ASSIGN_OR_RETURN(
      layers::ParamBuffer params,
      layers::ParamBuffer::Create(layers::BlockParamSpecs(c, 0, group.shard()), 0, 1, c.seed));
  std::vector<layers::MoeMlp> moes;
  for (int64_t chunks : settings) {
    layers::GptConfig cc = c;
    cc.moe_a2a_overlap_chunks = chunks;
    moes.push_back(layers::MoeMlpForLayer(&params, cc, 0, {}, group));
  }
  const Tensor x = layers::testing::RandomTensor(loom::core::Shape{s, b, h}, 1 + rank);
  const Tensor dy = layers::testing::RandomTensor(loom::core::Shape{s, b, h}, 100 + rank);

  // [setting][column] samples; one warm-up round first.
  std::vector<std::vector<std::vector<double>>> samples(
      settings.size(), std::vector<std::vector<double>>(kColumns));
  int64_t rows = 0;
  for (int i = 0; i <= reps; ++i) {
    for (size_t k = 0; k < settings.size(); ++k) {
      layers::MoeCommStats stats;
      moes[k].set_comm_stats(&stats);
      LOOM_RETURN_IF_ERROR(world.Barrier()->Wait());
      (void)a2a_clock->TakeUnionMs();
      layers::MoeMlp::Saved saved;
      const auto t0 = std::chrono::steady_clock::now();
      LOOM_ASSIGN_OR_RETURN(Tensor y, moes[k].Forward(x, &saved));
      LOOM_ASSIGN_OR_RETURN(Tensor dx, moes[k].Backward(dy, 1.0f, saved));
      const double ms = loom::core::bench::MillisecondsSince(t0);
      moes[k].set_comm_stats(nullptr);
      const double in_flight = a2a_clock->TakeUnionMs();
      rows = saved.expert_in.dim(0);
      if (i == 0) continue;
      samples[k][kLayer].push_back(ms);
      samples[k][kSpan].push_back(in_flight);
      samples[k][kBlocked].push_back(stats.blocked_ms);
      samples[k][kHidden].push_back(
          in_flight > 0 ? std::max(0.0, 1.0 - stats.blocked_ms / in_flight) : 0.0);
    }
  }
  // Every rank's medians to rank 0.
  const int64_t n = static_cast<int64_t>(settings.size()) * kColumns + 1;
  LOOM_ASSIGN_OR_RETURN(Tensor mine, Tensor::Empty(loom::core::Shape{n},
                                                   loom::core::DType::kF64));
  for (size_t k = 0; k < settings.size(); ++k) {
    for (int col = 0; col < kColumns; ++col) {
      mine.data<double>()[k * kColumns + col] = loom::core::bench::Median(samples[k][col]);
    }
  }
  mine.data<double>()[n - 1] = static_cast<double>(rows);
  LOOM_ASSIGN_OR_RETURN(Tensor all, Tensor::Empty(loom::core::Shape{n * ep},
                                                  loom::core::DType::kF64));
  LOOM_RETURN_IF_ERROR(world.AllGather(mine, all)->Wait());
  if (rank != 0) return absl::OkStatus();

  std::printf(
      "MoE layer alone fwd+bwd: s=%lld b=%lld h=%lld ffn=%lld %s, %lld experts top-%lld, each "
      "rank its own tokens; EP=%d processes over %s, %d thread(s) each, %s (%d cores); median "
      "of %d after a warm-up, settings alternating\n",
      (long long)s, (long long)b, (long long)h, (long long)c.ffn_hidden_size,
      c.swiglu ? "SwiGLU" : "GELU", (long long)c.num_experts, (long long)c.moe_router_topk, ep,
      world.backend_name(), threads, loom::core::bench::CpuModel().c_str(), cores, reps);
  std::printf(
      "| chunks | rank | rows at its experts | layer ms | all-to-all in flight ms | blocked ms "
      "| hidden fraction | blocked vs chunks=1 |\n|---|---|---|---|---|---|---|---|\n");
  const double* v = all.data<double>();
  for (size_t k = 0; k < settings.size(); ++k) {
    for (int r = 0; r < ep; ++r) {
      const double* m = v + r * n + k * kColumns;
      const double base_blocked = v[r * n + kBlocked];
      std::printf("| %lld | %d | %lld | %.1f | %.2f | %.2f | %.2f | %.2f |\n",
                  (long long)settings[k], r, (long long)v[r * n + n - 1], m[kLayer], m[kSpan],
                  m[kBlocked], m[kHidden], base_blocked > 0 ? m[kBlocked] / base_blocked : 0.0);
    }
  }
  std::printf(
      "in flight = wall time with an all-to-all between its issue and its completion (flight "
      "recorder sink); hidden fraction = 1 - blocked / in flight; blocked includes the issue "
      "calls and waiting for slower ranks (load imbalance).\n");
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetFlag(&FLAGS_nproc_per_node, 2);
  absl::SetFlag(&FLAGS_backend, "ucx");
  comm::launch::ParseFlags(argc, argv,
                           "Times the MoE layer under EP with and without chunked all-to-alls.");
  comm::launch::RunRanksOptions options;
  options.default_nproc_per_node = 2;
  comm::launch::RanksOutcome out = comm::launch::RunRanks(
      comm::launch::GetCommFlags(), options, argc, argv,
      [](comm::Communicator& world, const comm::launch::RankContext&) { return Bench(world); });
  if (!out.status.ok()) {
    std::fprintf(stderr, "moe_overlap_bench: %s\n", std::string(out.status.message()).c_str());
  }
  return out.ExitCode();
}
