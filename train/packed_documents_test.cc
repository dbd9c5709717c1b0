// //train:gpt with Megatron's packed-document flags (--reset-position-ids,
// --reset-attention-mask, --eod-mask-loss) on a corpus whose documents end in
// the tokenizer's EOD: every layout (TP 2 with SP, CP 2, PP 2, DP 2) trains
// the single rank's loss curve, the flags change it, and bad combinations
// are refused naming the flag. That each document of a packed sequence gets
// exactly what it gets alone is //models/gpt:packed_documents_test's proof.

#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "train/data/indexed_dataset.h"
#include "train/test_util.h"

namespace loom::train {
namespace {

using testing::Layout;

constexpr double kTolerance = 1e-6;  // as //train:trainer_equivalence_test
constexpr int kIters = 8;

// Documents of 3 to 12 bytes, each ended by the byte tokenizer's EOD (0),
// as preprocess_data --append-eod writes them: a 16-token sample holds
// several.
std::string PackedCorpus() {
  static const std::string prefix = [] {
    const std::string p = std::string(getenv("TEST_TMPDIR")) + "/packed";
    auto w = IndexedDatasetWriter::Create(p, TokenType::kU16);
    std::mt19937 rng(9);
    for (int doc = 0; doc < 300; ++doc) {
      std::vector<int32_t> t(3 + rng() % 10);
      const int base = 'a' + rng() % 20;
      for (size_t i = 0; i < t.size(); ++i) t[i] = base + (i % 4);
      t.push_back(0);
      (void)(*w)->AddSequence(t.data(), t.size());
      (void)(*w)->EndDocument();
    }
    (void)(*w)->Finalize();
    return p;
  }();
  return prefix;
}

TrainConfig Packed(const Layout& l, bool llama, bool flags = true) {
  TrainConfig c = llama ? testing::TinyLlamaConfig(l, kIters) : testing::TinyConfig(l, kIters);
  c.data_path = PackedCorpus();
  c.reset_position_ids = c.reset_attention_mask = c.eod_mask_loss = flags;
  return c;
}

TEST(PackedDocumentsTrainTest, EveryLayoutTrainsTheSingleRankCurve) {
  for (bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "llama" : "gpt2");
    testing::RunResult ref = testing::Run(Packed({}, llama), {});
    ASSERT_TRUE(ref.status.ok()) << ref.status;
    ASSERT_EQ(ref.losses.size(), static_cast<size_t>(kIters));
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
      testing::RunResult got = testing::Run(Packed(l, llama), l);
      ASSERT_TRUE(got.status.ok()) << l.Describe() << ": " << got.status;
      testing::ExpectSameCurve(got.losses, ref.losses, 0, kTolerance, l.Describe());
    }
    // Sanity: the flags change the run.
    testing::RunResult plain = testing::Run(Packed({}, llama, /*flags=*/false), {});
    ASSERT_TRUE(plain.status.ok()) << plain.status;
    EXPECT_GT(std::abs(plain.losses[0] - ref.losses[0]), 1e-3);
  }
}

TEST(PackedDocumentsTrainTest, TheGpuIsRefusedNamingTheFlag) {
  for (const char* flag : {"--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss"}) {
    TrainConfig c = Packed({}, false, false);
    const std::string f = flag;
    c.reset_position_ids = f == "--reset-position-ids";
    c.reset_attention_mask = f == "--reset-attention-mask";
    c.eod_mask_loss = f == "--eod-mask-loss";
    c.device = DeviceKind::kCuda;
    c.distributed_backend = "local";
    const absl::Status s = Finalize(&c, 1);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
    EXPECT_NE(s.message().find(f + " is not supported with --device=cuda"), std::string::npos)
        << s;
  }
}

// GPT-2's tokenizer files without <|endoftext|>: no EOD to find documents by.
TEST(PackedDocumentsTrainTest, ATokenizerWithoutEodIsRefused) {
  const std::string dir = std::string(getenv("TEST_SRCDIR")) + "/" + getenv("TEST_WORKSPACE") +
                          "/train/data/testdata/tokenizers/gpt2_style/";
  std::ifstream in(dir + "vocab.json");
  ASSERT_TRUE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json vocab = nlohmann::json::parse(text.str());
  ASSERT_EQ(vocab.erase("<|endoftext|>"), 1u);
  const std::string vocab_file = std::string(getenv("TEST_TMPDIR")) + "/no_eod_vocab.json";
  std::ofstream(vocab_file) << vocab.dump();
  TrainConfig c = Packed({}, false);
  c.reset_position_ids = c.eod_mask_loss = false;  // --reset-attention-mask alone
  c.tokenizer_type = TokenizerType::kGpt2Bpe;
  c.vocab_file = vocab_file;
  c.merge_file = dir + "merges.txt";
  const testing::RunResult r = testing::Run(c, {});
  ASSERT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find("--reset-attention-mask finds documents by the "
                                    "end-of-document token, and --tokenizer-type="
                                    "GPT2BPETokenizer here has none"),
            std::string::npos)
      << r.status;
}

}  // namespace
}  // namespace loom::train
