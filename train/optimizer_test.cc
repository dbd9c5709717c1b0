#include "train/optimizer.h"

#include <cmath>

#include "gtest/gtest.h"
#include "layers/test_util.h"

namespace loom::train {
namespace {

using layers::ParamBuffer;
using layers::ParamSpec;
using layers::TpSplit;

std::vector<ParamSpec> Specs() {
  ParamSpec w;
  w.name = "w";
  w.global_shape = core::Shape{4, 6};
  w.split = TpSplit::kRows;
  ParamSpec b;
  b.name = "b";
  b.global_shape = core::Shape{5};
  b.split = TpSplit::kReplicated;
  b.weight_decay = false;
  return {w, b};
}

// Gradient of global element i of parameter `name` on DP rank r.
float Grad(const std::string& name, int64_t i, int r) {
  return 0.01f * static_cast<float>((i * 7 + r * 3) % 11) - 0.05f + (name == "b" ? 0.2f : 0.0f);
}

void FillGrads(ParamBuffer* buf, int dp_rank, int tp_rank = 0, int tp = 1) {
  for (layers::Param& p : buf->params()) {
    const int64_t n = p.grad.numel();
    const int64_t base = p.spec->split == TpSplit::kRows ? tp_rank * n : 0;
    for (int64_t i = 0; i < n; ++i) p.grad.data<float>()[i] = Grad(p.spec->name, base + i, dp_rank);
  }
}

TEST(OptimizerTest, AdamWMatchesTheFormulaAndSkipsDecayWhereAsked) {
  auto buf = ParamBuffer::Create(Specs(), 0, 1, 1);
  ASSERT_TRUE(buf.ok());
  std::vector<float> w0 = layers::testing::ToVector(buf->at("w").value);
  std::vector<float> b0 = layers::testing::ToVector(buf->at("b").value);
  OptimizerConfig c;
  c.weight_decay = 0.1f;
  c.clip_grad = 0;
  auto opt = Optimizer::Create(&*buf, c, {});
  ASSERT_TRUE(opt.ok());
  FillGrads(&*buf, 0);
  auto norm = (*opt)->ReduceGradients();
  ASSERT_TRUE(norm.ok());
  ASSERT_TRUE((*opt)->Step(0.01f).ok());
  // First step: m̂ = g, v̂ = g², update = lr (g / (|g| + eps) + wd p).
  for (int i = 0; i < 24; ++i) {
    const double g = Grad("w", i, 0);
    const double want = w0[i] - 0.01 * (g / (std::fabs(g) + 1e-8) + 0.1 * w0[i]);
    EXPECT_NEAR(buf->at("w").value.data<float>()[i], want, 1e-6);
  }
  for (int i = 0; i < 5; ++i) {
    const double g = Grad("b", i, 0);
    EXPECT_NEAR(buf->at("b").value.data<float>()[i], b0[i] - 0.01 * g / (std::fabs(g) + 1e-8), 1e-6);
  }
  EXPECT_EQ((*opt)->step_count(), 1);
}

TEST(OptimizerTest, ClippingScalesByTheGlobalNorm) {
  auto buf = ParamBuffer::Create(Specs(), 0, 1, 1);
  FillGrads(&*buf, 0);
  double sq = 0;
  for (int i = 0; i < 24; ++i) sq += double(Grad("w", i, 0)) * Grad("w", i, 0);
  for (int i = 0; i < 5; ++i) sq += double(Grad("b", i, 0)) * Grad("b", i, 0);
  OptimizerConfig c;
  c.clip_grad = 0.1f;
  auto opt = Optimizer::Create(&*buf, c, {});
  auto norm = (*opt)->ReduceGradients();
  ASSERT_TRUE(norm.ok());
  EXPECT_NEAR(*norm, std::sqrt(sq), 1e-6);
  ASSERT_GT(*norm, 0.1);
}

// DP = 2 and 3 ranks, plain and distributed: the parameters after two steps
// equal the single-rank run on the averaged gradients; the norms agree.
class DataParallelTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(DataParallelTest, MatchesSingleRankOnAveragedGradients) {
  const auto [dp, distributed] = GetParam();
  OptimizerConfig c;
  c.clip_grad = 0.5f;
  c.distributed = distributed;
  c.bucket_bytes = 32;  // several buckets
  // Reference: one rank, gradients averaged by hand.
  auto ref = ParamBuffer::Create(Specs(), 0, 1, 1);
  auto ref_opt = Optimizer::Create(&*ref, c, {});
  std::vector<double> ref_norms;
  for (int step = 0; step < 2; ++step) {
    for (layers::Param& p : ref->params()) {
      for (int64_t i = 0; i < p.grad.numel(); ++i) {
        double sum = 0;
        for (int r = 0; r < dp; ++r) sum += Grad(p.spec->name, i, r);
        p.grad.data<float>()[i] = static_cast<float>(sum / dp);
      }
    }
    ref_norms.push_back(*(*ref_opt)->ReduceGradients());
    ASSERT_TRUE((*ref_opt)->Step(0.05f).ok());
  }
  absl::Status s = layers::testing::RunRanks(dp, [&](int r, comm::Communicator* comm) -> absl::Status {
    auto buf = ParamBuffer::Create(Specs(), 0, 1, 1, /*multiple=*/dp);
    if (!buf.ok()) return buf.status();
    OptimizerGroups g;
    g.dp = comm;
    auto opt = Optimizer::Create(&*buf, c, g);
    if (!opt.ok()) return opt.status();
    for (int step = 0; step < 2; ++step) {
      FillGrads(&*buf, r);
      auto norm = (*opt)->ReduceGradients();
      if (!norm.ok()) return norm.status();
      EXPECT_NEAR(*norm, ref_norms[step], 1e-6);
      absl::Status st = (*opt)->Step(0.05f);
      if (!st.ok()) return st;
    }
    for (const char* name : {"w", "b"}) {
      EXPECT_LT(layers::testing::MaxRelativeError(layers::testing::ToVector(buf->at(name).value),
                                                  layers::testing::ToVector(ref->at(name).value)),
                1e-6)
          << name << " rank " << r;
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Layouts, DataParallelTest,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Bool()));

TEST(OptimizerTest, TensorParallelNormCountsReplicatedOnce) {
  // TP = 2: "w" is split by rows, "b" replicated. The global norm must equal
  // the single-rank norm of the full tensors.
  auto full = ParamBuffer::Create(Specs(), 0, 1, 1);
  FillGrads(&*full, 0);
  auto full_opt = Optimizer::Create(&*full, {}, {});
  const double want = *(*full_opt)->ReduceGradients();
  absl::Status s = layers::testing::RunRanks(2, [&](int r, comm::Communicator* comm) -> absl::Status {
    auto buf = ParamBuffer::Create(Specs(), r, 2, 1);
    if (!buf.ok()) return buf.status();
    FillGrads(&*buf, 0, r, 2);
    OptimizerGroups g;
    g.tp = comm;
    auto opt = Optimizer::Create(&*buf, {}, g);
    auto norm = (*opt)->ReduceGradients();
    if (!norm.ok()) return norm.status();
    EXPECT_NEAR(*norm, want, 1e-9);
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

TEST(OptimizerTest, DistributedNeedsAPaddedBuffer) {
  absl::Status s = layers::testing::RunRanks(2, [&](int, comm::Communicator* comm) -> absl::Status {
    auto buf = ParamBuffer::Create(Specs(), 0, 1, 1);  // 29 elements: not a multiple of 2
    OptimizerConfig c;
    c.distributed = true;
    OptimizerGroups g;
    g.dp = comm;
    auto opt = Optimizer::Create(&*buf, c, g);
    EXPECT_FALSE(opt.ok());
    EXPECT_NE(opt.status().message().find("--use-distributed-optimizer"), std::string::npos);
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace loom::train
