// Expert parallelism: an MoE layer over EP ranks (threads on the `local`
// backend), each with its own tokens and E/EP experts, gives every rank the
// output and input gradient the whole layer gives its tokens on one rank;
// each expert's gradient is the sum over every rank's tokens, the router's
// the rank's own (data parallelism sums it later). Also when some ranks
// receive no token at all (a reported Megatron crash), with a capacity, and
// combined with TP.

#include <map>
#include <string>
#include <vector>

#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "models/gpt/moe_block.h"
#include "models/gpt/test_util.h"

namespace loom::layers {
namespace {

using core::Shape;
using core::Tensor;
using testing::MaxRelativeError;
using testing::ToVector;

constexpr double kTolerance = 1e-5;
constexpr int64_t kSeq = 6, kBatch = 2;

GptConfig Config(int64_t experts) {
  GptConfig c;
  c.num_layers = 1;
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.seq_length = kSeq;
  c.swiglu = true;
  c.ffn_hidden_size = 24;
  c.add_bias_linear = false;
  c.normalization = layers::Normalization::kRMSNorm;
  c.num_experts = experts;
  c.moe_router_topk = 2;
  c.moe_aux_loss_coeff = 0.01f;
  c.moe_z_loss_coeff = 0.001f;
  c.init_method_std = 0.2f;
  c.seed = 5;
  return c;
}

struct Layer {
  ParamBuffer params;
  std::unique_ptr<MoeMlp> moe;
};

Layer MakeLayer(const GptConfig& c, TpGroup tp, EpGroup ep, bool zero_router) {
  Layer l;
  l.params = *ParamBuffer::Create(BlockParamSpecs(c, 0, ep.shard()), tp.rank(), tp.size(), c.seed);
  Param* router = &l.params.at("layers.0.mlp.router.weight");
  if (zero_router) {  // every logit ties: every token to experts 0 and 1
    std::fill(router->value.data<float>(), router->value.data<float>() + router->value.numel(), 0.0f);
  }
  l.moe = std::make_unique<MoeMlp>(MoeMlpForLayer(&l.params, c, 0, tp, ep));
  return l;
}

struct Result {
  std::vector<float> y, dx;
  std::map<std::string, std::vector<float>> grads;  // global name -> full gradient
};

// One rank's tokens through a layer: output, input gradient, gradients.
absl::StatusOr<Result> Run(Layer& l, int rank, TpGroup tp) {
  LOOM_RETURN_IF_ERROR(l.params.ZeroGrads());
  const Tensor x = testing::RandomTensor(Shape{kSeq, kBatch, 16}, 100 + rank);
  const Tensor dy = testing::RandomTensor(Shape{kSeq, kBatch, 16}, 200 + rank);
  MoeMlp::Saved saved;
  LOOM_ASSIGN_OR_RETURN(Tensor y, l.moe->Forward(x, &saved));
  LOOM_ASSIGN_OR_RETURN(Tensor dx, l.moe->Backward(dy, 0.5f, saved));
  Result r{ToVector(y), ToVector(dx), {}};
  for (Param& p : l.params.params()) {
    LOOM_ASSIGN_OR_RETURN(r.grads[p.spec->name], testing::GatherFull(p, tp, /*grad=*/true));
  }
  return r;
}

void ExpectMatchesOneRank(int ep_size, int tp_size, GptConfig c, bool zero_router) {
  // The reference: one rank with every expert runs each EP rank's tokens.
  std::vector<Result> ref;
  Layer whole = MakeLayer(c, {}, {}, zero_router);
  for (int r = 0; r < ep_size; ++r) {
    auto got = Run(whole, r, {});
    ASSERT_TRUE(got.ok()) << got.status();
    ref.push_back(*got);
  }
  absl::Status s = testing::RunRanks(ep_size * tp_size, [&](int rank, comm::Communicator* world)
                                                             -> absl::Status {
    // TP varies fastest: ranks {2e, 2e+1} are one TP group, {t, t+2} one EP group.
    const int tp_rank = rank % tp_size, ep_rank = rank / tp_size;
    LOOM_ASSIGN_OR_RETURN(auto tp_comm, world->Split(ep_rank, tp_rank, "tp"));
    LOOM_ASSIGN_OR_RETURN(auto ep_comm, world->Split(tp_rank, ep_rank, "ep"));
    TpGroup tp{tp_comm.get(), false};
    EpGroup ep{ep_comm.get()};
    Layer l = MakeLayer(c, tp, ep, zero_router);
    LOOM_ASSIGN_OR_RETURN(Result got, Run(l, ep_rank, tp));
    const Result& want = ref[ep_rank];
    EXPECT_LT(MaxRelativeError(got.y, want.y), kTolerance) << "output, rank " << rank;
    EXPECT_LT(MaxRelativeError(got.dx, want.dx), kTolerance) << "input gradient, rank " << rank;
    for (const auto& [name, g] : got.grads) {
      std::vector<float> expected = want.grads.at(name);
      if (name.find(".experts.") != std::string::npos) {  // every EP rank's tokens
        for (const Result& other : ref) {
          if (&other == &want) continue;
          const std::vector<float>& o = other.grads.at(name);
          for (size_t i = 0; i < expected.size(); ++i) expected[i] += o[i];
        }
      }
      EXPECT_LT(MaxRelativeError(g, expected), kTolerance) << name << ", rank " << rank;
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

TEST(MoeExpertParallelTest, Ep2MatchesOneRank) { ExpectMatchesOneRank(2, 1, Config(4), false); }
TEST(MoeExpertParallelTest, Ep4MatchesOneRank) { ExpectMatchesOneRank(4, 1, Config(8), false); }
TEST(MoeExpertParallelTest, Ep2Tp2MatchesOneRank) { ExpectMatchesOneRank(2, 2, Config(4), false); }

TEST(MoeExpertParallelTest, WithCapacity) {
  GptConfig c = Config(4);
  c.moe_expert_capacity_factor = 0.75f;
  c.moe_pad_expert_input_to_capacity = true;
  ExpectMatchesOneRank(2, 1, c, false);
}

// Every token goes to experts 0 and 1: EP rank 0 gets all the rows, ranks
// 1..3 (EP 4, one expert each above 1) get none at all.
TEST(MoeExpertParallelTest, RanksWithoutTokensWork) {
  ExpectMatchesOneRank(2, 1, Config(4), true);
  ExpectMatchesOneRank(4, 1, Config(4), true);
}

// The all-to-alls' instrumentation (MoeMlp::set_comm_stats) times every
// all-to-all under EP 2 and changes nothing: outputs and gradients are
// bit-identical to the uninstrumented layer's.
TEST(MoeExpertParallelTest, CommStatsTimeAllToAllsAndChangeNothing) {
  const GptConfig c = Config(4);
  absl::Status s = testing::RunRanks(2, [&](int rank, comm::Communicator* world) -> absl::Status {
    EpGroup ep{world};
    Layer plain = MakeLayer(c, {}, ep, false);
    LOOM_ASSIGN_OR_RETURN(Result want, layers::Run(plain, rank, {}));
    Layer timed = MakeLayer(c, {}, ep, false);
    MoeCommStats stats;
    timed.moe->set_comm_stats(&stats);
    LOOM_ASSIGN_OR_RETURN(Result got, layers::Run(timed, rank, {}));
    EXPECT_EQ(got.y, want.y) << "rank " << rank;
    EXPECT_EQ(got.dx, want.dx) << "rank " << rank;
    EXPECT_EQ(got.grads, want.grads) << "rank " << rank;
    // The counts exchange and the dispatch and combine, forward and backward.
    EXPECT_EQ(stats.calls, 5) << "rank " << rank;
    EXPECT_GT(stats.forward_ms, 0.0) << "rank " << rank;
    EXPECT_GT(stats.backward_ms, 0.0) << "rank " << rank;
    EXPECT_GT(stats.blocked_ms, 0.0) << "rank " << rank;
    EXPECT_LE(stats.blocked_ms, (stats.forward_ms + stats.backward_ms) * (1 + 1e-9))
        << "rank " << rank;
    EXPECT_GE(stats.hidden_fraction(), 0.0) << "rank " << rank;
    EXPECT_LE(stats.hidden_fraction(), 1.0) << "rank " << rank;
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace loom::layers
