// GradientSync against gradients averaged by hand: every combination of
// overlap with the backward, ZeRO-1 sharding and DP size gives the average of
// the ranks' own gradients on the ranges each rank owns; buckets tile the
// buffer; ZeRO-1 parameter gathers (overlapped or not) leave every rank with
// every owner's values.
#include "distributed/gradient_sync.h"

#include <tuple>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "layers/test_util.h"

namespace loom::distributed {
namespace {

using core::Tensor;
using layers::GptModel;
using layers::testing::RandomIds;
using layers::testing::ToVector;

constexpr int kMicroBatches = 3;

layers::GptConfig TinyModel() {
  layers::GptConfig c;
  c.num_layers = 3;
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.seq_length = 8;
  c.vocab_size = 30;
  c.make_vocab_size_divisible_by = 2;
  return c;
}

// Forward and backward of DP rank r's micro-batches (gradients accumulate).
absl::Status RunBackward(GptModel* model, int r) {
  const layers::GptConfig& c = model->config();
  for (int m = 0; m < kMicroBatches; ++m) {
    Tensor ids = RandomIds(c.seq_length, 2, c.vocab_size, 10 * r + m);
    GptModel::Saved saved;
    double loss;
    LOOM_RETURN_IF_ERROR(model->Forward(0, ids, ids, {}, &saved, &loss).status());
    LOOM_RETURN_IF_ERROR(model->Backward(0, Tensor(), 1.0f / kMicroBatches, {}, saved).status());
  }
  return absl::OkStatus();
}

// The flat gradient buffer averaged over DP ranks 0..dp-1, computed on one
// rank without any communication.
std::vector<float> AveragedByHand(int dp) {
  std::vector<float> sum;
  for (int r = 0; r < dp; ++r) {
    auto model = GptModel::Create(TinyModel(), layers::TpGroup{}, {{0, 3, true, true}}, dp);
    EXPECT_TRUE(model.ok());
    EXPECT_TRUE(RunBackward(model->get(), r).ok());
    std::vector<float> g = ToVector((*model)->params().flat_grads());
    if (sum.empty()) sum.assign(g.size(), 0.0f);
    for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
  }
  for (float& x : sum) x /= dp;
  return sum;
}

class GradientSyncTest : public ::testing::TestWithParam<std::tuple<int, bool, bool>> {};

TEST_P(GradientSyncTest, OwnedGradientsAreTheDataParallelAverage) {
  const auto [dp, overlap, sharded] = GetParam();
  const std::vector<float> want = AveragedByHand(dp);
  std::vector<std::vector<FlatRange>> owned(dp);
  absl::Status s = layers::testing::RunRanks(dp, [&](int r, comm::Communicator* comm) -> absl::Status {
    auto model = GptModel::Create(TinyModel(), layers::TpGroup{}, {{0, 3, true, true}}, dp);
    if (!model.ok()) return model.status();
    GradientSyncOptions o;
    o.micro_batches = kMicroBatches;
    o.bucket_bytes = 64;  // one unit a bucket
    o.overlap_grad_reduce = overlap;
    o.distributed_optimizer = sharded;
    LOOM_ASSIGN_OR_RETURN(auto sync, GradientSync::Create(model->get(), {comm, nullptr}, o));
    for (int step = 0; step < 2; ++step) {  // the second step starts from zero again
      LOOM_RETURN_IF_ERROR(sync->StartStep());
      LOOM_RETURN_IF_ERROR(RunBackward(model->get(), r));
      // Every layer and the head start during the backward; the embedding
      // bucket completes with the backward's very last op.
      EXPECT_EQ(sync->buckets_started_early(), overlap ? static_cast<int>(sync->buckets().size()) : 0);
      LOOM_RETURN_IF_ERROR(sync->FinishGradients());
    }
    const std::vector<float> got = ToVector((*model)->params().flat_grads());
    for (const auto& [begin, end] : sync->owned()) {
      for (int64_t i = begin; i < end; ++i) {
        EXPECT_NEAR(got[i], want[i], 1e-6 + 1e-5 * std::abs(want[i])) << "rank " << r << " element " << i;
      }
    }
    owned[r] = sync->owned();
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  // The owned ranges of all ranks tile the buffer exactly once.
  std::vector<int> covered(want.size(), 0);
  for (const auto& ranges : owned) {
    for (const auto& [begin, end] : ranges) {
      for (int64_t i = begin; i < end; ++i) ++covered[i];
    }
  }
  for (size_t i = 0; i < covered.size(); ++i) {
    ASSERT_EQ(covered[i], sharded ? 1 : dp) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, GradientSyncTest,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Bool(),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return absl::StrCat("dp", std::get<0>(info.param),
                                               std::get<1>(info.param) ? "_overlap" : "",
                                               std::get<2>(info.param) ? "_zero1" : "");
                         });

TEST(GradientSyncLayoutTest, BucketsTileTheBufferInWholeParameterSlots) {
  for (const int64_t bucket_bytes : {int64_t{64}, int64_t{4096}, int64_t{1} << 30}) {
    auto model = GptModel::Create(TinyModel(), layers::TpGroup{}, {{0, 3, true, true}}, 4);
    ASSERT_TRUE(model.ok());
    GradientSyncOptions o;
    o.bucket_bytes = bucket_bytes;
    auto sync = GradientSync::Create(model->get(), {}, o);
    ASSERT_TRUE(sync.ok()) << sync.status();
    const layers::ParamBuffer& params = (*model)->params();
    int64_t at = 0;
    for (const GradBucket& b : (*sync)->buckets()) {
      EXPECT_EQ(b.range.first, at);
      EXPECT_EQ((b.range.second - b.range.first) % 4, 0);
      EXPECT_FALSE(b.units.empty());
      at = b.range.second;
      bool starts_a_slot = false;
      for (const layers::Param& p : params.params()) starts_a_slot |= p.offset == b.range.first;
      EXPECT_TRUE(starts_a_slot) << "bucket at " << b.range.first;
    }
    EXPECT_EQ(at, params.padded_numel());
    if (bucket_bytes == 64) EXPECT_EQ((*sync)->buckets().size(), 5u);  // embedding, 3 layers, head
    if (bucket_bytes == int64_t{1} << 30) EXPECT_EQ((*sync)->buckets().size(), 1u);
  }
}

// ZeRO-1: after StartParamGather every rank holds every owner's values; with
// --overlap-param-gather the forward waits for what it reads.
class ParamGatherTest : public ::testing::TestWithParam<bool> {};

TEST_P(ParamGatherTest, EveryRankEndsWithEveryOwnersValues) {
  const bool overlap = GetParam();
  constexpr int kDp = 2;
  absl::Status s = layers::testing::RunRanks(kDp, [&](int r, comm::Communicator* comm) -> absl::Status {
    auto model = GptModel::Create(TinyModel(), layers::TpGroup{}, {{0, 3, true, true}}, kDp);
    if (!model.ok()) return model.status();
    GradientSyncOptions o;
    o.bucket_bytes = 64;
    o.distributed_optimizer = true;
    o.overlap_param_gather = overlap;
    LOOM_ASSIGN_OR_RETURN(auto sync, GradientSync::Create(model->get(), {comm, nullptr}, o));
    // "Update" the owned values to a mark that names the owner and the place.
    float* values = (*model)->params().flat_values().data<float>();
    for (const auto& [begin, end] : sync->owned()) {
      for (int64_t i = begin; i < end; ++i) values[i] = 1000.0f * (r + 1) + static_cast<float>(i % 97);
    }
    LOOM_RETURN_IF_ERROR(sync->StartParamGather());
    if (overlap) {
      // A forward reads every unit: its hooks wait for every bucket.
      Tensor ids = RandomIds(8, 1, 30, 1);
      GptModel::Saved saved;
      double loss;
      LOOM_RETURN_IF_ERROR((*model)->Forward(0, ids, ids, {}, &saved, &loss).status());
      EXPECT_GT(sync->exposed_gather_seconds(), 0.0);
    }
    LOOM_RETURN_IF_ERROR(sync->FinishParamGather());
    for (const GradBucket& b : sync->buckets()) {
      const int64_t half = (b.range.second - b.range.first) / kDp;
      for (int64_t i = b.range.first; i < b.range.second; ++i) {
        const int owner = static_cast<int>((i - b.range.first) / half);
        EXPECT_EQ(values[i], 1000.0f * (owner + 1) + static_cast<float>(i % 97))
            << "rank " << r << " element " << i;
      }
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Overlap, ParamGatherTest, ::testing::Bool());

TEST(GradientSyncTest, OverlapParamGatherNeedsTheDistributedOptimizer) {
  auto model = GptModel::Create(TinyModel(), layers::TpGroup{});
  ASSERT_TRUE(model.ok());
  GradientSyncOptions o;
  o.overlap_param_gather = true;
  auto sync = GradientSync::Create(model->get(), {}, o);
  ASSERT_FALSE(sync.ok());
  EXPECT_NE(sync.status().message().find("--use-distributed-optimizer"), std::string::npos);
}

}  // namespace
}  // namespace loom::distributed
