// --tp-comm-overlap (TpGroup::comm_overlap): the ring all-gather and
// reduce-scatter against the collectives they replace, then the linear pair
// and whole GPT-2 and Llama-style models at TP 2 and 4 with SP against the
// single rank (the tolerance of //models/gpt:equivalence_test) and against the
// same layout without overlap (within f32 rounding: see kBlockTolerance).
// The ring itself moves and adds exactly what the collectives do: bit for
// bit at p = 2 and on integer-valued data.
// Ranks are threads on the `local` backend.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/cpu/cpu_features.h"
#include "core/ops/ops.h"
#include "gtest/gtest.h"
#include "layers/linear.h"
#include "layers/mappings.h"
#include "layers/params.h"
#include "layers/stage_model.h"
#include "layers/tp_overlap.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/test_util.h"

namespace loom::layers {
namespace {

using core::DType;
using core::Shape;
using core::Tensor;
using testing::GatherFull;
using testing::MaxRelativeError;
using testing::RandomIds;
using testing::RandomTensor;
using testing::RunRanks;
using testing::StepDropout;
using testing::ToVector;

// The single-rank comparison (//models/gpt:equivalence_test's kTolerance); the
// ring's sum of p > 2 partials against the collective's (another order is
// allowed); and the layers with overlap against the same layout without:
// a GEMM over a sequence block gives its rows within an ulp or two of the
// whole GEMM's, not bit for bit, because oneDNN's sgemm picks its kernel
// and blocking by the row count (measured here: up to 5e-7 relative for
// one GEMM), so the difference is rounding, carried through the model.
constexpr double kTolerance = 1e-5;
constexpr double kReorderTolerance = 1e-6;
constexpr double kBlockTolerance = 1e-6;

std::vector<float> Rows(const std::vector<float>& full, int64_t row_elems, int64_t first,
                        int64_t rows) {
  return std::vector<float>(full.begin() + first * row_elems,
                            full.begin() + (first + rows) * row_elems);
}

// ------------------------------------------------------------ the ring primitives

class RingTest : public ::testing::TestWithParam<int> {};

// Every rank's block lands where AllGatherSeq puts it, and each block is
// computed on exactly once, own block first then the ring order, holding
// its final contents when computed (it had arrived).
TEST_P(RingTest, AllGatherEqualsTheCollectiveAndComputesEachArrivedBlockOnce) {
  const int p = GetParam();
  ASSERT_TRUE(RunRanks(p, [&](int rank, comm::Communicator* c) -> absl::Status {
                const TpGroup tp{c, true, true};
                const Tensor x = RandomTensor(Shape{3, 2, 5}, 10 + rank);
                absl::StatusOr<Tensor> want = AllGatherSeq(tp, x);
                if (!want.ok()) return want.status();
                const std::vector<float> all = ToVector(*want);
                std::vector<int> order;
                Tensor full;
                absl::Status s = RingAllGatherSeq(
                    tp, x, &full, [&](int block, const Tensor& rows) -> absl::Status {
                      order.push_back(block);
                      EXPECT_EQ(ToVector(rows), Rows(all, 10, 3 * block, 3)) << "block " << block;
                      return absl::OkStatus();
                    });
                if (!s.ok()) return s;
                EXPECT_EQ(ToVector(full), all);
                std::vector<int> ring;
                for (int k = 0; k < p; ++k) ring.push_back((rank + k) % p);
                EXPECT_EQ(order, ring) << "rank " << rank;
                return absl::OkStatus();
              }).ok());
}

// Each rank's block is the sum over ranks of that block of every rank's
// tensor: bit for bit the collective's at p = 2 and on integers (exact sums
// at any order), within f32 rounding of it otherwise; each block is produced
// once, own block last.
TEST_P(RingTest, ReduceScatterEqualsTheCollective) {
  const int p = GetParam();
  for (const bool integers : {false, true}) {
    ASSERT_TRUE(RunRanks(p, [&](int rank, comm::Communicator* c) -> absl::Status {
                  const TpGroup tp{c, true, true};
                  Tensor full = RandomTensor(Shape{3 * p, 2, 5}, 20 + rank);
                  if (integers) {
                    float* d = full.data<float>();
                    for (int64_t i = 0; i < full.numel(); ++i) d[i] = std::round(d[i] * 1000);
                  }
                  absl::StatusOr<Tensor> want = ReduceScatterSeq(tp, full);
                  if (!want.ok()) return want.status();
                  std::vector<int> order;
                  absl::StatusOr<Tensor> got = RingReduceScatterSeq(
                      tp, Shape{3, 2, 5}, full, [&](int block, const Tensor& out) -> absl::Status {
                        order.push_back(block);
                        absl::StatusOr<Tensor> rows = full.Narrow(3 * block, 3);
                        if (!rows.ok()) return rows.status();
                        Tensor o = out;
                        return core::ops::Copy(*rows, &o);
                      });
                  if (!got.ok()) return got.status();
                  EXPECT_EQ(got->shape(), (Shape{3, 2, 5}));
                  if (p == 2 || integers) {
                    EXPECT_EQ(ToVector(*got), ToVector(*want)) << "rank " << rank;
                  } else {
                    EXPECT_LT(MaxRelativeError(ToVector(*got), ToVector(*want)),
                              kReorderTolerance);
                  }
                  EXPECT_EQ(order.size(), static_cast<size_t>(p));
                  EXPECT_EQ(order.back(), rank);
                  return absl::OkStatus();
                }).ok());
  }
}

INSTANTIATE_TEST_SUITE_P(TpSizes, RingTest, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return "tp" + std::to_string(info.param); });

// ------------------------------------------------------------ the linear pair

constexpr int64_t kS = 8, kB = 2, kIn = 24, kFfn = 64;

std::vector<ParamSpec> PairSpecs() {
  ParamSpec cw{"col.weight", Shape{kFfn, kIn}, TpSplit::kRows};
  ParamSpec cb{"col.bias", Shape{kFfn}, TpSplit::kRows, Init::kNormal};
  ParamSpec rw{"row.weight", Shape{kIn, kFfn}, TpSplit::kCols};
  ParamSpec rb{"row.bias", Shape{kIn}, TpSplit::kReplicated, Init::kNormal};
  cw.std = rw.std = 0.2f;
  rb.sequence_parallel_grad = true;
  return {cw, cb, rw, rb};
}

// Full-size results of gelu(X·A₁ᵀ + b₁)·A₂ᵀ + b₂ forward and backward.
struct PairResult {
  std::vector<float> y, dx;
  std::map<std::string, std::vector<float>> grads;
};

// Rank `rank` of `tp` (TpGroup{} for one rank): its sequence block of y and
// dx (all rows without SP) and the gathered gradients.
absl::Status RunPair(const TpGroup& tp, DType compute, PairResult* out) {
  const int p = tp.size(), r = tp.rank();
  absl::StatusOr<ParamBuffer> buf =
      ParamBuffer::Create(PairSpecs(), r, p, /*seed=*/5, 1, core::Device::CPU(), compute);
  if (!buf.ok()) return buf.status();
  ColumnParallelLinear col(&buf->at("col.weight"), &buf->at("col.bias"), tp);
  RowParallelLinear row(&buf->at("row.weight"), &buf->at("row.bias"), tp);
  const int64_t s = tp.sequence_parallel ? kS / p : kS;
  absl::StatusOr<Tensor> x = RandomTensor(Shape{kS, kB, kIn}, 1).Narrow(r * s, s);
  absl::StatusOr<Tensor> dy = RandomTensor(Shape{kS, kB, kIn}, 2).Narrow(r * s, s);
  if (!x.ok() || !dy.ok()) return absl::InternalError("narrow");
  ColumnParallelLinear::Saved cs;
  RowParallelLinear::Saved rs;
  Tensor pre;
  absl::StatusOr<Tensor> h = col.Forward(*x, &cs, &pre);
  if (!h.ok()) return h.status();
  absl::StatusOr<Tensor> y = row.Forward(*h, &rs);
  if (!y.ok()) return y.status();
  bool up_bias_done = false;
  RowParallelLinear::GeluGrad gelu{&pre, *col.BiasGrad(), &up_bias_done};
  absl::StatusOr<Tensor> dh = row.Backward(*dy, rs, &gelu);
  if (!dh.ok()) return dh.status();
  absl::StatusOr<Tensor> dx = col.Backward(*dh, cs, up_bias_done);
  if (!dx.ok()) return dx.status();
  if (tp.sequence_parallel) {
    absl::Status a = AllReduceTp(tp, buf->at("row.bias").grad);
    if (!a.ok()) return a;
  }
  out->y = ToVector(*y);
  out->dx = ToVector(*dx);
  for (const char* name : {"col.weight", "col.bias", "row.weight", "row.bias"}) {
    absl::StatusOr<std::vector<float>> g = GatherFull(buf->at(name), tp, /*grad=*/true);
    if (!g.ok()) return g.status();
    out->grads[name] = *g;
  }
  return absl::OkStatus();
}

bool HasBf16() { return core::cpu::CheckBf16GemmSupport("test").ok(); }

class LinearPairTest : public ::testing::TestWithParam<std::tuple<int, DType>> {};

// SP with overlap: the single rank's outputs and gradients within the
// equivalence tolerance (bf16: the GEMM inputs' rounding may flip where a
// TP split changes an f32 sum's last bit), and the same layout without
// overlap within kBlockTolerance.
TEST_P(LinearPairTest, MatchesSingleRankAndThePlainTpPath) {
  const auto [p, dtype] = GetParam();
  if (dtype == DType::kBF16 && !HasBf16()) {
    GTEST_SKIP() << core::cpu::CheckBf16GemmSupport("--bf16 on --device=cpu");
  }
  PairResult one;
  ASSERT_TRUE(RunPair(TpGroup{}, dtype, &one).ok());
  const double tol = dtype == DType::kBF16 ? 1e-2 : kTolerance;
  const int64_t rows = kS / p;
  ASSERT_TRUE(RunRanks(p, [&](int rank, comm::Communicator* c) -> absl::Status {
                PairResult plain, overlap;
                absl::Status s = RunPair(TpGroup{c, true, false}, dtype, &plain);
                if (!s.ok()) return s;
                s = RunPair(TpGroup{c, true, true}, dtype, &overlap);
                if (!s.ok()) return s;
                EXPECT_LT(MaxRelativeError(overlap.y, Rows(one.y, kB * kIn, rank * rows, rows)),
                          tol);
                EXPECT_LT(MaxRelativeError(overlap.dx, Rows(one.dx, kB * kIn, rank * rows, rows)),
                          tol);
                for (const auto& [name, g] : one.grads) {
                  EXPECT_LT(MaxRelativeError(overlap.grads[name], g), tol) << name;
                }
                EXPECT_LT(MaxRelativeError(overlap.y, plain.y), kBlockTolerance);
                EXPECT_LT(MaxRelativeError(overlap.dx, plain.dx), kBlockTolerance);
                for (const auto& [name, g] : plain.grads) {
                  EXPECT_LT(MaxRelativeError(overlap.grads[name], g), kBlockTolerance) << name;
                }
                return absl::OkStatus();
              }).ok());
}

INSTANTIATE_TEST_SUITE_P(Layouts, LinearPairTest,
                         ::testing::Combine(::testing::Values(2, 4),
                                            ::testing::Values(DType::kF32, DType::kBF16)),
                         [](const auto& info) {
                           return "tp" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) == DType::kBF16 ? "_bf16" : "_f32");
                         });

