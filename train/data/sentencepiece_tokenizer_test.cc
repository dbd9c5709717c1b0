// SentencePieceTokenizer (Debian's libsentencepiece through
// libloom_sentencepiece.so) against Python's sentencepiece: the ids and
// decoded texts in testdata/tokenizers/expected.json, made by
// tools/tokenizer_reference/make_reference.sh, must match exactly.
#include "train/data/sentencepiece_tokenizer.h"

#include <google/protobuf/stubs/common.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "train/data/tokenizer.h"

namespace loom::train {
namespace {

using Json = nlohmann::json;

std::string TestData(const std::string& name) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  return std::string(srcdir ? srcdir : ".") + "/" + (ws ? ws : "loom") +
         "/train/data/testdata/tokenizers/" + name;
}

std::string TmpPath(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

// Sanitizer builds cannot isolate libsentencepiece from the linked protobuf
// (RTLD_DEEPBIND is refused there): the tokenizer says so, and the test skips.
#define SKIP_IF_SANITIZER_BUILD(status)                                        \
  if (absl::IsFailedPrecondition(status) &&                                    \
      (status).message().find("sanitizer") != absl::string_view::npos) {      \
    GTEST_SKIP() << (status).message();                                        \
  }

Json Expected() {
  std::ifstream in(TestData("expected.json"));
  std::stringstream ss;
  ss << in.rdbuf();
  return Json::parse(ss.str());
}

TEST(SentencePieceTokenizerTest, MatchesReference) {
  // This test links the system's libprotobuf (as the trainer does, through
  // //checkpoint): libsentencepiece's bundled protobuf must not clash with it.
  GOOGLE_PROTOBUF_VERIFY_VERSION;
  TokenizerFiles files;
  files.tokenizer_model = TestData("spm_bpe.model");
  auto t = MakeTokenizer(TokenizerType::kSentencePiece, files);
  SKIP_IF_SANITIZER_BUILD(t.status());
  ASSERT_TRUE(t.ok()) << t.status();
  const Json expected = Expected();
  const Json& ref = expected["spm_bpe"];
  EXPECT_EQ((*t)->vocab_size(), ref["vocab_size"].get<int64_t>());
  EXPECT_EQ((*t)->bos_id(), ref["bos_id"].get<int32_t>());
  EXPECT_EQ((*t)->eod_id(), ref["eos_id"].get<int32_t>());
  const Json& texts = expected["texts"];
  ASSERT_EQ(ref["cases"].size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i].get<std::string>();
    const Json& c = ref["cases"][i];
    const std::vector<int32_t> ids = (*t)->Encode(text);
    EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>()) << "text " << i << ": " << text;
    EXPECT_EQ((*t)->Decode(c["ids"].get<std::vector<int32_t>>()), c["decoded"].get<std::string>())
        << "text " << i;
    if (c["lossless"].get<bool>()) {
      EXPECT_EQ((*t)->Decode(ids), text) << "text " << i;
    }
  }
  // Ids outside the vocabulary are skipped, not an error.
  std::vector<int32_t> ids = (*t)->Encode("hello");
  std::vector<int32_t> with_bad = ids;
  with_bad.push_back(-1);
  with_bad.push_back(1 << 20);
  EXPECT_EQ((*t)->Decode(with_bad), "hello");
}

TEST(SentencePieceTokenizerTest, BadFilesAreClearErrors) {
  auto missing = SentencePieceTokenizer::Load(TmpPath("nope.model"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("--tokenizer-model="), std::string::npos);
  EXPECT_NE(missing.status().message().find("nope.model"), std::string::npos);

  std::string garbage = TmpPath("garbage.model");
  std::ofstream(garbage) << "this is not a protobuf";
  auto bad = SentencePieceTokenizer::Load(garbage);
  SKIP_IF_SANITIZER_BUILD(bad.status());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(garbage), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("not a SentencePiece model"), std::string::npos)
      << bad.status();

  // A truncated model file.
  std::ifstream in(TestData("spm_bpe.model"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string truncated = TmpPath("truncated.model");
  std::ofstream(truncated, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  auto cut = SentencePieceTokenizer::Load(truncated);
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find(truncated), std::string::npos) << cut.status();
}

}  // namespace
}  // namespace loom::train
