// A measurement, not a timing: the activation bytes a rank holds, counted by
// its memory ledger (core/memory_stats.h: every Storage charges the
// allocating thread's ledger), fall with activation recomputation exactly as
// the formulas say. Per chunk of L layers, with X the bytes of one hidden
// state [s(/p), b, h], I what one layer keeps besides its output, P what its
// attention kernel keeps for the backward (the flash kernel's log-sum-exp
// [b, heads/p, s], f32; its output is the projection's input) and B what the embedding,
// the head and one extra hidden state keep:
//   none                  kept = B + L·(I + X)
//   selective             kept = B + L·(I + X) - L·P
//   full, uniform N       kept = B + ceil(L/N)·X
//   full, block N         kept = B + N·X + (L - N)·(I + X)
// ("kept": held between the forward and the backward). B and I are solved
// from two of the runs; every other run must then match to the byte, and at
// TP 1 I must be the tensors a GPT-2 block saves, 15·X + 4·s·b·4 (LayerNorm
// means and rstds) + P. The peak over forward and backward, to the byte too:
//   peak = kept + rerun + W
// with W the backward's own working set (peak - kept without recomputation)
// and rerun what the backward recomputes at once: selective one layer's P
// (the rerun kernel writes its output into the projection's kept input);
// full n layers' activations less the run's output, n·(I + X) - X, n = N for
// uniform and 1 for block (the run's output is never needed by its backward).
// P is the current attention kernel's: lse [b, heads/p, s] (before #18 it
// was the [b, heads/p, s, s] probabilities). With so small a P, selective
// recomputation keeps L·P less and peaks (L - 1)·P lower: little to gain.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/memory_stats.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/test_util.h"