// Without SP there is no gather or scatter to pipeline: refused before any
// work, naming the flags.
TEST(TpOverlapTest, WithoutSequenceParallelIsRefused) {
  ASSERT_TRUE(RunRanks(2, [&](int rank, comm::Communicator* c) -> absl::Status {
                absl::StatusOr<ParamBuffer> buf = ParamBuffer::Create(PairSpecs(), rank, 2, 5);
                if (!buf.ok()) return buf.status();
                ColumnParallelLinear col(&buf->at("col.weight"), &buf->at("col.bias"),
                                         TpGroup{c, false, true});
                ColumnParallelLinear::Saved cs;
                absl::StatusOr<Tensor> y = col.Forward(RandomTensor(Shape{kS, kB, kIn}, 1), &cs);
                EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
                EXPECT_NE(y.status().message().find("--tp-comm-overlap needs --sequence-parallel"),
                          std::string::npos)
                    << y.status();
                return absl::OkStatus();
              }).ok());
}

// ------------------------------------------------------------ whole models

GptConfig ModelConfig(bool llama) {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 48;
  c.num_attention_heads = 8;
  c.seq_length = 16;
  c.vocab_size = 100;
  c.make_vocab_size_divisible_by = 8;
  c.seed = 42;
  if (llama) {
    c.normalization = Normalization::kRMSNorm;
    c.layernorm_epsilon = 1e-6f;
    c.position_embedding_type = PositionEmbedding::kRope;
    c.swiglu = true;
    c.ffn_hidden_size = 96;
    c.group_query_attention = true;
    c.num_query_groups = 4;
    c.untie_embeddings_and_output_weights = true;
    c.add_bias_linear = false;
  }
  return c;
}

