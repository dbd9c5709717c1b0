// The pipeline executor reproduces the single-stage model: for every schedule
// (GPipe, 1F1B, interleaved 1F1B), P in {2, 4} and TP in {1, 2} (with and
// without sequence parallelism), for GPT-2 and a Llama-style model (RMSNorm,
// RoPE, SwiGLU, GQA, untied output layer), one step's loss and every parameter gradient
// (gathered over TP, compared by global name) match the whole model on one
// rank accumulating the same micro-batches with the same loss scale. Also:
// peak live activations, and errors (not hangs) for bad layouts and dead peers.
// Ranks are threads on the `local` backend.
#include "pipeline/executor.h"

#include <algorithm>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "comm/grid.h"
#include "comm/local/communicator.h"
#include "comm/testing/ranks_as_threads.h"
#include "distributed/gradient_sync.h"
#include "gtest/gtest.h"
#include "layers/test_util.h"
#include "models/gpt/gpt_model.h"
#include "pipeline/layer_assignment.h"
#include "pipeline/p2p.h"
#include "pipeline/schedule.h"

namespace loom::pipeline {
namespace {

using core::Tensor;
using layers::GptConfig;
using layers::GptModel;
using layers::testing::GatherFull;
using layers::testing::MaxRelativeError;
using layers::testing::RandomIds;
using layers::testing::ToVector;

constexpr double kTolerance = 1e-5;  // max |diff| / max |ref| per tensor
constexpr int64_t kMicroBatchSize = 2;

GptConfig TestConfig(bool llama = false) {
  GptConfig c;
  c.num_layers = 8;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = 8;
  c.vocab_size = 50;
  c.make_vocab_size_divisible_by = 8;
  c.seed = 42;
  if (llama) {  // RMSNorm, RoPE, SwiGLU, 2 K/V groups, untied output layer, no biases
    c.normalization = layers::Normalization::kRMSNorm;
    c.position_embedding_type = layers::PositionEmbedding::kRope;
    c.swiglu = true;
    c.ffn_hidden_size = 64;
    c.group_query_attention = true;
    c.num_query_groups = 2;
    c.untie_embeddings_and_output_weights = true;
    c.add_bias_linear = false;
  }
  return c;
}

// Micro-batch m of the step: the same data and dropout masks on every layout.
MicroBatch MakeMicroBatch(const GptConfig& config, int m) {
  MicroBatch mb;
  mb.ids = RandomIds(config.seq_length, kMicroBatchSize, config.vocab_size, 100 + m);
  mb.targets = RandomIds(config.seq_length, kMicroBatchSize, config.vocab_size, 200 + m);
  mb.dropout.hidden_p = 0.1f;
  mb.dropout.seed = 7;
  mb.dropout.stream = 1000 + static_cast<uint64_t>(m) * kMicroBatchSize;  // first global sample
  return mb;
}

struct Reference {
  std::vector<double> losses;
  double mean_loss = 0;
  std::map<std::string, std::vector<float>> grads;
};

// The whole model on one rank, micro-batches accumulated with dloss = 1/M,
// without the executor.
const Reference& GetReference(int micro_batches, bool llama = false) {
  static absl::Mutex mu;
  static auto* cache = new std::map<std::pair<int, bool>, Reference>();
  absl::MutexLock lock(&mu);
  auto it = cache->find({micro_batches, llama});
  if (it != cache->end()) return it->second;
  Reference& ref = (*cache)[{micro_batches, llama}];
  const GptConfig config = TestConfig(llama);
  auto model = GptModel::Create(config, layers::TpGroup{});
  EXPECT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE((*model)->params().ZeroGrads().ok());
  for (int m = 0; m < micro_batches; ++m) {
    MicroBatch mb = MakeMicroBatch(config, m);
    GptModel::Saved saved;
    double loss = 0;
    EXPECT_TRUE((*model)->Forward(0, mb.ids, mb.targets, mb.dropout, &saved, &loss).ok());
    EXPECT_TRUE(
        (*model)->Backward(0, Tensor(), 1.0f / micro_batches, mb.dropout, saved).ok());
    ref.losses.push_back(loss);
    ref.mean_loss += loss / micro_batches;
  }
  for (layers::Param& p : (*model)->params().params()) ref.grads[p.spec->name] = ToVector(p.grad);
  return ref;
}

struct Layout {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int pp = 2;
  int vp = 1;
  int tp = 1;
  bool sp = false;
  int micro_batches = 8;
  int group_size = 0;  // interleaved G (0: P)
  bool llama = false;  // the Llama-style TestConfig
};

std::string Name(const Layout& l) {
  std::string s = absl::StrCat(ScheduleKindName(l.kind), "_pp", l.pp);
  std::replace(s.begin(), s.end(), '-', '_');  // zb-h1: test names take no dashes
  if (l.vp > 1) absl::StrAppend(&s, "_vp", l.vp);
  if (l.group_size) absl::StrAppend(&s, "_g", l.group_size);
  absl::StrAppend(&s, "_tp", l.tp, l.sp ? "_sp" : "", "_m", l.micro_batches);
  if (l.llama) absl::StrAppend(&s, "_llama");
  return s;
}

std::vector<layers::ChunkSpec> ChunksOf(const GptConfig& config, int pp, int vp, int pp_rank,
                                        ScheduleKind kind = ScheduleKind::k1F1B) {
  ScheduleOptions o;
  o.kind = kind;
  o.pp = pp;
  o.vp = vp;
  std::vector<layers::ChunkSpec> chunks;
  for (int c = 0; c < vp; ++c) {
    // The layers of the chunk's virtual stage (zbv places them in a V): virtual stage vs holds
    // what LayersOf gives (vs % P, vs / P) in Megatron's placement.
    const int vs = VirtualStageOf(o, pp_rank, c);
    LayerRange r = *LayersOf(config.num_layers, pp, vp, vs % pp, vs / pp);
    chunks.push_back({r.first, r.count, vs == 0, vs == pp * vp - 1});
  }
  return chunks;
}

class ExecutorEquivalenceTest : public ::testing::TestWithParam<Layout> {};

TEST_P(ExecutorEquivalenceTest, MatchesSingleStage) {
  const Layout l = GetParam();
  const GptConfig config = TestConfig(l.llama);
  const int M = l.micro_batches;
  const Reference& ref = GetReference(M, l.llama);
  absl::Mutex mu;
  std::set<std::string> covered;
  std::vector<int> stage0_peak, last_peak;

  auto rank_fn = [&](int global_rank, comm::Communicator* world) -> absl::Status {
    auto grid = comm::Grid::Make(world->size(), l.tp, l.pp);
    if (!grid.ok()) return grid.status();
    auto groups = comm::MakeParallelGroups(*world, *grid);
    if (!groups.ok()) return groups.status();
    const comm::GridCoord coord = grid->Coord(global_rank);
    layers::TpGroup tp{groups->tp.get(), l.sp};
    auto model = GptModel::Create(config, tp, ChunksOf(config, l.pp, l.vp, coord.pp_rank, l.kind));
    if (!model.ok()) return model.status();
    // The executor only computes: the tied embedding's sum over the first and
    // last stage and the SP sum over TP are GradientSync's (no DP here).
    distributed::GradientSyncOptions sync_options;
    sync_options.micro_batches = M;
    // zbv holds the first and the last virtual stage on stage 0: its tied embedding is one
    // rank's, and the grid's embedding group (stages 0 and P - 1) does not apply.
    comm::Communicator* embedding =
        IsVShape(l.kind) ? nullptr : groups->embedding.get();
    auto sync = distributed::GradientSync::Create(model->get(), {nullptr, embedding}, sync_options);
    if (!sync.ok()) return sync.status();
    EXPECT_TRUE((*sync)->StartStep().ok());
    auto schedule = BuildSchedule({l.kind, l.pp, l.vp, M, l.group_size});
    if (!schedule.ok()) return schedule.status();
    ExecutorOptions options;
    options.micro_batch_size = kMicroBatchSize;
    options.loss_scale = 1.0f / M;
    auto exec = Executor::Create(*schedule, model->get(), groups->pp.get(), options);
    if (!exec.ok()) return exec.status();
    auto result = exec->RunStep(
        [&](int m) -> absl::StatusOr<MicroBatch> { return MakeMicroBatch(config, m); });
    if (!result.ok()) return result.status();
    absl::Status finished = (*sync)->FinishGradients();
    if (!finished.ok()) return finished;

    const std::string where = absl::StrCat("pp_rank ", coord.pp_rank, " tp_rank ", coord.tp_rank);
    EXPECT_NEAR(result->mean_loss, ref.mean_loss, kTolerance * std::abs(ref.mean_loss)) << where;
    // The losses live where the last virtual stage does: stage P - 1, or 0 for zbv's V.
    const int loss_stage = IsVShape(l.kind) ? 0 : l.pp - 1;
    if (coord.pp_rank == loss_stage) {
      EXPECT_EQ(result->losses.size(), static_cast<size_t>(M)) << where;
      for (size_t m = 0; m < result->losses.size(); ++m) {
        EXPECT_NEAR(result->losses[m], ref.losses[m], kTolerance * std::abs(ref.losses[m]))
            << where << " micro-batch " << m;
      }
    } else {
      EXPECT_TRUE(result->losses.empty()) << where;
    }
    for (layers::Param& p : (*model)->params().params()) {
      auto full = GatherFull(p, tp, /*grad=*/true);
      if (!full.ok()) return full.status();
      auto want_it = ref.grads.find(p.spec->name);
      if (want_it == ref.grads.end()) {
        ADD_FAILURE() << "unknown parameter " << p.spec->name;
        continue;
      }
      const std::vector<float>& want = want_it->second;
      std::vector<float> got = *full;
      if (got.size() > want.size()) {  // a larger padded vocabulary: padding rows get no gradient
        for (size_t i = want.size(); i < got.size(); ++i) EXPECT_EQ(got[i], 0.0f) << p.spec->name;
        got.resize(want.size());
      }
      EXPECT_LT(MaxRelativeError(got, want), kTolerance) << p.spec->name << ", " << where;
      absl::MutexLock lock(&mu);
      covered.insert(p.spec->name);
    }
    absl::MutexLock lock(&mu);
    if (coord.pp_rank == 0 && coord.tp_rank == 0) stage0_peak = result->peak_live_saved;
    if (coord.pp_rank == l.pp - 1 && coord.tp_rank == 0) last_peak = result->peak_live_saved;
    return absl::OkStatus();
  };
  comm::local::LocalOptions world_options;
  world_options.comm.timeout = absl::Seconds(20);  // a hang fails the test instead
  absl::Status s = comm::testing::RunRanksAsThreads(l.tp * l.pp, rank_fn, world_options);
  ASSERT_TRUE(s.ok()) << s;

  // Every parameter of the model lives on some stage.
  for (const auto& [name, g] : ref.grads) EXPECT_TRUE(covered.count(name)) << name;
  // Peak live activations (Saved records) on stage 0.
  ASSERT_EQ(stage0_peak.size(), static_cast<size_t>(l.vp));
  if (l.kind == ScheduleKind::kGPipe) {
    EXPECT_EQ(stage0_peak[0], M);
    EXPECT_EQ(last_peak[0], M);
  } else if (l.kind == ScheduleKind::k1F1B) {
    EXPECT_LE(stage0_peak[0], l.pp);
    EXPECT_EQ(stage0_peak[0], std::min(l.pp, M));  // warm-up P-1, then one more forward
    EXPECT_EQ(last_peak[0], 1);
  } else if (l.kind == ScheduleKind::kZBH1) {
    // GptModel splits its backward: a record stays from its forward to its W, which ZB-H1 defers
    // on stage r until I(m + r): the schedule's formula on the first and the last stage.
    const ScheduleOptions options{l.kind, l.pp, 1, M, 0};
    EXPECT_EQ(stage0_peak[0], PeakInFlightActivations(options, 0));
    EXPECT_EQ(last_peak[0], PeakInFlightActivations(options, l.pp - 1));
    EXPECT_EQ(last_peak[0], std::min(l.pp, M));  // 1F1B's last stage holds 1
  } else {
    int total = 0;
    for (int n : stage0_peak) total += n;
    EXPECT_LT(total, l.vp * M);  // interleaving frees before all forwards are done
  }
}

std::vector<Layout> Layouts() {
  std::vector<Layout> out;
  for (int pp : {2, 4}) {
    out.push_back({ScheduleKind::kGPipe, pp, 1, 1, false, 8});
    out.push_back({ScheduleKind::k1F1B, pp, 1, 1, false, 8});
    out.push_back({ScheduleKind::kInterleaved, pp, 2, 1, false, 8});
  }
  out.push_back({ScheduleKind::k1F1B, 4, 1, 1, false, 2});          // M < P
  out.push_back({ScheduleKind::kInterleaved, 2, 2, 1, false, 8, 4});  // G = 2P > P
  out.push_back({ScheduleKind::kInterleaved, 2, 4, 1, false, 4});     // v = 4, one layer a chunk
  for (bool sp : {false, true}) {
    out.push_back({ScheduleKind::kGPipe, 2, 1, 2, sp, 4});
    out.push_back({ScheduleKind::k1F1B, 2, 1, 2, sp, 4});
    out.push_back({ScheduleKind::kInterleaved, 2, 2, 2, sp, 4});
  }
  // Zero-bubble schedules (#39) on GptModel's split backward (BackwardInput at I, the weight
  // gradients at W): the same loss and gradients as one rank, like 1F1B. zbv also hands chunk 0's output to chunk 1 locally on
  // stage P - 1 (and on the one stage when P = 1).
  for (int pp : {2, 4}) {
    out.push_back({ScheduleKind::kZBH1, pp, 1, 1, false, 8});
    out.push_back({ScheduleKind::kZBV, pp, 2, 1, false, 8});
  }
  out.push_back({ScheduleKind::kZBH1, 4, 1, 1, false, 2});  // M < P
  out.push_back({ScheduleKind::kZBV, 4, 2, 1, false, 3});   // M < 2P - 1: torch's filtering
  out.push_back({ScheduleKind::kZBV, 1, 2, 1, false, 4});
  out.push_back({ScheduleKind::kZBH1, 2, 1, 2, true, 4});
  out.push_back({ScheduleKind::kZBV, 2, 2, 2, true, 4});
  out.push_back({ScheduleKind::kZBV, 2, 2, 1, false, 4, 0, true});  // Llama-style, untied
  // DualPipeV: zbv's V with full backwards in its F&B steps and split ones in its first and
  // last phases, mixed on one stage.
  out.push_back({ScheduleKind::kDualPipeV, 2, 2, 1, false, 4});
  out.push_back({ScheduleKind::kDualPipeV, 2, 2, 1, false, 7});
  out.push_back({ScheduleKind::kDualPipeV, 4, 2, 1, false, 8});
  out.push_back({ScheduleKind::kDualPipeV, 1, 2, 1, false, 3});
  out.push_back({ScheduleKind::kDualPipeV, 2, 2, 2, true, 4});
  out.push_back({ScheduleKind::kDualPipeV, 2, 2, 1, false, 4, 0, true});  // Llama-style
  // P = 1: the executor runs all forwards/backwards of the one stage.
  out.push_back({ScheduleKind::kGPipe, 1, 1, 1, false, 4});
  out.push_back({ScheduleKind::k1F1B, 1, 1, 1, false, 4});
  out.push_back({ScheduleKind::k1F1B, 1, 1, 2, true, 4});
  // Llama-style: every schedule, with TP (and SP) splitting the K/V groups;
  // the untied output layer needs no sum across the end stages.
  for (int tp : {1, 2}) {
    for (bool sp : {false, true}) {
      if (tp == 1 && sp) continue;
      out.push_back({ScheduleKind::kGPipe, 2, 1, tp, sp, 4, 0, true});
      out.push_back({ScheduleKind::k1F1B, tp == 1 ? 4 : 2, 1, tp, sp, 8, 0, true});
      out.push_back({ScheduleKind::kInterleaved, 2, 2, tp, sp, 4, 0, true});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Layouts, ExecutorEquivalenceTest, ::testing::ValuesIn(Layouts()),
                         [](const auto& info) { return Name(info.param); });

// One step of `kind` over `pp` stages (TP 1): per stage its losses and gradients by name.
struct RankStep {
  std::vector<double> losses;
  double mean_loss = 0;
  std::map<std::string, std::vector<float>> grads;
};
std::vector<RankStep> RunStep(ScheduleKind kind, int pp, int micro_batches) {
  const GptConfig config = TestConfig();
  std::vector<RankStep> out(pp);
  auto rank_fn = [&](int rank, comm::Communicator* world) -> absl::Status {
    auto grid = comm::Grid::Make(world->size(), 1, pp);
    if (!grid.ok()) return grid.status();
    auto groups = comm::MakeParallelGroups(*world, *grid);
    if (!groups.ok()) return groups.status();
    auto model = GptModel::Create(config, layers::TpGroup{}, ChunksOf(config, pp, 1, rank, kind));
    if (!model.ok()) return model.status();
    distributed::GradientSyncOptions sync_options;
    sync_options.micro_batches = micro_batches;
    auto sync = distributed::GradientSync::Create(model->get(), {nullptr, groups->embedding.get()},
                                                  sync_options);
    if (!sync.ok()) return sync.status();
    if (absl::Status st = (*sync)->StartStep(); !st.ok()) return st;
    auto schedule = BuildSchedule({kind, pp, 1, micro_batches, 0});
    if (!schedule.ok()) return schedule.status();
    ExecutorOptions options;
    options.micro_batch_size = kMicroBatchSize;
    options.loss_scale = 1.0f / micro_batches;
    auto exec = Executor::Create(*schedule, model->get(), groups->pp.get(), options);
    if (!exec.ok()) return exec.status();
    auto result = exec->RunStep(
        [&](int m) -> absl::StatusOr<MicroBatch> { return MakeMicroBatch(config, m); });
    if (!result.ok()) return result.status();
    if (absl::Status st = (*sync)->FinishGradients(); !st.ok()) return st;
    RankStep& r = out[rank];
    r.losses = result->losses;
    r.mean_loss = result->mean_loss;
    for (layers::Param& p : (*model)->params().params()) r.grads[p.spec->name] = ToVector(p.grad);
    return absl::OkStatus();
  };
  comm::local::LocalOptions world_options;
  world_options.comm.timeout = absl::Seconds(20);
  absl::Status s = comm::testing::RunRanksAsThreads(pp, rank_fn, world_options);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// ZB-H1 runs GptModel's split backward: each I in micro-batch order, each W later in
// micro-batch order, the weight GEMMs on the same operands as the fused backward's (layers/
// weight_grad_store.h), so every gradient sums the same products in the same order: bit for
// bit 1F1B's step, the gradients GradientSync sees at its AfterBackward cues included.
TEST(ZeroBubbleExecutorTest, ZBH1IsBitwise1F1B) {
  for (int pp : {2, 4}) {
    const std::vector<RankStep> one = RunStep(ScheduleKind::k1F1B, pp, 8);
    const std::vector<RankStep> zb = RunStep(ScheduleKind::kZBH1, pp, 8);
    ASSERT_EQ(one.size(), zb.size());
    for (int r = 0; r < pp; ++r) {
      EXPECT_EQ(one[r].losses, zb[r].losses) << "stage " << r;
      EXPECT_EQ(one[r].mean_loss, zb[r].mean_loss) << "stage " << r;
      ASSERT_FALSE(one[r].grads.empty());
      EXPECT_EQ(one[r].grads, zb[r].grads) << "stage " << r;
    }
  }
}

// Evaluation: the forward-only schedule gives the training step's losses on
// every stage, writes no gradient and keeps no activation past its forward.
class ForwardOnlyTest : public ::testing::TestWithParam<Layout> {};

TEST_P(ForwardOnlyTest, LossesMatchAndNothingIsKept) {
  const Layout l = GetParam();
  const GptConfig config = TestConfig(l.llama);
  const int M = l.micro_batches;
  const Reference& ref = GetReference(M, l.llama);
  auto rank_fn = [&](int global_rank, comm::Communicator* world) -> absl::Status {
    auto grid = comm::Grid::Make(world->size(), l.tp, l.pp);
    if (!grid.ok()) return grid.status();
    auto groups = comm::MakeParallelGroups(*world, *grid);
    if (!groups.ok()) return groups.status();
    const comm::GridCoord coord = grid->Coord(global_rank);
    layers::TpGroup tp{groups->tp.get(), l.sp};
    auto model = GptModel::Create(config, tp, ChunksOf(config, l.pp, l.vp, coord.pp_rank, l.kind));
    if (!model.ok()) return model.status();
    auto schedule = BuildForwardOnlySchedule({l.kind, l.pp, l.vp, M, l.group_size});
    if (!schedule.ok()) return schedule.status();
    ExecutorOptions options;
    options.micro_batch_size = kMicroBatchSize;
    options.forward_only = true;
    auto exec = Executor::Create(*schedule, model->get(), groups->pp.get(), options);
    if (!exec.ok()) return exec.status();
    for (int pass = 0; pass < 2; ++pass) {  // an executor runs any number of passes
      auto result = exec->RunStep(
          [&](int m) -> absl::StatusOr<MicroBatch> { return MakeMicroBatch(config, m); });
      if (!result.ok()) return result.status();
      const std::string where = absl::StrCat("pp_rank ", coord.pp_rank, " pass ", pass);
      EXPECT_NEAR(result->mean_loss, ref.mean_loss, kTolerance * std::abs(ref.mean_loss)) << where;
      if (coord.pp_rank == (IsVShape(l.kind) ? 0 : l.pp - 1)) {
        for (int m = 0; m < M; ++m) {
          EXPECT_NEAR(result->losses[m], ref.losses[m], kTolerance * std::abs(ref.losses[m]))
              << where << " micro-batch " << m;
        }
      }
      for (int peak : result->peak_live_saved) EXPECT_LE(peak, 1) << where;
    }
    for (float g : ToVector((*model)->params().flat_grads())) {
      if (g != 0.0f) return absl::InternalError("a forward-only pass wrote a gradient");
    }
    return absl::OkStatus();
  };
  comm::local::LocalOptions world_options;
  world_options.comm.timeout = absl::Seconds(20);
  absl::Status s = comm::testing::RunRanksAsThreads(l.tp * l.pp, rank_fn, world_options);
  ASSERT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ForwardOnlyTest,
    ::testing::Values(Layout{ScheduleKind::kGPipe, 2, 1, 1, false, 4},
                      Layout{ScheduleKind::k1F1B, 4, 1, 1, false, 8},
                      Layout{ScheduleKind::k1F1B, 4, 1, 1, false, 2},
                      Layout{ScheduleKind::kInterleaved, 2, 2, 1, false, 4},
                      Layout{ScheduleKind::kInterleaved, 2, 2, 2, true, 4},
                      Layout{ScheduleKind::k1F1B, 1, 1, 2, true, 4},
                      Layout{ScheduleKind::kInterleaved, 2, 2, 2, true, 4, 0, true},
                      // The V (evaluation of zbv and dualpipev runs): chunk 0's forwards, then
                      // chunk 1's; the loss on stage 0.
                      Layout{ScheduleKind::kZBV, 2, 2, 1, false, 4},
                      Layout{ScheduleKind::kZBV, 4, 2, 1, false, 3},
                      Layout{ScheduleKind::kDualPipeV, 2, 2, 2, true, 4},
                      Layout{ScheduleKind::kDualPipeV, 1, 2, 1, false, 2, 0, true}),
    [](const auto& info) { return Name(info.param); });

TEST(ExecutorErrorTest, ForwardOnlyNeedsAForwardOnlySchedule) {
  const GptConfig config = TestConfig();
  auto model = GptModel::Create(config, layers::TpGroup{});
  ASSERT_TRUE(model.ok());
  auto schedule = BuildSchedule({ScheduleKind::k1F1B, 1, 1, 2, 0});
  ASSERT_TRUE(schedule.ok());
  ExecutorOptions options;
  options.forward_only = true;
  auto exec = Executor::Create(*schedule, model->get(), nullptr, options);
  ASSERT_FALSE(exec.ok());
  EXPECT_NE(exec.status().message().find("BuildForwardOnlySchedule"), std::string::npos)
      << exec.status();
}

// Sanity: the comparison can fail. A different loss scale on the pipeline
// gives gradients that do not match.
TEST(ExecutorSanityTest, WrongLossScaleIsDetected) {
  const GptConfig config = TestConfig();
  const Reference& ref = GetReference(4);
  auto model = GptModel::Create(config, layers::TpGroup{});
  ASSERT_TRUE(model.ok());
  auto schedule = BuildSchedule({ScheduleKind::k1F1B, 1, 1, 4, 0});
  ASSERT_TRUE(schedule.ok());
  ExecutorOptions options;
  options.micro_batch_size = kMicroBatchSize;
  options.loss_scale = 1.0f;  // the reference uses 1/4
  auto exec = Executor::Create(*schedule, model->get(), nullptr, options);
  ASSERT_TRUE(exec.ok()) << exec.status();
  auto result = exec->RunStep([&](int m) -> absl::StatusOr<MicroBatch> {
    return MakeMicroBatch(config, m);
  });
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_NEAR(result->mean_loss, ref.mean_loss, kTolerance * ref.mean_loss);  // loss unaffected
  const auto& name = (*model)->params().params().back().spec->name;
  EXPECT_GT(MaxRelativeError(ToVector((*model)->params().at(name).grad), ref.grads.at(name)),
            kTolerance);
}

TEST(P2PTest, TagsAreUniquePerMessage) {
  std::set<int> tags;
  const int M = 8, stages = 8;
  for (int m = 0; m < M; ++m) {
    for (int vs = 0; vs < stages; ++vs) {
      for (bool g : {false, true}) {
        int t = MessageTag(g, m, vs, stages);
        EXPECT_GE(t, 0);
        EXPECT_LT(t, comm::kMaxTag);
        EXPECT_TRUE(tags.insert(t).second);
      }
    }
  }
  EXPECT_TRUE(CheckTagRange(1000, 16).ok());
  absl::Status s = CheckTagRange(1 << 16, 8);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--micro-batches"), std::string::npos) << s;
  // The consumer of a send is the neighbouring virtual stage; of a receive, this one.
  EXPECT_EQ(ConsumerVirtualStage({ActionKind::kSendActivation, 0, 0, 0}, 2, 1), 2);  // wraps to stage 0
  EXPECT_EQ(ConsumerVirtualStage({ActionKind::kRecvActivation, 0, 1, 1}, 2, 0), 2);
  EXPECT_EQ(ConsumerVirtualStage({ActionKind::kSendGrad, 0, 1, 1}, 2, 0), 1);
  EXPECT_EQ(ConsumerVirtualStage({ActionKind::kRecvGrad, 0, 0, 0}, 2, 1), 1);
}

TEST(P2PTest, BoundaryShapeFollowsSequenceParallelism) {
  const GptConfig config = TestConfig();
  auto world = comm::local::CreateWorld(2);
  ASSERT_TRUE(world.ok());
  EXPECT_EQ(BoundaryShape(config, layers::TpGroup{}, 2), (core::Shape{8, 2, 32}));
  EXPECT_EQ(BoundaryShape(config, layers::TpGroup{(*world)[0].get(), false}, 2),
            (core::Shape{8, 2, 32}));
  EXPECT_EQ(BoundaryShape(config, layers::TpGroup{(*world)[0].get(), true}, 2),
            (core::Shape{4, 2, 32}));
}

// The link carries the activation dtype it was built with (bf16 under
// --bf16), and names that dtype when a tensor of another one is passed.
TEST(P2PTest, LinksCarryTheirActivationDtype) {
  const core::Shape boundary{4, 2, 8};
  std::vector<core::Tensor> got(2);
  std::vector<absl::Status> st =
      comm::testing::RunRanksAsThreadsEach(2, [&](int r, comm::Communicator* pp) {
        StageP2P link(pp, 1, boundary, core::DType::kBF16);
        core::Tensor t = *link.AllocateBoundary();
        if (r == 0) {
          auto* bits = static_cast<uint16_t*>(t.raw_data());
          for (int64_t i = 0; i < t.numel(); ++i) bits[i] = static_cast<uint16_t>(i);
          return link.Exchange({{{ActionKind::kSendActivation, 0, 0, 1}, t}});
        }
        absl::Status received = link.Exchange({{{ActionKind::kRecvActivation, 0, 0, 0}, t}});
        got[r] = t;
        return received;
      }).each;
  ASSERT_TRUE(st[0].ok()) << st[0];
  ASSERT_TRUE(st[1].ok()) << st[1];
  ASSERT_EQ(got[1].dtype(), core::DType::kBF16);
  const auto* bits = static_cast<const uint16_t*>(got[1].raw_data());
  for (int64_t i = 0; i < got[1].numel(); ++i) ASSERT_EQ(bits[i], static_cast<uint16_t>(i)) << i;
  auto world = comm::local::CreateWorld(2);
  ASSERT_TRUE(world.ok());
  StageP2P link((*world)[0].get(), 1, boundary, core::DType::kBF16);
  absl::Status wrong = link.Exchange(
      {{{ActionKind::kSendActivation, 0, 0, 1}, *core::Tensor::Empty(boundary, core::DType::kF32)}});
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument) << wrong;
  EXPECT_NE(wrong.message().find("expected bf16[4, 2, 8]"), std::string::npos) << wrong;
}

// ------------------------------------------------------------------- errors

TEST(ExecutorErrorTest, WrongNumberOfChunks) {
  const GptConfig config = TestConfig();
  auto world = comm::local::CreateWorld(2);
  ASSERT_TRUE(world.ok());
  auto schedule = BuildSchedule({ScheduleKind::kInterleaved, 2, 2, 4, 0});
  ASSERT_TRUE(schedule.ok());
  // Stage 0 of a v = 2 schedule, but the model holds one chunk.
  auto model = GptModel::Create(config, layers::TpGroup{}, ChunksOf(config, 2, 1, 0));
  ASSERT_TRUE(model.ok());
  auto exec = Executor::Create(*schedule, model->get(), (*world)[0].get());
  ASSERT_FALSE(exec.ok());
  EXPECT_EQ(exec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(exec.status().message().find("--virtual-pipeline-model-parallel-size 2"),
            std::string::npos)
      << exec.status();
  EXPECT_NE(exec.status().message().find("1 chunk"), std::string::npos) << exec.status();
}

TEST(ExecutorErrorTest, PipelineCommunicatorSizeMustMatch) {
  const GptConfig config = TestConfig();
  auto world = comm::local::CreateWorld(3);
  ASSERT_TRUE(world.ok());
  auto schedule = BuildSchedule({ScheduleKind::k1F1B, 2, 1, 4, 0});
  ASSERT_TRUE(schedule.ok());
  auto model = GptModel::Create(config, layers::TpGroup{}, ChunksOf(config, 2, 1, 0));
  ASSERT_TRUE(model.ok());
  auto exec = Executor::Create(*schedule, model->get(), (*world)[0].get());
  ASSERT_FALSE(exec.ok());
  EXPECT_NE(exec.status().message().find("3 ranks"), std::string::npos) << exec.status();
}

TEST(ExecutorErrorTest, MicroBatchOfTheWrongShape) {
  const GptConfig config = TestConfig();
  auto model = GptModel::Create(config, layers::TpGroup{});
  ASSERT_TRUE(model.ok());
  auto schedule = BuildSchedule({ScheduleKind::kGPipe, 1, 1, 2, 0});
  ASSERT_TRUE(schedule.ok());
  ExecutorOptions options;
  options.micro_batch_size = 3;  // the source gives b = 2
  auto exec = Executor::Create(*schedule, model->get(), nullptr, options);
  ASSERT_TRUE(exec.ok()) << exec.status();
  auto result = exec->RunStep([&](int m) -> absl::StatusOr<MicroBatch> {
    return MakeMicroBatch(config, m);
  });
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("stage 0: Forward(micro-batch 0, chunk 0)"),
            std::string::npos)
      << result.status();
  EXPECT_NE(result.status().message().find("--micro-batch-size"), std::string::npos)
      << result.status();
}

TEST(ExecutorErrorTest, SourceErrorPropagates) {
  const GptConfig config = TestConfig();
  auto model = GptModel::Create(config, layers::TpGroup{});
  ASSERT_TRUE(model.ok());
  auto schedule = BuildSchedule({ScheduleKind::k1F1B, 1, 1, 2, 0});
  ASSERT_TRUE(schedule.ok());
  auto exec = Executor::Create(*schedule, model->get(), nullptr);
  ASSERT_TRUE(exec.ok()) << exec.status();
  auto result = exec->RunStep(
      [&](int m) -> absl::StatusOr<MicroBatch> { return absl::NotFoundError("no more data"); });
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(result.status().message().find("MicroBatchSource(0): no more data"), std::string::npos)
      << result.status();
}

comm::local::LocalOptions ShortTimeout() {
  comm::local::LocalOptions o;
  o.comm.timeout = absl::Seconds(2);
  return o;
}

// Runs a P-stage 1F1B step where stage `dead` gets `dead_options` (or, with
// dead_returns, leaves right after creating its groups). Returns each stage's status.
std::vector<absl::Status> RunWithFaultyStage(int pp, int dead, bool dead_returns,
                                             int64_t dead_micro_batch_size) {
  const GptConfig config = TestConfig();
  std::vector<absl::Status> statuses(pp);
  absl::Mutex mu;
  absl::Status s = comm::testing::RunRanksAsThreads(pp, [&](int rank, comm::Communicator* world) {
    auto grid = comm::Grid::Make(pp, 1, pp);
    if (!grid.ok()) return grid.status();
    auto groups = comm::MakeParallelGroups(*world, *grid);
    if (!groups.ok()) return groups.status();
    if (rank == dead && dead_returns) return absl::OkStatus();  // never sends or receives
    auto model = GptModel::Create(config, layers::TpGroup{}, ChunksOf(config, pp, 1, rank));
    if (!model.ok()) return model.status();
    auto schedule = BuildSchedule({ScheduleKind::k1F1B, pp, 1, 4, 0});
    if (!schedule.ok()) return schedule.status();
    ExecutorOptions options;
    options.micro_batch_size = rank == dead ? dead_micro_batch_size : kMicroBatchSize;
    options.loss_scale = 0.25f;
    auto exec = Executor::Create(*schedule, model->get(), groups->pp.get(), options);
    if (!exec.ok()) return exec.status();
    auto result = exec->RunStep([&](int m) -> absl::StatusOr<MicroBatch> {
      MicroBatch mb = MakeMicroBatch(config, m);
      if (rank == dead) {
        mb.ids = RandomIds(config.seq_length, dead_micro_batch_size, config.vocab_size, m);
        mb.targets = mb.ids;
      }
      return mb;
    });
    absl::MutexLock lock(&mu);
    statuses[rank] = result.status();
    return absl::OkStatus();
  }, ShortTimeout());
  EXPECT_TRUE(s.ok()) << s;
  return statuses;
}

TEST(ExecutorErrorTest, DeadPeerFailsWithinTimeout) {
  const absl::Time start = absl::Now();
  std::vector<absl::Status> st = RunWithFaultyStage(2, /*dead=*/1, true, kMicroBatchSize);
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  ASSERT_FALSE(st[0].ok());
  EXPECT_EQ(st[0].code(), absl::StatusCode::kDeadlineExceeded) << st[0];
  // Stage 0's first receive from stage 1 is the grad of micro-batch 0.
  EXPECT_EQ(st[0].message().rfind("stage 0: ", 0), 0u) << st[0];
  EXPECT_NE(st[0].message().find("RecvGrad(micro-batch 0, chunk 0) from stage 1"),
            std::string::npos)
      << st[0];
}

TEST(ExecutorErrorTest, DeadInnerStageFailsEveryStage) {
  const absl::Time start = absl::Now();
  std::vector<absl::Status> st = RunWithFaultyStage(4, /*dead=*/2, true, kMicroBatchSize);
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  for (int r : {0, 1, 3}) {
    ASSERT_FALSE(st[r].ok()) << "stage " << r;
    EXPECT_EQ(st[r].message().rfind(absl::StrCat("stage ", r, ": "), 0), 0u) << st[r];
  }
  EXPECT_NE(st[3].message().find("RecvActivation(micro-batch 0, chunk 0) from stage 2"),
            std::string::npos)
      << st[3];
  EXPECT_NE(st[1].message().find("RecvGrad(micro-batch 0, chunk 0) from stage 2"),
            std::string::npos)
      << st[1];
}

TEST(ExecutorErrorTest, MismatchedBoundaryShapesAreReported) {
  // Stage 1 expects micro-batches of 3 while stage 0 sends micro-batches of 2.
  std::vector<absl::Status> st = RunWithFaultyStage(2, /*dead=*/1, false, 3);
  ASSERT_FALSE(st[1].ok());
  EXPECT_EQ(st[1].code(), absl::StatusCode::kInvalidArgument) << st[1];
  EXPECT_NE(st[1].message().find("stage 1: RecvActivation(micro-batch 0, chunk 0) from stage 0"),
            std::string::npos)
      << st[1];
  ASSERT_FALSE(st[0].ok());  // and its peer does not hang
}

}  // namespace
}  // namespace loom::pipeline