namespace loom::layers {
namespace {

using core::MemoryCategory;
using core::Tensor;
using testing::Recompute;

constexpr int64_t kLayers = 4, kHidden = 64, kHeads = 4, kSeq = 64, kBatch = 2;

GptConfig Config(const Recompute& r) {
  GptConfig c;
  c.num_layers = kLayers;
  c.hidden_size = kHidden;
  c.num_attention_heads = kHeads;
  c.seq_length = kSeq;
  c.vocab_size = 64;
  return r.Apply(c);
}

struct Measured {
  int64_t kept = 0;  // activation bytes held after the forward
  int64_t peak = 0;  // most activation bytes held during forward + backward
};

// TP rank 0's activation ledger over one forward and backward with dropout.
Measured Measure(const Recompute& r, int tp_size, bool sp) {
  Measured m;
  absl::Status s = testing::RunRanks(tp_size, [&](int rank, comm::Communicator* comm) -> absl::Status {
    const GptConfig config = Config(r);
    auto model = GptModel::Create(config, TpGroup{comm, sp});
    if (!model.ok()) return model.status();
    Tensor ids = testing::RandomIds(config.seq_length, kBatch, config.vocab_size, 1);
    DropoutStream d;
    d.hidden_p = d.attention_p = 0.1f;
    d.seed = 3;
    auto ledger = std::make_shared<core::MemoryLedger>();
    core::LedgerScope use(ledger);
    core::MemoryScope tag(MemoryCategory::kActivations);
    auto saved = std::make_unique<GptModel::Saved>();
    double loss = 0;
    absl::Status f = (*model)->Forward(0, ids, ids, d, saved.get(), &loss).status();
    if (!f.ok()) return f;
    const int64_t kept = ledger->Stats().current_of(MemoryCategory::kActivations);
    absl::Status b = (*model)->Backward(0, Tensor(), 1.0f, d, *saved).status();
    if (!b.ok()) return b;
    saved.reset();
    if (rank == 0) {
      m.kept = kept;
      m.peak = ledger->Stats().peak_of(MemoryCategory::kActivations);
      EXPECT_EQ(ledger->Stats().current_of(MemoryCategory::kActivations), 0)
          << r.Name() << ": activations left after the backward";
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << r.Name() << ": " << s;
  return m;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

class RecomputeMemoryTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(RecomputeMemoryTest, KeptBytesFollowTheFormulas) {
  const auto [tp, sp] = GetParam();
  const int64_t L = kLayers;
  const int64_t X = (sp ? kSeq / tp : kSeq) * kBatch * kHidden * 4;
  const int64_t P = kBatch * (kHeads / tp) * kSeq * 4;  // lse [b, heads/p, s]
  const Measured none = Measure({}, tp, sp);
  const Measured all_in_one = Measure({"full", "uniform", L}, tp, sp);
  const int64_t B = all_in_one.kept - X;  // uniform L: one kept input
  ASSERT_EQ((none.kept - B) % L, 0);
  const int64_t I = (none.kept - B) / L - X;
  std::printf("TP %d%s, %lld layers: hidden state X = %lld B, attention lse P = %lld B, "
              "a layer keeps I + X = %lld B, the rest B = %lld B\n",
              tp, sp ? " SP" : "", static_cast<long long>(L), static_cast<long long>(X),
              static_cast<long long>(P), static_cast<long long>(I + X), static_cast<long long>(B));
  if (tp == 1) {
    EXPECT_EQ(I, 15 * X + 4 * kSeq * kBatch * 4 + P);
  }

  struct Case {
    Recompute r;
    int64_t predicted_kept;
    int64_t rerun;  // bytes the backward recomputes and holds at once
  };
  std::vector<Case> cases = {{{}, B + L * (I + X), 0},
                             {{"selective", "", 0}, B + L * (I + X) - L * P, P}};
  for (int64_t n = 1; n <= L; ++n) {
    cases.push_back({{"full", "uniform", n}, B + CeilDiv(L, n) * X, n * (I + X) - X});
  }
  for (int64_t n = 1; n <= L; ++n) {
    cases.push_back({{"full", "block", n}, B + n * X + (L - n) * (I + X), I});
  }
  const int64_t W = none.peak - none.kept;
  std::printf("| recomputation | kept after forward (predicted) | peak (predicted) |\n"
              "|---|---|---|\n");
  std::vector<Measured> got;
  for (const Case& c : cases) {
    const Measured m = c.r.granularity.empty() ? none : Measure(c.r, tp, sp);
    got.push_back(m);
    const int64_t predicted_peak = c.predicted_kept + c.rerun + W;
    std::printf("| %s | %lld (%lld) | %lld (%lld) |\n", c.r.Name().c_str(),
                static_cast<long long>(m.kept), static_cast<long long>(c.predicted_kept),
                static_cast<long long>(m.peak), static_cast<long long>(predicted_peak));
    EXPECT_EQ(m.kept, c.predicted_kept) << c.r.Name();
    EXPECT_EQ(m.peak, predicted_peak) << c.r.Name();
  }
  // Selective keeps less than none and peaks (L - 1)·P below it (one
  // layer's lse is rebuilt at a time). Full uniform 1 peaks below selective,
  // and full uniform N rises with N (more layers rerun at once).
  EXPECT_LT(got[1].kept, got[0].kept);
  EXPECT_EQ(got[1].peak, got[0].peak - (L - 1) * P);
  EXPECT_LT(got[1].peak, got[0].peak);
  EXPECT_LT(got[2].peak, got[1].peak);
  for (int64_t n = 2; n <= L; ++n) EXPECT_LE(got[n].peak, got[n + 1].peak) << "uniform " << n;
}

INSTANTIATE_TEST_SUITE_P(Layouts, RecomputeMemoryTest,
                         ::testing::Values(std::make_tuple(1, false), std::make_tuple(2, false),
                                           std::make_tuple(2, true)),
                         [](const auto& info) {
                           return absl::StrCat("tp", std::get<0>(info.param),
                                               std::get<1>(info.param) ? "_sp" : "");
                         });

}  // namespace
}  // namespace loom::layers