constexpr int64_t kBatch = 2;
constexpr int kSteps = 2;
constexpr float kLr = 0.5f;

// Per step: loss, full logits, every gathered gradient (after an SGD step
// each, so step 2 runs on weights step 1 changed). Dropout on.
struct ModelRun {
  std::vector<double> losses;
  std::vector<std::vector<float>> logits;
  std::vector<std::map<std::string, std::vector<float>>> grads;
};

// `split`: BackwardInput then BackwardWeight (the zero-bubble schedules'
// split backward) instead of Backward.
absl::Status RunModel(const GptConfig& config, const TpGroup& tp, ModelRun* run,
                      bool split = false) {
  absl::StatusOr<std::unique_ptr<GptModel>> model = GptModel::Create(config, tp);
  if (!model.ok()) return model.status();
  for (int step = 0; step < kSteps; ++step) {
    const Tensor ids = RandomIds(config.seq_length, kBatch, config.vocab_size, 100 + step);
    const Tensor targets = RandomIds(config.seq_length, kBatch, config.vocab_size, 200 + step);
    absl::Status s = (*model)->params().ZeroGrads();
    if (!s.ok()) return s;
    GptModel::Saved saved;
    double loss = 0;
    s = (*model)->Forward(0, ids, targets, StepDropout(step), &saved, &loss).status();
    if (!s.ok()) return s;
    if (split) {
      s = (*model)->BackwardInput(0, Tensor(), 1.0f, StepDropout(step), saved).status();
      if (s.ok()) s = (*model)->BackwardWeight(0, StepDropout(step), saved);
    } else {
      s = (*model)->Backward(0, Tensor(), 1.0f, StepDropout(step), saved).status();
    }
    if (!s.ok()) return s;
    s = AllReduceSequenceParallelGrads(tp, &(*model)->params(),
                                       {{0, (*model)->params().padded_numel()}});
    if (!s.ok()) return s;
    run->losses.push_back(loss);
    absl::StatusOr<Tensor> logits = (*model)->GatherLogits(saved);
    if (!logits.ok()) return logits.status();
    run->logits.push_back(ToVector(*logits));
    std::map<std::string, std::vector<float>> g;
    for (Param& p : (*model)->params().params()) {
      absl::StatusOr<std::vector<float>> full = GatherFull(p, tp, /*grad=*/true);
      if (!full.ok()) return full.status();
      g[p.spec->name] = *full;
      for (int64_t i = 0; i < p.value.numel(); ++i) {
        p.value.data<float>()[i] -= kLr * p.grad.data<float>()[i];
      }
    }
    run->grads.push_back(std::move(g));
  }
  return absl::OkStatus();
}

