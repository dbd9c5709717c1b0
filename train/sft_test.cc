// //train:gpt --sft: the loss counts only where the corpus's loss-mask twin
// (preprocess_data --sft's <prefix>_loss_mask) is 1, for the target token.
// Proven two ways: a twin that masks exactly the targets after an EOD trains
// bit for bit the curve of Megatron's --eod-mask-loss (whose masks
// //train/data:packing_test checks against Megatron-Core), and an arbitrary
// twin trains the single rank's curve in every layout. Bad input is refused
// naming the flag and the file.

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "config/config.h"
#include "gtest/gtest.h"
#include "train/data/indexed_dataset.h"
#include "train/data/loss_mask.h"
#include "train/test_util.h"

namespace loom::train {
namespace {

using testing::Layout;

constexpr double kTolerance = 1e-6;  // as //train:trainer_equivalence_test
constexpr int kIters = 6;

enum class Mask { kAfterEod, kRandom };

// Documents of 3 to 12 byte tokens ended by the byte tokenizer's EOD (0),
// with a loss-mask twin: kAfterEod: 0 where the previous token is an EOD
// (every document's first token: the stream's previous token always is),
// else 1; kRandom: about half ones, drawn per token.
std::string Corpus(Mask kind) {
  const std::string p = std::string(getenv("TEST_TMPDIR")) +
                        (kind == Mask::kAfterEod ? "/sft_after_eod" : "/sft_random");
  if (std::FILE* f = std::fopen((p + ".idx").c_str(), "rb")) {
    std::fclose(f);
    return p;
  }
  auto ids = IndexedDatasetWriter::Create(p, TokenType::kU16);
  auto mask = IndexedDatasetWriter::Create(LossMaskPrefix(p), TokenType::kU8);
  std::mt19937 rng(9);
  for (int doc = 0; doc < 300; ++doc) {
    std::vector<int32_t> t(3 + rng() % 10), m;
    const int base = 'a' + rng() % 20;
    for (size_t i = 0; i < t.size(); ++i) t[i] = base + (i % 4);
    t.push_back(0);
    for (size_t i = 0; i < t.size(); ++i) {
      m.push_back(kind == Mask::kAfterEod ? (i == 0 ? 0 : t[i - 1] != 0) : rng() % 2);
    }
    (void)(*ids)->AddSequence(t.data(), t.size());
    (void)(*ids)->EndDocument();
    (void)(*mask)->AddSequence(m.data(), m.size());
    (void)(*mask)->EndDocument();
  }
  (void)(*mask)->Finalize();
  (void)(*ids)->Finalize();
  return p;
}

TrainConfig Sft(const Layout& l, Mask kind, bool llama = false) {
  TrainConfig c = llama ? testing::TinyLlamaConfig(l, kIters) : testing::TinyConfig(l, kIters);
  c.data_path = Corpus(kind);
  c.sft = true;
  return c;
}

TEST(SftTrainTest, AMaskOfTheTargetsAfterEodIsEodMaskLoss) {
  TrainConfig eod = Sft({}, Mask::kAfterEod);
  eod.sft = false;
  eod.eod_mask_loss = true;
  testing::RunResult want = testing::Run(eod, {});
  ASSERT_TRUE(want.status.ok()) << want.status;
  testing::RunResult got = testing::Run(Sft({}, Mask::kAfterEod), {});
  ASSERT_TRUE(got.status.ok()) << got.status;
  ASSERT_EQ(got.losses.size(), static_cast<size_t>(kIters));
  testing::ExpectSameCurve(got.losses, want.losses, 0, 0.0, "--sft vs --eod-mask-loss");
  // Both flags: the product of the masks, here the same mask again.
  TrainConfig both = Sft({}, Mask::kAfterEod);
  both.eod_mask_loss = true;
  testing::RunResult twice = testing::Run(both, {});
  ASSERT_TRUE(twice.status.ok()) << twice.status;
  testing::ExpectSameCurve(twice.losses, want.losses, 0, 0.0, "--sft --eod-mask-loss");
}

TEST(SftTrainTest, EveryLayoutTrainsTheSingleRankCurve) {
  for (bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "llama" : "gpt2");
    testing::RunResult ref = testing::Run(Sft({}, Mask::kRandom, llama), {});
    ASSERT_TRUE(ref.status.ok()) << ref.status;
    Layout tp2;
    tp2.tp = 2;
    tp2.sp = true;
    Layout cp2;
    cp2.cp = 2;
    Layout pp2;
    pp2.pp = 2;
    Layout dp2;
    dp2.dp = 2;
    for (const Layout& l : {tp2, cp2, pp2, dp2}) {
      testing::RunResult got = testing::Run(Sft(l, Mask::kRandom, llama), l);
      ASSERT_TRUE(got.status.ok()) << l.Describe() << ": " << got.status;
      testing::ExpectSameCurve(got.losses, ref.losses, 0, kTolerance, l.Describe());
    }
    // The mask changes the run.
    TrainConfig plain = Sft({}, Mask::kRandom, llama);
    plain.sft = false;
    testing::RunResult all = testing::Run(plain, {});
    ASSERT_TRUE(all.status.ok()) << all.status;
    EXPECT_GT(std::abs(all.losses[0] - ref.losses[0]), 1e-3);
  }
}

TEST(SftTrainTest, BadInputIsRefusedBeforeAnyWork) {
  TrainConfig c = Sft({}, Mask::kRandom);
  c.data_path = std::string(getenv("TEST_TMPDIR")) + "/no_mask";
  {
    auto w = IndexedDatasetWriter::Create(c.data_path, TokenType::kU16);
    std::vector<int32_t> t = {'a', 'b', 0};
    (void)(*w)->AddSequence(t.data(), t.size());
    (void)(*w)->EndDocument();
    (void)(*w)->Finalize();
  }
  absl::Status s = Finalize(&c, 1);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--sft: --data-path"), std::string::npos) << s;
  EXPECT_NE(s.message().find("no_mask_loss_mask.idx"), std::string::npos) << s;

  TrainConfig mock = Sft({}, Mask::kRandom);
  mock.data_path.clear();
  mock.mock_data = true;
  s = Finalize(&mock, 1);
  EXPECT_NE(s.message().find("--sft trains on conversations written by preprocess_data --sft"),
            std::string::npos)
      << s;

  TrainConfig gpu = Sft({}, Mask::kRandom);
  gpu.device = DeviceKind::kCuda;
  gpu.distributed_backend = "local";
  s = Finalize(&gpu, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("--sft is not supported with --device=cuda"), std::string::npos) << s;
}

}  // namespace
}  // namespace loom::train
