// Packed documents (--reset-position-ids with --reset-attention-mask): a
// sequence holding several documents gives each document exactly what it
// gets alone (its own sequence, positions from 0): the same logits, hence
// the same per-token losses, and gradients equal to the sum of the
// documents' own (each weighted by its share of the tokens, as the packed
// run's mean loss weighs it). GPT-2 (learned position table) and Llama-style
// (RoPE, GQA) models, on one rank and at TP 2 with SP, CP 2 (ring attention
// over load-balanced chunks that split documents) and PP 2 (two stages).
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "layers/context_parallel.h"
#include "layers/packed_documents.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/test_util.h"

namespace loom::layers {
namespace {

using core::Shape;
using core::Tensor;
using testing::GatherFull;
using testing::MaxRelativeError;
using testing::RandomIds;
using testing::ToVector;

// f32 sums over differently sized GEMMs, tiles and all-reduces.
constexpr double kTolerance = 2e-5;
constexpr int64_t kSeq = 16, kBatch = 2;
// Document starts per batch row: lengths 5, 1, 7, 3 and 9, 7. Under CP 2 the
// chunks are [0, 4), [4, 8), [8, 12), [12, 16): documents cross them.
const std::vector<std::vector<int64_t>> kStarts = {{0, 5, 6, 13}, {0, 9}};

int64_t DocEnd(int64_t row, size_t k) {
  return k + 1 < kStarts[row].size() ? kStarts[row][k + 1] : kSeq;
}

GptConfig Config(bool llama, int64_t seq_length) {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = seq_length;
  c.max_position_embeddings = kSeq;  // one table for every sequence length
  c.vocab_size = 50;
  c.make_vocab_size_divisible_by = 8;
  c.seed = 7;
  if (llama) {
    c.normalization = Normalization::kRMSNorm;
    c.position_embedding_type = PositionEmbedding::kRope;
    c.swiglu = true;
    c.ffn_hidden_size = 64;
    c.group_query_attention = true;
    c.num_query_groups = 2;
    c.untie_embeddings_and_output_weights = true;
    c.add_bias_linear = false;
  }
  return c;
}

std::shared_ptr<const PackedDocuments> Documents() {
  auto d = std::make_shared<PackedDocuments>();
  d->seq_len = kSeq;
  d->batch = kBatch;
  for (int64_t row = 0; row < kBatch; ++row) {
    for (size_t k = 0; k < kStarts[row].size(); ++k) {
      for (int64_t i = kStarts[row][k]; i < DocEnd(row, k); ++i) {
        d->position.push_back(static_cast<int32_t>(i - kStarts[row][k]));
        d->doc_start.push_back(static_cast<int32_t>(kStarts[row][k]));
      }
    }
  }
  return d;
}

DropoutStream Packed() {
  DropoutStream d;
  d.documents = Documents();
  return d;
}

// Rows [first, first + n) of batch row `row` of ids [s, b], as [n, 1].
Tensor IdsOf(const Tensor& ids, int64_t row, int64_t first, int64_t n) {
  Tensor out = *Tensor::Empty(Shape{n, 1}, core::DType::kI32);
  for (int64_t i = 0; i < n; ++i) {
    out.data<int32_t>()[i] = ids.data<int32_t>()[(first + i) * ids.dim(1) + row];
  }
  return out;
}

struct Result {
  double loss = 0;                                    // the micro-batch's mean
  std::vector<float> logits;                          // [s, b, V], global rows
  std::map<std::string, std::vector<float>> grads;    // full size, by name
};

void AddGrads(const ParamBuffer& params, double weight, Result* r) {
  for (const Param& p : params.params()) {
    const std::vector<float> g = ToVector(p.grad);
    std::vector<float>& sum = r->grads[p.spec->name];
    sum.resize(g.size(), 0.0f);
    for (size_t i = 0; i < g.size(); ++i) sum[i] += static_cast<float>(weight * g[i]);
  }
}

const Tensor& Ids() {
  static const Tensor ids = RandomIds(kSeq, kBatch, 50, 11);
  return ids;
}
const Tensor& Targets() {
  static const Tensor targets = RandomIds(kSeq, kBatch, 50, 12);
  return targets;
}

// Every document alone, one rank: its logits at its rows of the packed
// sequence, and the gradients of the packed mean loss as the sum of the
// documents' mean losses weighted by their token shares.
Result EachDocumentAlone(bool llama) {
  Result r;
  const int64_t vocab = Config(llama, kSeq).vocab_size;
  r.logits.assign(kSeq * kBatch * vocab, NAN);
  for (int64_t row = 0; row < kBatch; ++row) {
    for (size_t k = 0; k < kStarts[row].size(); ++k) {
      const int64_t first = kStarts[row][k], n = DocEnd(row, k) - first;
      auto model = GptModel::Create(Config(llama, n), TpGroup{});
      EXPECT_TRUE(model.ok()) << model.status();
      GptModel::Saved saved;
      double loss = 0;
      const DropoutStream plain;
      EXPECT_TRUE((*model)->Forward(0, IdsOf(Ids(), row, first, n),
                                    IdsOf(Targets(), row, first, n), plain, &saved, &loss)
                      .ok());
      EXPECT_TRUE((*model)->Backward(0, Tensor(), 1.0f, plain, saved).ok());
      AddGrads((*model)->params(), static_cast<double>(n) / (kSeq * kBatch), &r);
      const std::vector<float> logits = ToVector(*(*model)->GatherLogits(saved));
      for (int64_t i = 0; i < n; ++i) {
        std::copy_n(logits.begin() + i * vocab, vocab,
                    r.logits.begin() + ((first + i) * kBatch + row) * vocab);
      }
    }
  }
  return r;
}

// Per-token cross-entropy of logits [s, b, V] against Targets(), in double.
std::vector<double> TokenLosses(const std::vector<float>& logits, int64_t vocab) {
  std::vector<double> losses;
  for (int64_t t = 0; t < kSeq * kBatch; ++t) {
    const float* row = logits.data() + t * vocab;
    double mx = row[0], sum = 0;
    for (int64_t v = 0; v < vocab; ++v) mx = std::max<double>(mx, row[v]);
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(row[v] - mx);
    losses.push_back(mx + std::log(sum) - row[Targets().data<int32_t>()[t]]);
  }
  return losses;
}

struct Layout {
  int tp = 1;
  bool sp = false;
  int cp = 1;
  bool pp = false;
  std::string Name() const {
    if (pp) return "pp2";
    if (cp > 1) return "cp" + std::to_string(cp);
    return "tp" + std::to_string(tp) + (sp ? "_sp" : "");
  }
};

// The packed batch in `layout` (ranks as threads; PP's two stages run one
// after the other on one thread): full logits and gradients, from rank 0.
absl::StatusOr<Result> RunPacked(bool llama, const Layout& layout,
                                 const DropoutStream& packed = Packed(),
                                 const Tensor& all_targets = Targets()) {
  const GptConfig config = Config(llama, kSeq);
  Result result;
  absl::Status s = testing::RunRanks(
      layout.tp * layout.cp, [&](int rank, comm::Communicator* comm) -> absl::Status {
        const TpGroup tp = layout.tp > 1 ? TpGroup{comm, layout.sp} : TpGroup{};
        const CpGroup cp = layout.cp > 1 ? CpGroup{comm} : CpGroup{};
        const ContextParallelLayout cl = cp.Layout(kSeq);
        LOOM_ASSIGN_OR_RETURN(Tensor ids, SelectLocalRows(Ids(), cl));
        LOOM_ASSIGN_OR_RETURN(Tensor targets, SelectLocalRows(all_targets, cl));
        std::vector<std::unique_ptr<GptModel>> stages;
        const int64_t L = config.num_layers;
        const std::vector<std::vector<ChunkSpec>> chunks =
            layout.pp ? std::vector<std::vector<ChunkSpec>>{{{0, L / 2, true, false}},
                                                            {{L / 2, L - L / 2, false, true}}}
                      : std::vector<std::vector<ChunkSpec>>{{{0, L, true, true}}};
        for (const auto& c : chunks) {
          LOOM_ASSIGN_OR_RETURN(std::unique_ptr<GptModel> m, GptModel::Create(config, tp, cp, c));
          stages.push_back(std::move(m));
        }
        std::vector<GptModel::Saved> saved(stages.size());
        Tensor x = ids;
        double loss = 0;
        for (size_t i = 0; i < stages.size(); ++i) {
          LOOM_ASSIGN_OR_RETURN(x, stages[i]->Forward(0, x, targets, packed, &saved[i], &loss));
        }
        Tensor d;
        for (size_t i = stages.size(); i-- > 0;) {
          LOOM_ASSIGN_OR_RETURN(d, stages[i]->Backward(0, d, 1.0f, packed, saved[i]));
        }
        LOOM_ASSIGN_OR_RETURN(Tensor local_logits, stages.back()->GatherLogits(saved.back()));
        Result r;
        r.loss = loss;
        const int64_t vocab = config.vocab_size;
        r.logits.assign(kSeq * kBatch * vocab, NAN);
        const std::vector<int64_t> pos = LocalPositions(cl);
        const std::vector<float> lv = ToVector(local_logits);
        for (size_t i = 0; i < pos.size(); ++i) {
          std::copy_n(lv.begin() + i * kBatch * vocab, kBatch * vocab,
                      r.logits.begin() + pos[i] * kBatch * vocab);
        }
        for (const auto& stage : stages) {
          ParamBuffer& params = stage->params();
          LOOM_RETURN_IF_ERROR(AllReduceSequenceParallelGrads(tp, &params, {{0, params.padded_numel()}}));
          for (Param& p : params.params()) {
            if (cp.parallel()) {  // each CP rank's loss is the mean over its tokens
              LOOM_RETURN_IF_ERROR(comm->AllReduce(p.grad, comm::ReduceOp::kSum)->Wait());
              for (int64_t i = 0; i < p.grad.numel(); ++i) p.grad.data<float>()[i] /= cp.size();
            }
            LOOM_ASSIGN_OR_RETURN(std::vector<float> full, GatherFull(p, tp, /*grad=*/true));
            std::vector<float>& sum = r.grads[p.spec->name];  // PP: the tied copies add
            sum.resize(full.size(), 0.0f);
            for (size_t i = 0; i < full.size(); ++i) sum[i] += full[i];
          }
        }
        if (cp.parallel()) {  // the CP ranks' mean loss, the other rank's rows of the logits
          Tensor l = *Tensor::Empty(Shape{1}, core::DType::kF32);
          l.data<float>()[0] = static_cast<float>(loss / cp.size());
          LOOM_RETURN_IF_ERROR(comm->AllReduce(l, comm::ReduceOp::kSum)->Wait());
          r.loss = l.data<float>()[0];
          Tensor t = *Tensor::Empty(Shape{static_cast<int64_t>(r.logits.size())}, core::DType::kF32);
          for (size_t i = 0; i < r.logits.size(); ++i) {
            t.data<float>()[i] = std::isnan(r.logits[i]) ? 0.0f : r.logits[i];
          }
          LOOM_RETURN_IF_ERROR(comm->AllReduce(t, comm::ReduceOp::kSum)->Wait());
          r.logits = ToVector(t);
        }
        if (rank == 0) result = std::move(r);
        return absl::OkStatus();
      });
  if (!s.ok()) return s;
  return result;
}

class PackedDocumentsTest : public ::testing::TestWithParam<std::tuple<bool, Layout>> {};

TEST_P(PackedDocumentsTest, EachDocumentAsIfAlone) {
  const auto [llama, layout] = GetParam();
  const Result alone = EachDocumentAlone(llama);
  absl::StatusOr<Result> packed = RunPacked(llama, layout);
  ASSERT_TRUE(packed.ok()) << packed.status();
  const int64_t vocab = Config(llama, kSeq).vocab_size;
  EXPECT_LT(MaxRelativeError(packed->logits, alone.logits), kTolerance);
  const std::vector<double> want = TokenLosses(alone.logits, vocab);
  const std::vector<double> got = TokenLosses(packed->logits, vocab);
  for (size_t t = 0; t < want.size(); ++t) {
    EXPECT_NEAR(got[t], want[t], kTolerance * std::abs(want[t])) << "token " << t;
  }
  ASSERT_EQ(packed->grads.size(), alone.grads.size());
  for (const auto& [name, g] : alone.grads) {
    std::vector<float> p = packed->grads.at(name);
    ASSERT_GE(p.size(), g.size()) << name;
    p.resize(g.size());  // a larger padded vocabulary: rows that get no gradient
    EXPECT_LT(MaxRelativeError(p, g), kTolerance) << name;
  }
}

// Sanity: the test can fail. Without the packed documents the same batch is
// one sequence per row, and the documents after the first see the others.
TEST(PackedDocumentsSanityTest, WithoutDocumentsTheLogitsDiffer) {
  for (bool llama : {false, true}) {
    const Result alone = EachDocumentAlone(llama);
    auto model = GptModel::Create(Config(llama, kSeq), TpGroup{});
    ASSERT_TRUE(model.ok());
    GptModel::Saved saved;
    double loss = 0;
    ASSERT_TRUE((*model)->Forward(0, Ids(), Targets(), DropoutStream{}, &saved, &loss).ok());
    EXPECT_GT(MaxRelativeError(ToVector(*(*model)->GatherLogits(saved)), alone.logits), 1e-2);
    // Positions alone (no attention mask) are not enough either.
    auto positions_only = std::make_shared<PackedDocuments>(*Documents());
    positions_only->doc_start.clear();
    DropoutStream d;
    d.documents = positions_only;
    ASSERT_TRUE((*model)->Forward(0, Ids(), Targets(), d, &saved, &loss).ok());
    EXPECT_GT(MaxRelativeError(ToVector(*(*model)->GatherLogits(saved)), alone.logits), 1e-2);
  }
}

// --eod-mask-loss: with the weights the trainer gives (mask · s·b / sum of
// the mask) the loss is the mean over the unmasked tokens of each token's
// loss alone, on one rank and under CP 2 (whose ranks hold different numbers
// of masked tokens); the masked tokens' targets do not reach the gradients.
TEST(PackedDocumentsLossMaskTest, MaskedMeanAndNoGradientFromMaskedTokens) {
  for (bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "llama" : "gpt2");
    const int64_t vocab = Config(llama, kSeq).vocab_size;
    const std::vector<double> token_losses = TokenLosses(EachDocumentAlone(llama).logits, vocab);
    // Each document's last token (where its EOD would be) is masked.
    auto documents = std::make_shared<PackedDocuments>(*Documents());
    documents->loss_weight.assign(kBatch * kSeq, 1.0f);
    Tensor other_targets = *Tensor::Empty(Targets().shape(), core::DType::kI32);
    std::copy_n(Targets().data<int32_t>(), Targets().numel(), other_targets.data<int32_t>());
    int64_t kept = kBatch * kSeq;
    for (int64_t row = 0; row < kBatch; ++row) {
      for (size_t k = 0; k < kStarts[row].size(); ++k) {
        const int64_t last = DocEnd(row, k) - 1;
        documents->loss_weight[row * kSeq + last] = 0.0f;
        int32_t& t = other_targets.data<int32_t>()[last * kBatch + row];
        t = (t + 1) % vocab;
        --kept;
      }
    }
    double want = 0;
    for (int64_t row = 0; row < kBatch; ++row) {
      for (int64_t i = 0; i < kSeq; ++i) {
        want += documents->loss_weight[row * kSeq + i] * token_losses[i * kBatch + row];
      }
    }
    want /= kept;
    for (float& w : documents->loss_weight) w *= static_cast<float>(kBatch * kSeq) / kept;
    DropoutStream masked;
    masked.documents = documents;
    absl::StatusOr<Result> one = RunPacked(llama, Layout{}, masked);
    absl::StatusOr<Result> other = RunPacked(llama, Layout{}, masked, other_targets);
    absl::StatusOr<Result> cp2 = RunPacked(llama, Layout{1, false, 2}, masked);
    absl::StatusOr<Result> unmasked = RunPacked(llama, Layout{});
    ASSERT_TRUE(one.ok() && other.ok() && cp2.ok() && unmasked.ok());
    EXPECT_NEAR(one->loss, want, kTolerance * want);
    EXPECT_NEAR(cp2->loss, want, kTolerance * want);
    EXPECT_EQ(other->loss, one->loss);
    for (const auto& [name, g] : one->grads) {
      EXPECT_EQ(other->grads.at(name), g) << name;
      EXPECT_LT(MaxRelativeError(cp2->grads.at(name), g), kTolerance) << name;
    }
    // Sanity: the mask changes the gradients.
    EXPECT_GT(MaxRelativeError(one->grads.at(kWordEmbeddingName),
                               unmasked->grads.at(kWordEmbeddingName)),
              1e-3);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PackedDocumentsTest,
    ::testing::Combine(::testing::Bool(),
                       ::testing::Values(Layout{}, Layout{2, false}, Layout{2, true},
                                         Layout{1, false, 2}, Layout{1, false, 1, true})),
    [](const auto& info) {
      return std::string(std::get<0>(info.param) ? "llama_" : "gpt2_") +
             std::get<1>(info.param).Name();
    });

}  // namespace
}  // namespace loom::layers