// With overlap: the single rank within kTolerance, the plain TP path
// within kBlockTolerance, and the split backward (BackwardInput, later
// BackwardWeight) bit for bit.
class ModelTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(ModelTest, MatchesSingleRankAndThePlainTpPath) {
  const auto [p, llama] = GetParam();
  const GptConfig config = ModelConfig(llama);
  ModelRun one;
  ASSERT_TRUE(RunModel(config, TpGroup{}, &one).ok());
  ASSERT_TRUE(RunRanks(p, [&](int rank, comm::Communicator* c) -> absl::Status {
                ModelRun plain, overlap, split;
                absl::Status s = RunModel(config, TpGroup{c, true, false}, &plain);
                if (!s.ok()) return s;
                s = RunModel(config, TpGroup{c, true, true}, &overlap);
                if (!s.ok()) return s;
                s = RunModel(config, TpGroup{c, true, true}, &split, /*split=*/true);
                if (!s.ok()) return s;
                // The split backward defers the same GEMMs on the same operands.
                EXPECT_EQ(split.losses, overlap.losses);
                EXPECT_EQ(split.logits, overlap.logits);
                EXPECT_TRUE(split.grads == overlap.grads) << "split backward, rank " << rank;
                for (int step = 0; step < kSteps; ++step) {
                  EXPECT_NEAR(overlap.losses[step], one.losses[step],
                              kTolerance * std::abs(one.losses[step]));
                  EXPECT_LT(MaxRelativeError(overlap.logits[step], one.logits[step]), kTolerance);
                  for (const auto& [name, want] : one.grads[step]) {
                    std::vector<float> got = overlap.grads[step][name];
                    got.resize(want.size());  // a larger padded vocabulary's rows
                    EXPECT_LT(MaxRelativeError(got, want), kTolerance)
                        << name << " rank " << rank << " step " << step;
                  }
                  EXPECT_NEAR(overlap.losses[step], plain.losses[step],
                              kBlockTolerance * std::abs(plain.losses[step]));
                  EXPECT_LT(MaxRelativeError(overlap.logits[step], plain.logits[step]),
                            kBlockTolerance);
                  for (const auto& [name, want] : plain.grads[step]) {
                    EXPECT_LT(MaxRelativeError(overlap.grads[step][name], want), kBlockTolerance)
                        << name << " rank " << rank << " step " << step;
                  }
                }
                return absl::OkStatus();
              }).ok());
}

INSTANTIATE_TEST_SUITE_P(Layouts, ModelTest,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Bool()),
                         [](const auto& info) {
                           return "tp" + std::to_string(std::get<0>(info.param)) + "_sp" +
                                  (std::get<1>(info.param) ? "_llama" : "_gpt2");
                         });

}  // namespace
}  // namespace loom::layers
