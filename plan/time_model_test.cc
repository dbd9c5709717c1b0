// The time model's arithmetic and its use of the pipeline simulator, and the
// enumeration and ordering of layouts (no timing: see docs/PLANNER.md).
#include "plan/time_model.h"

#include <algorithm>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt_config.h"
#include "plan/layout.h"
#include "plan/report.h"

namespace loom::plan {
namespace {

Hardware Ideal() {
  // No latency, one efficiency: costs are proportional to FLOPs and bytes.
  absl::StatusOr<Hardware> hw = ParseHardware(R"(
    name: "ideal" device_memory_bytes: 1e12 peak_flops: 1e12 memory_bandwidth: 1e15
    devices_per_node: 64 compute_dtype_bytes: 4
    intra_node { all_reduce { bus_bandwidth: 1e18 } }
    inter_node { all_reduce { bus_bandwidth: 1e18 } }
  )", "ideal");
  EXPECT_TRUE(hw.ok()) << hw.status();
  return *hw;
}

train::TrainConfig Model() {
  train::TrainConfig c;
  c.model.num_layers = 8;
  c.model.hidden_size = 256;
  c.model.num_attention_heads = 8;
  c.model.seq_length = 128;
  c.model.vocab_size = 512;
  c.micro_batch_size = 1;
  c.global_batch_size = 16;
  return c;
}

TEST(TimeModelTest, ModelFlopsAreTheSpecsFormula) {
  train::TrainConfig c = Model();
  ASSERT_TRUE(train::Finalize(&c, 1).ok());
  const double n = static_cast<double>(layers::ParameterCount(c.model));
  EXPECT_DOUBLE_EQ(ModelFlopsPerStep(c), (6 * n + 12.0 * 8 * 256 * 128) * 16 * 128);
}

TEST(TimeModelTest, PipelineBubbleComesFromTheSimulator) {
  const Hardware hw = Ideal();
  train::TrainConfig c = Model();
  c.pipeline_model_parallel_size = 4;
  ASSERT_TRUE(train::Finalize(&c, 4).ok());
  absl::StatusOr<StepTime> t = PredictStepTime(c, hw);
  ASSERT_TRUE(t.ok()) << t.status();
  // 1F1B with nearly uniform stages: (P − 1)/M = 3/16, a little more for the head's stage.
  EXPECT_GT(t->bubble_fraction, 3.0 / 16 * 0.9);
  EXPECT_LT(t->bubble_fraction, 3.0 / 16 * 1.5);
  EXPECT_EQ(t->in_flight.size(), 4u);
  EXPECT_EQ(t->in_flight[0], 4);  // warm-up P − 1 plus the one running
  EXPECT_EQ(t->in_flight[3], 1);
  EXPECT_NEAR(t->step, t->compute + t->exposed_comm + t->bubble, 1e-9);

  // Interleaving (v = 2) shrinks the bubble to about (P − 1)/(v·M).
  train::TrainConfig v = Model();
  v.pipeline_model_parallel_size = 4;
  v.num_layers_per_virtual_pipeline_stage = 1;
  ASSERT_TRUE(train::Finalize(&v, 4).ok());
  absl::StatusOr<StepTime> tv = PredictStepTime(v, hw);
  ASSERT_TRUE(tv.ok()) << tv.status();
  EXPECT_LT(tv->bubble_fraction, t->bubble_fraction * 0.7);
}

TEST(TimeModelTest, DataParallelismDividesComputeOnFreeLinks) {
  const Hardware hw = Ideal();
  train::TrainConfig one = Model(), two = Model();
  ASSERT_TRUE(train::Finalize(&one, 1).ok());
  ASSERT_TRUE(train::Finalize(&two, 2).ok());
  absl::StatusOr<StepTime> a = PredictStepTime(one, hw), b = PredictStepTime(two, hw);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NEAR(b->compute / a->compute, 0.5, 0.01);
  EXPECT_NEAR(b->mfu / a->mfu, 1.0, 0.02);
}

// The compute terms in closed form on one rank (M = 16 micro-batches of
// T = 128 tokens, L = 8 layers of h = 256, GELU MLP 4h, vocabulary 512),
// with the rates a CPU's --calibrate measures and without them.
TEST(TimeModelTest, ComputeTermsUseTheMeasuredRatesOrTheirFallbacks) {
  absl::StatusOr<Hardware> measured = ParseHardware(R"(
    name: "measured" device_memory_bytes: 1e12 peak_flops: 1e12 memory_bandwidth: 1e15
    elementwise_bandwidth: 1e11 optimizer_bandwidth: 2e11 attention_backward_ratio: 2
    attention_curve { flops: 1 efficiency: 0.25 }
    devices_per_node: 64 compute_dtype_bytes: 4
    intra_node { all_reduce { bus_bandwidth: 1e18 } }
    inter_node { all_reduce { bus_bandwidth: 1e18 } }
  )", "measured");
  ASSERT_TRUE(measured.ok()) << measured.status();
  train::TrainConfig c = Model();
  ASSERT_TRUE(train::Finalize(&c, 1).ok());
  ASSERT_EQ(c.model.ffn(), 1024);
  const double M = 16, L = 8, T = 128, h = 256, V = 512, X = T * h * 4;
  const double params = static_cast<double>(layers::ParameterCount(c.model));
  const double attention_flops = 2 * 2 * T * 128 * h * 0.5;  // QKᵀ and PV, causal half
  const double layer_gemm_flops = 2 * T * h * (3 * h + h + 4 * h + 4 * h);
  const double logits_flops = 2 * T * V * h;
  auto expect = [&](const StepTime& t, double attention_seconds, double elementwise_rate,
                    double optimizer_rate) {
    const ComputeTerms& k = t.terms;
    EXPECT_NEAR(k.gemm, M * (3 * L * layer_gemm_flops + 3 * logits_flops) / 1e12, 1e-9);
    EXPECT_NEAR(k.attention, M * L * attention_seconds, 1e-9);
    // 12·X + (2·4 + 4)·X per layer forward, twice that backward; the final norm 4·X + 8·X.
    EXPECT_NEAR(k.elementwise, M * (L * 3 * 24 * X + 12 * X) / elementwise_rate, 1e-9);
    EXPECT_NEAR(k.optimizer, params * 32 / optimizer_rate, 1e-9);
    EXPECT_NEAR(k.Total(), t.compute, 1e-9);
    EXPECT_NEAR(t.step, t.compute, 1e-9);  // one rank: no communication, no bubble
  };
  absl::StatusOr<StepTime> t = PredictStepTime(c, *measured);
  ASSERT_TRUE(t.ok()) << t.status();
  // Forward at the attention curve's 0.25 of peak, backward 2 forwards.
  expect(*t, 3 * attention_flops / (0.25 * 1e12), 1e11, 2e11);
  // Without them: memory_bandwidth for both, attention_efficiency (0: 1) × the
  // GEMM curve (empty: 1), backward 2.5 forwards.
  t = PredictStepTime(c, Ideal());
  ASSERT_TRUE(t.ok()) << t.status();
  expect(*t, 3.5 * attention_flops / 1e12, 1e15, 1e15);
}

TEST(TimeModelTest, TensorParallelCommunicationIsExposedOnSlowLinks) {
  absl::StatusOr<Hardware> slow = ParseHardware(R"(
    name: "slow" device_memory_bytes: 1e12 peak_flops: 1e12 memory_bandwidth: 1e15
    devices_per_node: 8
    intra_node { all_reduce { bus_bandwidth: 1e8 latency: 1e-4 } }
    inter_node { all_reduce { bus_bandwidth: 1e8 latency: 1e-4 } }
  )", "slow");
  ASSERT_TRUE(slow.ok());
  train::TrainConfig c = Model();
  c.tensor_model_parallel_size = 2;
  ASSERT_TRUE(train::Finalize(&c, 2).ok());
  absl::StatusOr<StepTime> t = PredictStepTime(c, *slow);
  ASSERT_TRUE(t.ok());
  EXPECT_GT(t->exposed_comm, t->compute);
}

TEST(LayoutTest, EveryLayoutIsValidAndCoversTheGrid) {
  train::TrainConfig base = Model();
  SearchOptions o;
  o.gpus = 8;
  int rejected = 0;
  const std::vector<train::TrainConfig> all = EnumerateLayouts(base, o, &rejected);
  ASSERT_FALSE(all.empty());
  std::set<std::string> seen;
  for (const train::TrainConfig& c : all) {
    EXPECT_EQ(c.tensor_model_parallel_size * c.pipeline_model_parallel_size *
                  c.data_parallel_size * c.context_parallel_size,
              8);
    EXPECT_TRUE(seen.insert(LayoutFlags(c)).second) << "duplicate " << LayoutFlags(c);
    train::TrainConfig again = c;
    EXPECT_TRUE(train::Finalize(&again, 8).ok()) << DescribeLayout(c);
  }
  for (const char* want : {"TP 8 PP 1 DP 1 SP mbs 1", "TP 1 PP 1 DP 8 mbs 2 dist-opt",
                           "TP 2 PP 2 VP 2 DP 2 mbs 1 rc selective",
                           "TP 1 PP 4 DP 2 mbs 1 rc full"}) {
    bool found = false;
    for (const train::TrainConfig& c : all) found |= DescribeLayout(c) == want;
    EXPECT_TRUE(found) << want;
  }
}

TEST(ReportTest, FittingLayoutsFirstFastestFirst) {
  absl::StatusOr<Hardware> hw = LoadHardware("plan/testdata/h100_dgx.textproto");
  ASSERT_TRUE(hw.ok()) << hw.status();
  train::TrainConfig base = Model();
  base.device = train::DeviceKind::kCuda;
  base.bf16 = true;
  SearchOptions o;
  o.gpus = 8;
  absl::StatusOr<std::vector<Planned>> plans = PlanAll(base, *hw, o, {});
  ASSERT_TRUE(plans.ok()) << plans.status();
  for (size_t i = 1; i < plans->size(); ++i) {
    const Planned &a = (*plans)[i - 1], &b = (*plans)[i];
    EXPECT_TRUE(a.fits >= b.fits);
    if (a.fits == b.fits) {
      EXPECT_LE(a.time.step, b.time.step);
    }
  }
  const std::string table = FormatTable(*plans, *hw, 5);
  EXPECT_NE(table.find("tokens/s"), std::string::npos);
  EXPECT_NE(Explain(plans->front(), *hw).find("pipeline::Simulate"), std::string::npos);
}

TEST(TimeModelTest, OverlappedGradientReductionHidesAllButTheLastLayers) {
  // Slow DP links: one step's reduction is as long as a good part of the
  // backward. --overlap-grad-reduce reduces layer by layer (GradientSync's
  // buckets) behind the last micro-batch's backward: what stays exposed is
  // less than the whole reduction and at least the last layer's share.
  absl::StatusOr<Hardware> hw = ParseHardware(R"(
    name: "slow dp" device_memory_bytes: 1e12 peak_flops: 1e12 memory_bandwidth: 1e15
    devices_per_node: 1 compute_dtype_bytes: 4
    intra_node { all_reduce { bus_bandwidth: 1e18 } }
    inter_node { all_reduce { bus_bandwidth: 2e9 } }
  )", "slow dp");
  ASSERT_TRUE(hw.ok()) << hw.status();
  train::TrainConfig c = Model();
  c.global_batch_size = 4;
  train::TrainConfig overlapped = c;
  overlapped.overlap_grad_reduce = true;
  ASSERT_TRUE(train::Finalize(&c, 4).ok());
  ASSERT_TRUE(train::Finalize(&overlapped, 4).ok());
  absl::StatusOr<StepTime> plain = PredictStepTime(c, *hw);
  absl::StatusOr<StepTime> hidden = PredictStepTime(overlapped, *hw);
  ASSERT_TRUE(plain.ok() && hidden.ok());
  EXPECT_DOUBLE_EQ(plain->dp_exposed, plain->dp_comm);
  EXPECT_LT(hidden->dp_exposed, 0.9 * hidden->dp_comm);
  EXPECT_GE(hidden->dp_exposed, hidden->dp_comm / 8 * 0.999);  // 8 layers: the last one's share
  EXPECT_LT(hidden->step, plain->step);
}

TEST(TimeModelTest, TpCommOverlapCostsTheSmsItTakes) {
  // One efficiency (chunking costs nothing), 100 SMs: Transformer Engine's
  // pipelined (proj, FC2 forward) and bulk (QKV, FC1 dgrad and wgrad) GEMMs
  // run on the 84 its 16 communication SMs leave.
  absl::StatusOr<Hardware> hw = ParseHardware(R"(
    name: "ideal, 100 SMs" device_memory_bytes: 1e12 peak_flops: 1e12 memory_bandwidth: 1e15
    devices_per_node: 64 compute_dtype_bytes: 4 compute_units: 100
    intra_node { all_reduce { bus_bandwidth: 1e18 } }
    inter_node { all_reduce { bus_bandwidth: 1e18 } }
  )", "sms");
  ASSERT_TRUE(hw.ok()) << hw.status();
  train::TrainConfig c = Model();
  c.tensor_model_parallel_size = 2;
  c.sequence_parallel = true;
  ASSERT_TRUE(train::Finalize(&c, 2).ok());
  TimeOptions overlap;
  overlap.tp_comm_overlap = true;
  absl::StatusOr<StepTime> plain = PredictStepTime(c, *hw);
  absl::StatusOr<StepTime> ub = PredictStepTime(c, *hw, overlap);
  ASSERT_TRUE(plain.ok() && ub.ok());
  EXPECT_EQ(plain->tp_overlap_cost_per_layer, 0);
  const double T = 128, h = 256, t = 2;
  const double qkv = 2 * T * 3 * h / t * h, proj = 2 * T * h * h / t;
  const double fc1 = 2 * T * 4 * h / t * h, fc2 = fc1;
  const double slowed = proj + fc2 + 2 * qkv + 2 * fc1;
  EXPECT_NEAR(ub->tp_overlap_cost_per_layer, slowed / 1e12 * (100.0 / 84 - 1), 1e-9);
  EXPECT_GT(ub->compute, plain->compute);
}

// --moe-a2a-overlap-chunks N: the expert-parallel all-to-alls pipelined with the experts. On
// one efficiency (chunking costs nothing) and links slower than the experts' GEMMs per chunk,
// exposed = a2a / N + (N - 1)(a2a - experts) / N per direction and layer; with the experts
// slower than the links, only a2a / N stays exposed.
TEST(TimeModelTest, MoeAllToAllOverlapHidesAllButAChunk) {
  auto hardware = [](double bandwidth) {
    absl::StatusOr<Hardware> hw = ParseHardware(absl::StrCat(R"(
      name: "ep" device_memory_bytes: 1e12 peak_flops: 1e12 memory_bandwidth: 1e15
      devices_per_node: 64 compute_dtype_bytes: 4
      intra_node { all_reduce { bus_bandwidth: 1e18 } all_to_all { bus_bandwidth: )",
                                                             bandwidth, R"( } }
      inter_node { all_reduce { bus_bandwidth: 1e18 } }
    )"), "ep");
    EXPECT_TRUE(hw.ok()) << hw.status();
    return *hw;
  };
  train::TrainConfig c = Model();
  c.model.num_layers = 2;
  c.model.num_experts = 4;
  c.model.moe_router_topk = 2;
  c.model.moe_layer_freq = 1;
  c.model.add_bias_linear = false;
  c.expert_model_parallel_size = 2;
  c.global_batch_size = 2;
  ASSERT_TRUE(train::Finalize(&c, 2).ok()) << train::Finalize(&c, 2);
  for (double bandwidth : {1e8, 1e12}) {  // links slower, then faster, than the experts
    const Hardware hw = hardware(bandwidth);
    absl::StatusOr<StepTime> plain = PredictStepTime(c, hw);
    train::TrainConfig chunked = c;
    chunked.model.moe_a2a_overlap_chunks = 4;
    absl::StatusOr<StepTime> overlap = PredictStepTime(chunked, hw);
    ASSERT_TRUE(plain.ok() && overlap.ok());
    EXPECT_DOUBLE_EQ(overlap->compute, plain->compute);  // one efficiency: chunks cost nothing
    EXPECT_LT(overlap->exposed_comm, plain->exposed_comm) << bandwidth;
    // Per direction and layer: two layers, two directions, M micro-batches (DP's exposed
    // reduction, the same in both, set aside).
    const double T = 128, h = 256, E = 4, k = 2, ep = 2, ffn = 4 * h;
    const double experts = (E / ep) * 2 * (2 * (T * k * ep / E) * ffn * h) / 1e12;
    const double per = 2.0 * 2 * c.num_micro_batches;
    const double a2a = (plain->exposed_comm - plain->dp_exposed) / per;
    const double want = a2a / 4 + 3 * std::max(0.0, (a2a - experts) / 4);
    EXPECT_NEAR((overlap->exposed_comm - overlap->dp_exposed) / per, want, 1e-9 * a2a)
        << bandwidth;
  }
}

// ZeRO-3 gathers every layer before its forward and before its backward in each micro-batch:
// 2M times ZeRO-1's one gather after the step, all of it exposed without
// --overlap-param-gather; with it, on links fast enough for a layer's gather to hide behind a
// layer's compute, only the first layer's gather of each pass.
TEST(TimeModelTest, ZeroThreeGathersEveryLayerTwiceAMicroBatch) {
  absl::StatusOr<Hardware> hw = ParseHardware(R"(
    name: "dp" device_memory_bytes: 1e12 peak_flops: 1e12 memory_bandwidth: 1e15
    devices_per_node: 64 compute_dtype_bytes: 4
    intra_node { all_reduce { bus_bandwidth: 1e12 } all_gather { bus_bandwidth: 1e12 }
                 reduce_scatter { bus_bandwidth: 1e12 } }
    inter_node { all_reduce { bus_bandwidth: 1e12 } }
  )", "dp");
  ASSERT_TRUE(hw.ok()) << hw.status();
  train::TrainConfig c = Model();
  c.global_batch_size = 8;  // DP 2 x micro-batch 1: M = 4
  c.data_parallel_sharding_strategy = train::ShardingStrategy::kOptim;
  train::TrainConfig z3 = c;
  z3.data_parallel_sharding_strategy = train::ShardingStrategy::kOptimGradsParams;
  ASSERT_TRUE(train::Finalize(&c, 2).ok());
  ASSERT_TRUE(train::Finalize(&z3, 2).ok());
  absl::StatusOr<StepTime> one = PredictStepTime(c, *hw), three = PredictStepTime(z3, *hw);
  ASSERT_TRUE(one.ok() && three.ok());
  const double m = z3.num_micro_batches;
  EXPECT_EQ(m, 4);
  // Gathers: 2M passes of ZeRO-1's one; the reduce-scatters: M rounds (ZeRO-2's).
  ASSERT_GT(one->dp_gather, 0);
  EXPECT_NEAR(three->dp_gather, 2 * m * one->dp_gather, 1e-9 * one->dp_gather);
  const double reduce = one->dp_comm - one->dp_gather;
  EXPECT_NEAR(three->dp_comm - three->dp_gather, m * reduce, 1e-9 * reduce);
  EXPECT_NEAR(three->dp_exposed, three->dp_comm, 1e-9 * three->dp_comm);  // no overlap asked
  train::TrainConfig hidden = z3;
  hidden.overlap_param_gather = true;
  absl::StatusOr<StepTime> prefetched = PredictStepTime(hidden, *hw);
  ASSERT_TRUE(prefetched.ok());
  EXPECT_LT(prefetched->dp_exposed, three->dp_exposed);
}

TEST(TimeModelTest, WhyTheRestLoseNamesEachRowsLargestExcess) {
  const Hardware hw = Ideal();
  SearchOptions search;
  search.gpus = 8;
  search.devices_per_node = 8;
  absl::StatusOr<std::vector<Planned>> plans = PlanAll(Model(), hw, search, {});
  ASSERT_TRUE(plans.ok()) << plans.status();
  ASSERT_GT(plans->size(), 3u);
  const std::string why = WhyTheyLose(*plans, hw, 3);
  EXPECT_NE(why.find("against #1 (" + DescribeLayout(plans->front().config)), std::string::npos)
      << why;
  EXPECT_NE(why.find(std::to_string(plans->size() - 1) + " fit and are slower"), std::string::npos)
      << why;
  const Planned& second = (*plans)[1];
  const double excess[3] = {second.time.compute - plans->front().time.compute,
                            second.time.exposed_comm - plans->front().time.exposed_comm,
                            second.time.bubble - plans->front().time.bubble};
  const char* terms[3] = {"compute", "exposed communication", "bubble"};
  const int largest = static_cast<int>(std::max_element(excess, excess + 3) - excess);
  const size_t line = why.find("#2 " + DescribeLayout(second.config) + ":");
  ASSERT_NE(line, std::string::npos) << why;
  EXPECT_NE(why.find(std::string("(mostly ") + terms[largest] + ")", line), std::string::npos)
      << why;
  EXPECT_EQ(why.find("#4 "), std::string::npos) << "rows 2 and 3 only: " << why;
}

}  // namespace
}  // namespace loom::plan
