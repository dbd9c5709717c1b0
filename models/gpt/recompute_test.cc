// Activation recomputation changes what a forward keeps, never a number: for
// every recomputation setting (selective; full with uniform groups of 1, 2
// and 3 layers, the last group shorter; full with block 1 and all layers) the
// losses and every parameter gradient of several SGD steps are bit-identical
// to no recomputation, with hidden and attention dropout on (the rerun
// forward draws the same masks), for GPT-2 and a Llama-style model, in the
// layouts TP 1 / TP 2 / TP 2 + SP x one stage / two pipeline stages /
// two stages of two interleaved chunks. A pipeline here is the stages' models
// held by one thread and run in order (the executor and its schedules are
// //train:recompute_test's); ranks of a TP group are threads on `local`.
// Also: the plan of each setting, and that recomputation really drops what
// it should.
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/test_util.h"

namespace loom::layers {
namespace {

using core::Tensor;
using testing::RandomIds;
using testing::Recompute;
using testing::StepDropout;

constexpr int kSteps = 2;
constexpr int64_t kBatch = 2;
constexpr float kLr = 0.5f;

GptConfig Config(bool llama) {
  GptConfig c;
  c.num_layers = 8;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = 8;
  c.vocab_size = 60;
  c.make_vocab_size_divisible_by = 8;
  c.seed = 42;
  if (llama) {
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

// One rank's pipeline: pp stages of vp chunks each (virtual stage
// c·pp + stage, Megatron's interleaved layout), run in virtual-stage order.
struct Layout {
  int tp = 1;
  bool sp = false;
  int pp = 1;
  int vp = 1;
  std::string Name() const {
    return absl::StrCat("tp", tp, sp ? "_sp" : "", "_pp", pp, vp > 1 ? absl::StrCat("_vp", vp) : "");
  }
};

// Per TP rank: every step's loss, and every parameter's gradient of every
// stage as raw floats, in order.
struct Trace {
  std::vector<double> losses;
  std::vector<std::vector<float>> grads;
};

absl::StatusOr<std::vector<Trace>> Train(const GptConfig& config, const Layout& l) {
  std::vector<Trace> traces(l.tp);
  const int64_t per_chunk = config.num_layers / (l.pp * l.vp);
  absl::Status s = testing::RunRanks(l.tp, [&](int rank, comm::Communicator* comm) -> absl::Status {
    TpGroup tp{comm, l.sp};
    std::vector<std::unique_ptr<GptModel>> stages;
    for (int stage = 0; stage < l.pp; ++stage) {
      std::vector<ChunkSpec> chunks;
      for (int c = 0; c < l.vp; ++c) {
        const int vs = c * l.pp + stage;
        chunks.push_back({vs * per_chunk, per_chunk, vs == 0, vs == l.pp * l.vp - 1});
      }
      auto m = GptModel::Create(config, tp, chunks);
      if (!m.ok()) return m.status();
      stages.push_back(std::move(*m));
    }
    const int virtual_stages = l.pp * l.vp;
    for (int step = 0; step < kSteps; ++step) {
      Tensor ids = RandomIds(config.seq_length, kBatch, config.vocab_size, 100 + step);
      Tensor targets = RandomIds(config.seq_length, kBatch, config.vocab_size, 200 + step);
      for (auto& m : stages) {
        if (absl::Status z = m->params().ZeroGrads(); !z.ok()) return z;
      }
      std::vector<GptModel::Saved> saved(virtual_stages);
      Tensor x = ids;
      double loss = 0;
      for (int vs = 0; vs < virtual_stages; ++vs) {
        auto y =
            stages[vs % l.pp]->Forward(vs / l.pp, x, targets, StepDropout(step), &saved[vs], &loss);
        if (!y.ok()) return y.status();
        x = *y;
      }
      Tensor d;
      for (int vs = virtual_stages; vs-- > 0;) {
        auto dx = stages[vs % l.pp]->Backward(vs / l.pp, d, 1.0f, StepDropout(step), saved[vs]);
        if (!dx.ok()) return dx.status();
        d = *dx;
        saved[vs] = GptModel::Saved();
      }
      traces[rank].losses.push_back(loss);
      for (auto& m : stages) {
        for (Param& p : m->params().params()) {
          traces[rank].grads.push_back(testing::ToVector(p.grad));
          for (int64_t i = 0; i < p.value.numel(); ++i) {
            p.value.data<float>()[i] -= kLr * p.grad.data<float>()[i];
          }
        }
      }
    }
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return traces;
}

// Bit-for-bit: memcmp, not a tolerance (-0.0 and 0.0 differ, NaN equals itself).
bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<Recompute> Settings(int64_t per_chunk) {
  std::vector<Recompute> out = {{"selective", "", 0}};
  auto add = [&](const char* method, int64_t n) {
    for (const Recompute& r : out) {
      if (r.method == method && r.n == n) return;
    }
    if (n >= 1 && n <= per_chunk) out.push_back({"full", method, n});
  };
  for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{3}, per_chunk}) add("uniform", n);
  for (int64_t n : {int64_t{1}, per_chunk - 1, per_chunk}) add("block", n);
  return out;
}

class RecomputeEquivalenceTest : public ::testing::TestWithParam<std::tuple<Layout, bool>> {};

TEST_P(RecomputeEquivalenceTest, BitIdenticalToNoRecomputation) {
  const auto [layout, llama] = GetParam();
  const GptConfig base = Config(llama);
  auto ref = Train(base, layout);
  ASSERT_TRUE(ref.ok()) << ref.status();
  ASSERT_EQ((*ref)[0].losses.size(), static_cast<size_t>(kSteps));
  // Sanity: dropout is on and the runs are deterministic (else nothing here
  // could be bit-exact): the same setting twice gives the same bits.
  auto again = Train(base, layout);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)[0].losses, (*ref)[0].losses);
  for (const Recompute& r : Settings(base.num_layers / (layout.pp * layout.vp))) {
    auto got = Train(r.Apply(base), layout);
    ASSERT_TRUE(got.ok()) << r.Name() << ": " << got.status();
    for (int rank = 0; rank < layout.tp; ++rank) {
      const Trace& want = (*ref)[rank];
      const Trace& have = (*got)[rank];
      ASSERT_EQ(have.losses.size(), want.losses.size());
      for (size_t i = 0; i < want.losses.size(); ++i) {
        EXPECT_EQ(std::memcmp(&have.losses[i], &want.losses[i], sizeof(double)), 0)
            << r.Name() << " tp_rank " << rank << " step " << i << ": loss " << have.losses[i]
            << " vs " << want.losses[i];
      }
      ASSERT_EQ(have.grads.size(), want.grads.size());
      int differing = 0;
      for (size_t i = 0; i < want.grads.size(); ++i) differing += !SameBits(have.grads[i], want.grads[i]);
      EXPECT_EQ(differing, 0) << r.Name() << " tp_rank " << rank << ": " << differing << " of "
                              << want.grads.size() << " gradients differ";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, RecomputeEquivalenceTest,
    ::testing::Combine(::testing::Values(Layout{1, false, 1, 1}, Layout{2, false, 1, 1},
                                         Layout{2, true, 1, 1}, Layout{1, false, 2, 1},
                                         Layout{2, true, 2, 1}, Layout{1, false, 2, 2},
                                         Layout{2, true, 2, 2}),
                       ::testing::Bool()),
    [](const auto& info) {
      return std::get<0>(info.param).Name() + (std::get<1>(info.param) ? "_llama" : "");
    });

// The test can fail: another dropout stream in the backward than in the
// forward (what a recomputation that drew fresh masks would do) changes the
// gradients.
TEST(RecomputeSanityTest, ADifferentMaskIsDetected) {
  const GptConfig config = Recompute{"full", "uniform", 1}.Apply(Config(false));
  auto model = GptModel::Create(config, TpGroup{});
  ASSERT_TRUE(model.ok()) << model.status();
  Tensor ids = RandomIds(config.seq_length, kBatch, config.vocab_size, 100);
  std::vector<std::vector<float>> grads[2];
  for (int variant = 0; variant < 2; ++variant) {
    ASSERT_TRUE((*model)->params().ZeroGrads().ok());
    GptModel::Saved saved;
    double loss = 0;
    ASSERT_TRUE((*model)->Forward(0, ids, ids, StepDropout(0), &saved, &loss).ok());
    ASSERT_TRUE((*model)->Backward(0, Tensor(), 1.0f, StepDropout(variant), saved).ok());
    for (Param& p : (*model)->params().params()) grads[variant].push_back(testing::ToVector(p.grad));
  }
  int differing = 0;
  for (size_t i = 0; i < grads[0].size(); ++i) differing += !SameBits(grads[0][i], grads[1][i]);
  EXPECT_GT(differing, 0);
}

TEST(RecomputePlanTest, MegatronsMethods) {
  auto plan = [](const Recompute& r, int64_t n) {
    std::string s;
    for (const BlockRun& run : RecomputePlan(r.Apply(GptConfig()), n)) {
      absl::StrAppend(&s, run.recompute ? "R" : "K", run.count, " ");
    }
    return s;
  };
  EXPECT_EQ(plan({}, 3), "K1 K1 K1 ");
  EXPECT_EQ(plan({"selective", "", 0}, 3), "K1 K1 K1 ");
  EXPECT_EQ(plan({"full", "uniform", 1}, 3), "R1 R1 R1 ");
  EXPECT_EQ(plan({"full", "uniform", 2}, 5), "R2 R2 R1 ");
  EXPECT_EQ(plan({"full", "uniform", 4}, 4), "R4 ");
  EXPECT_EQ(plan({"full", "block", 2}, 4), "R1 R1 K1 K1 ");
  EXPECT_EQ(plan({"full", "block", 4}, 4), "R1 R1 R1 R1 ");
}

TEST(RecomputePlanTest, FlagsAreChecked) {
  auto error = [](const Recompute& r, int pp, int vp) {
    GptConfig c = r.Apply(Config(false));
    return std::string(ValidateLayout(c, 1, false, pp, vp).message());
  };
  EXPECT_EQ(error({"full", "uniform", 8}, 1, 1), "");
  EXPECT_EQ(error({"full", "block", 2}, 2, 2), "");
  EXPECT_EQ(error({"selective", "", 0}, 2, 2), "");
  EXPECT_NE(error({"full", "", 2}, 1, 1).find("--recompute-method"), std::string::npos);
  EXPECT_NE(error({"", "uniform", 0}, 1, 1).find("needs --recompute-granularity=full"),
            std::string::npos);
  EXPECT_NE(error({"selective", "block", 1}, 1, 1).find("needs --recompute-granularity=full"),
            std::string::npos);
  EXPECT_NE(error({"selective", "", 1}, 1, 1).find("--recompute-num-layers (1)"), std::string::npos);
  EXPECT_NE(error({"full", "uniform", 0}, 1, 1).find("[1, 8]"), std::string::npos);
  // 8 layers over PP 2 x 2 chunks: 2 a chunk.
  const std::string e = error({"full", "block", 3}, 2, 2);
  EXPECT_NE(e.find("--recompute-num-layers (3) must lie in [1, 2]"), std::string::npos) << e;
}

// What the forward keeps: selective drops the attention core's saved tensors
// (and keeps qkv); full keeps no block record, only the runs' inputs.
TEST(RecomputeSavedTest, RecomputationDropsWhatItShould) {
  for (const Recompute& r : {Recompute{"selective", "", 0}, Recompute{"full", "uniform", 3},
                             Recompute{"full", "block", 2}}) {
    const GptConfig config = r.Apply(Config(false));
    auto model = GptModel::Create(config, TpGroup{});
    ASSERT_TRUE(model.ok()) << model.status();
    Tensor ids = RandomIds(config.seq_length, kBatch, config.vocab_size, 100);
    GptModel::Saved saved;
    double loss = 0;
    ASSERT_TRUE((*model)->Forward(0, ids, ids, StepDropout(0), &saved, &loss).ok());
    const std::vector<BlockRun> plan = RecomputePlan(config, config.num_layers);
    for (const BlockRun& run : plan) {
      for (int64_t i = run.first; i < run.first + run.count; ++i) {
        const TransformerBlock::Saved& b = saved.blocks[i];
        EXPECT_EQ(saved.recompute_inputs[i].defined(), run.recompute && i == run.first)
            << r.Name() << " block " << i;
        EXPECT_EQ(b.ln1.input.defined(), !run.recompute) << r.Name() << " block " << i;
        if (!run.recompute) {
          EXPECT_TRUE(b.attention.qkv.defined()) << r.Name();
          EXPECT_EQ(b.attention.lse.defined(), !config.recompute_selective()) << r.Name();
          EXPECT_EQ(b.attention.out.defined(), !config.recompute_selective()) << r.Name();
        }
      }
    }
  }
}

}  // namespace
}  // namespace loom::layers
