// GradientSync against gradients averaged by hand: every combination of
// overlap with the backward, ZeRO-1 sharding and DP size gives the average of
// the ranks' own gradients on the ranges each rank owns; buckets tile the
// buffer; ZeRO-1 parameter gathers (overlapped or not) leave every rank with
// every owner's values; under expert parallelism ZeRO-1 shards the experts
// over their replicas and the rest over DP. ZeRO-2 (optim_grads) gives the
// same average in the owned shard, from reduce-scatters in every
// micro-batch, without ever holding the whole gradient buffer.
#include "distributed/gradient_sync.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "layers/test_util.h"
#include "models/gpt/gpt_model.h"

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
    if (bucket_bytes == 64) {
      EXPECT_EQ((*sync)->buckets().size(), 5u);  // embedding, 3 layers, head
    }
    if (bucket_bytes == int64_t{1} << 30) {
      EXPECT_EQ((*sync)->buckets().size(), 1u);
    }
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

// EP 2 within DP 4 under ZeRO-1, on fixed gradients (rank r's element i is
// (r + 1) * (1 + i % 7)): the dense parts are averaged and sharded over DP,
// the experts' over their replicas (ranks r and r + 2) and scaled by 1 / EP;
// the gather gives each rank its group's owners' values.
TEST(GradientSyncExpertTest, ZeroOneShardsExpertsOverTheirReplicas) {
  constexpr int kDp = 4, kEp = 2;
  layers::GptConfig c = TinyModel();
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.add_bias_linear = false;
  std::vector<std::vector<FlatRange>> owned(kDp);
  std::vector<std::vector<float>> gathered(kDp);
  std::vector<bool> expert;  // per flat element
  absl::Status s =
      layers::testing::RunRanks(kDp, [&](int r, comm::Communicator* comm) -> absl::Status {
        // EP ranks are consecutive DP ranks; expert_dp joins those with the same experts.
        LOOM_ASSIGN_OR_RETURN(auto ep, comm->Split(r / kEp, r % kEp, "ep"));
        LOOM_ASSIGN_OR_RETURN(auto expert_dp, comm->Split(r % kEp, r / kEp, "expert_dp"));
        LOOM_ASSIGN_OR_RETURN(
            auto model, GptModel::Create(c, layers::TpGroup{}, layers::CpGroup{},
                                         {{0, 3, true, true}}, kDp, layers::EpGroup{ep.get()}));
        GradientSyncOptions o;
        o.bucket_bytes = 64;
        o.distributed_optimizer = true;
        LOOM_ASSIGN_OR_RETURN(
            auto sync, GradientSync::Create(model.get(), {comm, nullptr, expert_dp.get(), kEp}, o));
        layers::ParamBuffer& params = model->params();
        float* grads = params.flat_grads().data<float>();
        for (int64_t i = 0; i < params.padded_numel(); ++i) grads[i] = (r + 1) * (1.0f + i % 7);
        LOOM_RETURN_IF_ERROR(sync->FinishGradients());
        std::vector<bool> is_expert(params.padded_numel(), false);
        for (size_t p = 0; p < params.params().size(); ++p) {
          const int64_t end = params.SlotEnd({static_cast<int>(p)});
          for (int64_t i = params.params()[p].offset; i < end; ++i) {
            is_expert[i] = params.params()[p].spec->expert;
          }
        }
        float* values = params.flat_values().data<float>();
        for (const auto& [begin, end] : sync->owned()) {
          for (int64_t i = begin; i < end; ++i) {
            // Dense: the mean of 1..4; experts: of r % 2 + 1 and r % 2 + 3, over EP.
            const float mean = is_expert[i] ? (r % kEp + 2) / static_cast<float>(kEp) : 2.5f;
            EXPECT_FLOAT_EQ(grads[i], mean * (1.0f + i % 7)) << "rank " << r << " element " << i;
            values[i] = 1000.0f * (r + 1) + static_cast<float>(i % 97);
          }
        }
        LOOM_RETURN_IF_ERROR(sync->StartParamGather());
        owned[r] = sync->owned();
        gathered[r] = ToVector(params.flat_values());
        if (r == 0) expert = is_expert;
        return absl::OkStatus();
      });
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_GT(std::count(expert.begin(), expert.end(), true), 0) << "no expert weights";
  // Each dense element is owned once over DP, each expert element once over
  // its replicas; every rank ends with its owners' values.
  for (int64_t i = 0; i < static_cast<int64_t>(expert.size()); ++i) {
    for (int r = 0; r < kDp; ++r) {
      std::vector<int> owners;
      for (int o = 0; o < kDp; ++o) {
        if (expert[i] && o % kEp != r % kEp) continue;  // holds other experts
        for (const auto& [begin, end] : owned[o]) {
          if (begin <= i && i < end) owners.push_back(o);
        }
      }
      ASSERT_EQ(owners.size(), 1u) << "element " << i << (expert[i] ? " (expert)" : "");
      EXPECT_EQ(gathered[r][i], 1000.0f * (owners[0] + 1) + static_cast<float>(i % 97))
          << "rank " << r << " element " << i;
    }
  }
}

