// The MoE layer's pipelined all-to-alls (--moe-a2a-overlap-chunks): over EP
// ranks as threads (the `local` backend), with and without TP (+SP), top-1
// and top-2, dropless and with a capacity (padded or not), experts one after
// the other or side by side, the chunked layer gives every rank the unchunked
// EP layer's routing, drops and aux/z losses bit for bit (they are the whole
// micro-batch's) and its output, input gradient and parameter gradients
// within a GEMM's rounding (bit for bit where each expert's rows lie in one
// chunk, so its GEMMs keep their shapes), and the one-rank layer's within
// the EP tests' tolerance. Also under a split backward (weight gradients
// deferred), with ranks that receive no token, and the flag's checks.

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "layers/weight_grad_store.h"
#include "models/gpt/moe_block.h"
#include "models/gpt/test_util.h"

namespace loom::layers {
namespace {

using core::Shape;
using core::Tensor;
using testing::MaxRelativeError;
using testing::ToVector;

constexpr double kTolerance = 1e-5;  // the one-rank comparison of moe_ep_test
// Chunked against unchunked: oneDNN's sgemm rounds a row differently by the
// GEMM's row count, and a chunk's expert GEMMs have fewer rows (measured:
// at most 4.4e-7 here).
constexpr double kChunkTolerance = 2e-6;
constexpr int64_t kSeq = 8, kBatch = 2, kHidden = 16;

struct Case {
  int ep = 2, tp = 1;
  bool sp = false;
  int64_t experts = 4, topk = 2, chunks = 2;
  float capacity = 0;  // 0: dropless
  bool pad = false, grouped = false;
  bool zero_router = false;  // every logit ties: every token to experts 0 .. K-1
  bool split_backward = false;
  // Tokens of the first half (chunk 0 of 2) all go to expert 0, the rest to
  // expert 2 (top-1): each expert's rows lie in one chunk, so its GEMMs have
  // the same shapes as without chunks and every number must be the same bits.
  bool expert_per_half = false;
};

GptConfig Config(const Case& k) {
  GptConfig c;
  c.num_layers = 1;
  c.hidden_size = kHidden;
  c.num_attention_heads = 2;
  c.seq_length = kSeq;
  c.swiglu = true;
  c.ffn_hidden_size = 24;
  c.add_bias_linear = false;
  c.normalization = Normalization::kRMSNorm;
  c.num_experts = k.experts;
  c.moe_router_topk = k.topk;
  c.moe_aux_loss_coeff = 0.01f;
  c.moe_z_loss_coeff = 0.001f;
  c.moe_expert_capacity_factor = k.capacity;
  c.moe_pad_expert_input_to_capacity = k.pad;
  c.moe_grouped_gemm = k.grouped;
  c.init_method_std = 0.2f;
  c.seed = 5;
  return c;
}

struct Layer {
  ParamBuffer params;
  std::unique_ptr<MoeMlp> moe;
};

Layer MakeLayer(const GptConfig& c, TpGroup tp, EpGroup ep, const Case& k) {
  Layer l;
  l.params = *ParamBuffer::Create(BlockParamSpecs(c, 0, ep.shard()), tp.rank(), tp.size(), c.seed);
  if (k.zero_router || k.expert_per_half) {
    Tensor& w = l.params.at("layers.0.mlp.router.weight").value;  // [E, h]
    std::fill(w.data<float>(), w.data<float>() + w.numel(), 0.0f);
    if (k.expert_per_half) {  // logit_0 = x_0, logit_2 = -x_0
      w.data<float>()[0] = 1.0f;
      w.data<float>()[2 * kHidden] = -1.0f;
    }
  }
  l.moe = std::make_unique<MoeMlp>(MoeMlpForLayer(&l.params, c, 0, tp, ep));
  return l;
}

struct Result {
  std::vector<float> y, dx;  // this TP rank's rows under SP
  std::map<std::string, std::vector<float>> grads;  // global name -> full gradient
  double aux_loss = 0, z_loss = 0;
  int64_t dropped = 0;
};

// EP rank `ep_rank`'s tokens through a layer (under SP, TP rank t's rows).
absl::StatusOr<Result> RunLayer(Layer& l, int ep_rank, TpGroup tp, const Case& k) {
  const bool split_backward = k.split_backward;
  LOOM_RETURN_IF_ERROR(l.params.ZeroGrads());
  Tensor x = testing::RandomTensor(Shape{kSeq, kBatch, kHidden}, 100 + ep_rank);
  if (k.expert_per_half) {  // x_0 = 10 in the first half of the sequence, -10 after
    for (int64_t t = 0; t < kSeq * kBatch; ++t) {
      x.data<float>()[t * kHidden] = t < kSeq * kBatch / 2 ? 10.0f : -10.0f;
    }
  }
  Tensor dy = testing::RandomTensor(Shape{kSeq, kBatch, kHidden}, 200 + ep_rank);
  if (tp.sequence_parallel) {
    const int64_t local = kSeq / tp.size();
    LOOM_ASSIGN_OR_RETURN(x, x.Narrow(tp.rank() * local, local));
    LOOM_ASSIGN_OR_RETURN(dy, dy.Narrow(tp.rank() * local, local));
  }
  MoeMlp::Saved saved;
  LOOM_ASSIGN_OR_RETURN(Tensor y, l.moe->Forward(x, &saved));
  Tensor dx;
  if (split_backward) {
    WeightGradStore store;
    {
      DeferWeightGrads scope(&store);
      LOOM_ASSIGN_OR_RETURN(dx, l.moe->Backward(dy, 0.5f, saved));
    }
    // Nothing of the experts' or router's weight gradients before W.
    for (Param& p : l.params.params()) {
      const float* g = p.grad.data<float>();
      if (std::any_of(g, g + p.grad.numel(), [](float v) { return v != 0.0f; })) {
        return absl::InternalError(p.spec->name + " has a gradient before W");
      }
    }
    store.EndUnit(0);
    LOOM_RETURN_IF_ERROR(store.Run([](int64_t) { return absl::OkStatus(); }));
  } else {
    LOOM_ASSIGN_OR_RETURN(dx, l.moe->Backward(dy, 0.5f, saved));
  }
  Result r{ToVector(y), ToVector(dx), {}, saved.routing.aux_loss, saved.routing.z_loss,
           saved.routing.dropped};
  for (Param& p : l.params.params()) {
    LOOM_ASSIGN_OR_RETURN(r.grads[p.spec->name], testing::GatherFull(p, tp, /*grad=*/true));
  }
  return r;
}

// `v`'s rows of TP rank t under SP ([s, b, h]: rows are s-major).
std::vector<float> SeqShard(const std::vector<float>& v, TpGroup tp) {
  if (!tp.sequence_parallel) return v;
  const size_t n = v.size() / tp.size();
  return std::vector<float>(v.begin() + tp.rank() * n, v.begin() + (tp.rank() + 1) * n);
}

void ExpectChunkedMatches(const Case& k) {
  GptConfig plain = Config(k);
  GptConfig chunked = plain;
  chunked.moe_a2a_overlap_chunks = k.chunks;
  ASSERT_TRUE(ValidateMoe(chunked).ok());
  // The reference: one rank with every expert runs each EP rank's tokens.
  std::vector<Result> ref;
  Layer whole = MakeLayer(plain, {}, {}, k);
  for (int r = 0; r < k.ep; ++r) {
    auto got = RunLayer(whole, r, {}, Case{.zero_router = k.zero_router, .expert_per_half = k.expert_per_half});
    ASSERT_TRUE(got.ok()) << got.status();
    ref.push_back(*got);
  }
  absl::Status s =
      testing::RunRanks(k.ep * k.tp, [&](int rank, comm::Communicator* world) -> absl::Status {
        // TP varies fastest: ranks {t, t + tp, ...} are one EP group.
        const int tp_rank = rank % k.tp, ep_rank = rank / k.tp;
        LOOM_ASSIGN_OR_RETURN(auto tp_comm, world->Split(ep_rank, tp_rank, "tp"));
        LOOM_ASSIGN_OR_RETURN(auto ep_comm, world->Split(tp_rank, ep_rank, "ep"));
        const TpGroup tp{tp_comm.get(), k.sp};
        const EpGroup ep{ep_comm.get()};
        Layer base = MakeLayer(plain, tp, ep, k);
        LOOM_ASSIGN_OR_RETURN(const Result want, RunLayer(base, ep_rank, tp, k));
        Layer pipelined = MakeLayer(chunked, tp, ep, k);
        LOOM_ASSIGN_OR_RETURN(const Result got, RunLayer(pipelined, ep_rank, tp, k));
        // The unchunked EP layer's routing, drops and losses bit for bit;
        // its numbers within a GEMM's rounding (a chunk's expert GEMMs have
        // fewer rows, and oneDNN's sgemm rounds a row differently by shape).
        EXPECT_EQ(got.aux_loss, want.aux_loss) << "rank " << rank;
        EXPECT_EQ(got.z_loss, want.z_loss) << "rank " << rank;
        EXPECT_EQ(got.dropped, want.dropped) << "rank " << rank;
        if (k.capacity > 0) {
          EXPECT_GT(got.dropped, 0) << "rank " << rank;  // the drops are tested
        }
        EXPECT_LT(MaxRelativeError(got.y, want.y), kChunkTolerance) << "output, rank " << rank;
        EXPECT_LT(MaxRelativeError(got.dx, want.dx), kChunkTolerance) << "dx, rank " << rank;
        for (const auto& [name, g] : want.grads) {
          EXPECT_LT(MaxRelativeError(got.grads.at(name), g), kChunkTolerance)
              << name << ", rank " << rank;
        }
        if (k.expert_per_half) {  // the same GEMM shapes: the same bits
          EXPECT_EQ(got.y, want.y) << "output, rank " << rank;
          EXPECT_EQ(got.dx, want.dx) << "input gradient, rank " << rank;
          EXPECT_EQ(got.grads, want.grads) << "rank " << rank;
        }
        // And the one-rank layer within the EP tests' tolerance.
        const Result& one = ref[ep_rank];
        EXPECT_LT(MaxRelativeError(got.y, SeqShard(one.y, tp)), kTolerance) << "rank " << rank;
        EXPECT_LT(MaxRelativeError(got.dx, SeqShard(one.dx, tp)), kTolerance) << "rank " << rank;
        EXPECT_EQ(got.dropped, one.dropped) << "rank " << rank;
        for (const auto& [name, g] : got.grads) {
          std::vector<float> expected = one.grads.at(name);
          if (name.find(".experts.") != std::string::npos) {  // every EP rank's tokens
            for (const Result& other : ref) {
              if (&other == &one) continue;
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

TEST(MoeA2aOverlapTest, Ep2Top2Dropless) { ExpectChunkedMatches({.ep = 2, .chunks = 2}); }
TEST(MoeA2aOverlapTest, Ep2Top1UnevenChunks) {
  ExpectChunkedMatches({.ep = 2, .topk = 1, .chunks = 3});
}
TEST(MoeA2aOverlapTest, Ep4Top2) { ExpectChunkedMatches({.ep = 4, .experts = 8, .chunks = 3}); }
TEST(MoeA2aOverlapTest, Ep4Top1GroupedGemm) {
  ExpectChunkedMatches({.ep = 4, .experts = 8, .topk = 1, .chunks = 2, .grouped = true});
}
// More chunks than some ranks have rows for a chunk; a chunk per token.
TEST(MoeA2aOverlapTest, ManyChunks) {
  ExpectChunkedMatches({.ep = 2, .chunks = 7});
  ExpectChunkedMatches({.ep = 2, .topk = 1, .chunks = kSeq * kBatch});
}

TEST(MoeA2aOverlapTest, CapacityDecidedOverTheMicroBatch) {
  ExpectChunkedMatches({.ep = 2, .chunks = 3, .capacity = 0.75f});
  ExpectChunkedMatches({.ep = 2, .chunks = 2, .capacity = 0.75f, .pad = true});
  ExpectChunkedMatches(
      {.ep = 4, .experts = 8, .topk = 1, .chunks = 3, .capacity = 1.0f, .pad = true,
       .grouped = true});
}

TEST(MoeA2aOverlapTest, WithTensorParallelism) {
  ExpectChunkedMatches({.ep = 2, .tp = 2, .chunks = 2});
  ExpectChunkedMatches({.ep = 2, .tp = 2, .topk = 1, .chunks = 3, .capacity = 0.75f,
                        .pad = true});
}

TEST(MoeA2aOverlapTest, WithSequenceParallelism) {
  ExpectChunkedMatches({.ep = 2, .tp = 2, .sp = true, .chunks = 2, .grouped = true});
  ExpectChunkedMatches({.ep = 4, .tp = 2, .sp = true, .experts = 8, .topk = 1, .chunks = 3,
                        .capacity = 0.75f});
}

// Every token goes to experts 0 and 1: EP rank 0 gets every row, the others
// none, in every chunk.
TEST(MoeA2aOverlapTest, RanksWithoutTokens) {
  ExpectChunkedMatches({.ep = 2, .chunks = 3, .zero_router = true});
  ExpectChunkedMatches({.ep = 4, .chunks = 2, .zero_router = true});
}

// Each expert's rows in one chunk: the chunked layout, exchanges, permutations
// and the weight gradients' expert-major gather are exact, bit for bit (EP 2:
// rank 0 computes expert 0 in chunk 0, rank 1 expert 2 in chunk 1).
TEST(MoeA2aOverlapTest, SameGemmShapesGiveTheSameBits) {
  ExpectChunkedMatches({.ep = 2, .topk = 1, .chunks = 2, .expert_per_half = true});
  ExpectChunkedMatches(
      {.ep = 2, .tp = 2, .sp = true, .topk = 1, .chunks = 2, .expert_per_half = true});
  ExpectChunkedMatches(
      {.ep = 2, .topk = 1, .chunks = 2, .split_backward = true, .expert_per_half = true});
}

// A split backward (zero-bubble schedules) defers the experts' weight
// gradients to W; the chunked layer's W gives the same bits.
TEST(MoeA2aOverlapTest, SplitBackward) {
  ExpectChunkedMatches({.ep = 2, .chunks = 3, .split_backward = true});
  ExpectChunkedMatches({.ep = 2, .tp = 2, .sp = true, .chunks = 2, .capacity = 0.75f,
                        .grouped = true, .split_backward = true});
}

// The statistics count one counts exchange and 2 all-to-alls per chunk each
// way, and change nothing.
TEST(MoeA2aOverlapTest, CommStatsCountEveryChunk) {
  Case k{.ep = 2, .chunks = 3};
  GptConfig c = Config(k);
  c.moe_a2a_overlap_chunks = k.chunks;
  absl::Status s = testing::RunRanks(2, [&](int rank, comm::Communicator* world) -> absl::Status {
    const EpGroup ep{world};
    Layer plain = MakeLayer(c, {}, ep, k);
    LOOM_ASSIGN_OR_RETURN(const Result want, RunLayer(plain, rank, {}, k));
    Layer timed = MakeLayer(c, {}, ep, k);
    MoeCommStats stats;
    timed.moe->set_comm_stats(&stats);
    LOOM_ASSIGN_OR_RETURN(const Result got, RunLayer(timed, rank, {}, k));
    EXPECT_EQ(got.y, want.y) << "rank " << rank;
    EXPECT_EQ(got.dx, want.dx) << "rank " << rank;
    EXPECT_EQ(got.grads, want.grads) << "rank " << rank;
    EXPECT_EQ(stats.calls, 1 + 4 * k.chunks) << "rank " << rank;
    EXPECT_GT(stats.forward_ms, 0.0) << "rank " << rank;
    EXPECT_GT(stats.backward_ms, 0.0) << "rank " << rank;
    EXPECT_LE(stats.blocked_ms, (stats.forward_ms + stats.backward_ms) * (1 + 1e-9))
        << "rank " << rank;
    EXPECT_GE(stats.hidden_fraction(), 0.0) << "rank " << rank;
    EXPECT_LE(stats.hidden_fraction(), 1.0) << "rank " << rank;
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

// Without EP there is nothing to hide: the flag leaves the layer as it is.
TEST(MoeA2aOverlapTest, NoExpertParallelismIsTheSameLayer) {
  Case k{.chunks = 4};
  GptConfig plain = Config(k), chunked = plain;
  chunked.moe_a2a_overlap_chunks = k.chunks;
  Layer a = MakeLayer(plain, {}, {}, k), b = MakeLayer(chunked, {}, {}, k);
  auto want = RunLayer(a, 0, {}, k);
  auto got = RunLayer(b, 0, {}, k);
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_EQ(got->y, want->y);
  EXPECT_EQ(got->grads, want->grads);
}

TEST(MoeA2aOverlapTest, FlagChecksNameTheFlag) {
  GptConfig c = Config({});
  c.moe_a2a_overlap_chunks = 0;
  absl::Status s = ValidateMoe(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--moe-a2a-overlap-chunks (0) must be >= 1"), std::string::npos)
      << s;
  c.moe_a2a_overlap_chunks = 4;
  c.num_experts = 0;
  s = ValidateMoe(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--moe-a2a-overlap-chunks (4) needs --num-experts > 0"),
            std::string::npos)
      << s;
  c.num_experts = 4;
  EXPECT_TRUE(ValidateMoe(c).ok());
}

}  // namespace
}  // namespace loom::layers