// ZeRO-2: the owned shard holds the DP average after every micro-batch's
// bucket was reduce-scattered; the whole buffer is gone, Param::grad is
// bound only during a bucket's backward, and the pool holds buffers only
// for the buckets being written at once (and one more in flight with
// --overlap-grad-reduce).
class OptimGradsTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(OptimGradsTest, OwnedShardIsTheDataParallelAverage) {
  const auto [dp, overlap] = GetParam();
  const std::vector<float> want = AveragedByHand(dp);
  absl::Status s = layers::testing::RunRanks(dp, [&](int r, comm::Communicator* comm) -> absl::Status {
    auto model = GptModel::Create(TinyModel(), layers::TpGroup{}, {{0, 3, true, true}}, dp);
    if (!model.ok()) return model.status();
    GradientSyncOptions o;
    o.micro_batches = kMicroBatches;
    o.bucket_bytes = 64;  // one unit a bucket
    o.overlap_grad_reduce = overlap;
    o.distributed_optimizer = true;
    o.shard_gradients = true;
    LOOM_ASSIGN_OR_RETURN(auto sync, GradientSync::Create(model->get(), {comm, nullptr}, o));
    EXPECT_FALSE((*model)->params().flat_grads().defined());
    for (int step = 0; step < 2; ++step) {  // the second step starts from zero again
      LOOM_RETURN_IF_ERROR(sync->StartStep());
      LOOM_RETURN_IF_ERROR(RunBackward(model->get(), r));
      // One reduce-scatter per bucket and micro-batch, all from the backward.
      EXPECT_EQ(sync->buckets_started_early(),
                kMicroBatches * static_cast<int>(sync->buckets().size()));
      LOOM_RETURN_IF_ERROR(sync->FinishGradients());
    }
    const std::vector<float> got = ToVector(sync->owned_grads());
    EXPECT_EQ(static_cast<int64_t>(got.size()), sync->owned_numel());
    EXPECT_EQ(sync->owned_numel() * dp, (*model)->params().padded_numel());
    int64_t at = 0;
    for (const auto& [begin, end] : sync->owned()) {
      for (int64_t i = begin; i < end; ++i, ++at) {
        EXPECT_NEAR(got[at], want[i], 1e-6 + 1e-5 * std::abs(want[i]))
            << "rank " << r << " element " << i;
      }
    }
    for (const layers::Param& p : (*model)->params().params()) {
      EXPECT_FALSE(p.grad.defined()) << p.spec->name << " still bound after the step";
    }
    // The buffers: the word embedding's bucket (the tied output layer writes
    // it first, the embedding completes it: bound all backward long), and
    // one for the largest of the others (they fit in it one after the
    // other), two with overlap (one reduce-scatters behind the next).
    const layers::ParamBuffer& params = (*model)->params();
    const int64_t word = params.at((*model)->word_embedding()).offset;
    int64_t word_bucket = 0, other = 0;
    for (const GradBucket& b : sync->buckets()) {
      const int64_t len = b.range.second - b.range.first;
      if (b.range.first <= word && word < b.range.second) {
        word_bucket = len;
      } else {
        other = std::max(other, len);
      }
    }
    EXPECT_EQ(sync->grad_buffers(), 2 + (overlap ? 1 : 0));
    EXPECT_EQ(sync->grad_buffer_bytes(), 4 * (word_bucket + (overlap ? 2 : 1) * other));
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Layouts, OptimGradsTest,
                         ::testing::Combine(::testing::Values(2, 3, 4), ::testing::Bool()),
                         [](const auto& info) {
                           return absl::StrCat("dp", std::get<0>(info.param),
                                               std::get<1>(info.param) ? "_overlap" : "");
                         });

// EP 2 within DP 4, MoE: ZeRO-2's owned shard equals ZeRO-1's owned ranges
// after the same backwards (experts over their replicas, scaled by 1 / EP).
TEST(GradientSyncExpertTest, OptimGradsMatchesZeroOne) {
  constexpr int kDp = 4, kEp = 2;
  layers::GptConfig c = TinyModel();
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.add_bias_linear = false;
  absl::Status s =
      layers::testing::RunRanks(kDp, [&](int r, comm::Communicator* comm) -> absl::Status {
        LOOM_ASSIGN_OR_RETURN(auto ep, comm->Split(r / kEp, r % kEp, "ep"));
        LOOM_ASSIGN_OR_RETURN(auto expert_dp, comm->Split(r % kEp, r / kEp, "expert_dp"));
        std::vector<std::vector<float>> owned_grads(2);
        std::vector<FlatRange> owned;
        for (const bool zero2 : {false, true}) {
          LOOM_ASSIGN_OR_RETURN(
              auto model, GptModel::Create(c, layers::TpGroup{}, layers::CpGroup{},
                                           {{0, 3, true, true}}, kDp, layers::EpGroup{ep.get()}));
          GradientSyncOptions o;
          o.micro_batches = kMicroBatches;
          o.bucket_bytes = 64;
          o.overlap_grad_reduce = true;
          o.distributed_optimizer = true;
          o.shard_gradients = zero2;
          LOOM_ASSIGN_OR_RETURN(auto sync, GradientSync::Create(
                                               model.get(), {comm, nullptr, expert_dp.get(), kEp}, o));
          LOOM_RETURN_IF_ERROR(sync->StartStep());
          LOOM_RETURN_IF_ERROR(RunBackward(model.get(), r));
          LOOM_RETURN_IF_ERROR(sync->FinishGradients());
          if (zero2) {
            owned_grads[1] = ToVector(sync->owned_grads());
            EXPECT_EQ(sync->owned(), owned);
          } else {
            const std::vector<float> flat = ToVector(model->params().flat_grads());
            for (const auto& [begin, end] : sync->owned()) {
              owned_grads[0].insert(owned_grads[0].end(), flat.begin() + begin, flat.begin() + end);
            }
            owned = sync->owned();
          }
        }
        EXPECT_EQ(owned_grads[0].size(), owned_grads[1].size());
        for (size_t i = 0; i < owned_grads[0].size() && i < owned_grads[1].size(); ++i) {
          EXPECT_NEAR(owned_grads[1][i], owned_grads[0][i], 1e-6 + 1e-5 * std::abs(owned_grads[0][i]))
              << "rank " << r << " owned element " << i;
        }
        return absl::OkStatus();
      });
  ASSERT_TRUE(s.ok()) << s;
}

// ZeRO-3 with --overlap-param-gather prefetches across passes: a unit's
// gather is kept when it ends, so the backward starts with the head the
// forward ended with and the next forward with the embedding the backward
// ended with. Per step only the first forward's first unit is gathered cold
// (within a pass only: every pass's first unit, 2 per micro-batch), and the
// owned gradients are the same bits.
TEST(GradientSyncTest, ZeroThreePrefetchesAcrossPassesWithTheSameGradients) {
  constexpr int kDp = 2;
  std::vector<float> grads[2][kDp];
  int cold[2][kDp] = {};
  for (const bool across : {false, true}) {
    absl::Status s =
        layers::testing::RunRanks(kDp, [&](int r, comm::Communicator* comm) -> absl::Status {
          layers::GptConfig c = TinyModel();
          c.allocate_gradients = c.allocate_parameters = false;
          auto model = GptModel::Create(c, layers::TpGroup{}, {{0, 3, true, true}}, kDp);
          if (!model.ok()) return model.status();
          GradientSyncOptions o;
          o.micro_batches = kMicroBatches;
          o.bucket_bytes = 64;  // one unit a bucket
          o.distributed_optimizer = o.shard_gradients = o.shard_params = true;
          o.overlap_grad_reduce = o.overlap_param_gather = true;
          o.prefetch_across_passes = across;
          LOOM_ASSIGN_OR_RETURN(auto sync, GradientSync::Create(model->get(), {comm, nullptr}, o));
          for (int step = 0; step < 2; ++step) {
            LOOM_RETURN_IF_ERROR(sync->StartStep());
            LOOM_RETURN_IF_ERROR(RunBackward(model->get(), r));
            LOOM_RETURN_IF_ERROR(sync->FinishGradients());
            EXPECT_EQ(sync->gathered_bytes(), 0) << "a gather outlived the step";
          }
          cold[across][r] = sync->cold_gathers();
          grads[across][r] = ToVector(sync->owned_grads());
          return absl::OkStatus();
        });
    ASSERT_TRUE(s.ok()) << s;
  }
  for (int r = 0; r < kDp; ++r) {
    EXPECT_EQ(cold[false][r], 2 * kMicroBatches) << "rank " << r;
    EXPECT_EQ(cold[true][r], 1) << "rank " << r;
    EXPECT_EQ(grads[true][r], grads[false][r]) << "rank " << r;
    EXPECT_FALSE(grads[true][r].empty());
  }
}

TEST(GradientSyncTest, OptimGradsNeedsTheDistributedOptimizer) {
  auto model = GptModel::Create(TinyModel(), layers::TpGroup{});
  ASSERT_TRUE(model.ok());
  GradientSyncOptions o;
  o.shard_gradients = true;
  auto sync = GradientSync::Create(model->get(), {}, o);
  ASSERT_FALSE(sync.ok());
  EXPECT_NE(sync.status().message().find("optim_grads"), std::string::npos);
}

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
