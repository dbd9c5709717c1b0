#include "train/data/tokenizer.h"

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "train/data/byte_tokenizer.h"
#include "train/data/gpt2_bpe_tokenizer.h"

namespace loom::train {
namespace {

std::string TmpPath(const std::string& name) {
  return std::string(getenv("TEST_TMPDIR")) + "/" + name;
}

// The printable stand-in for each byte, as in OpenAI's bytes_to_unicode.
std::string ByteSymbol(int b) {
  bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  int cp = b;
  if (!printable) {
    int n = 0;
    for (int x = 0; x < b; ++x) {
      bool p = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
      if (!p) ++n;
    }
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

// A tiny GPT-2-format vocabulary: 256 byte symbols (id = byte), then
// he=256, Ġt=257, Ġthe=258, ll=259, <|endoftext|>=260.
void WriteTinyVocab(const std::string& vocab, const std::string& merges) {
  nlohmann::json v = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) v[ByteSymbol(b)] = b;
  v["he"] = 256;
  v["\xC4\xA0t"] = 257;  // "Ġt"
  v["\xC4\xA0the"] = 258;
  v["ll"] = 259;
  v["<|endoftext|>"] = 260;
  std::ofstream(vocab) << v.dump();
  std::ofstream(merges) << "#version: 0.2\nh e\n\xC4\xA0 t\n\xC4\xA0t he\nl l\n";
}

TEST(ByteTokenizerTest, RoundTripsAnyBytes) {
  ByteTokenizer t;
  std::string text = "caf\xC3\xA9 \x01\xFF";
  std::vector<int32_t> ids = t.Encode(text);
  ASSERT_EQ(ids.size(), text.size());
  EXPECT_EQ(ids[3], 0xC3);
  EXPECT_EQ(ids.back(), 255);
  EXPECT_EQ(t.Decode(ids), text);
  EXPECT_EQ(t.vocab_size(), 256);
}

TEST(Gpt2BpeTokenizerTest, PreTokenizerFollowsGpt2Pattern) {
  std::string vocab = TmpPath("v1.json"), merges = TmpPath("m1.txt");
  WriteTinyVocab(vocab, merges);
  auto t = Gpt2BpeTokenizer::Load(vocab, merges);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->PreTokenize("I'm 42 cats!!\n\nok"),
            (std::vector<std::string>{"I", "'m", " 42", " cats", "!!", "\n", "\n", "ok"}));
  // A run of spaces before a word keeps its last space for the word.
  EXPECT_EQ((*t)->PreTokenize("a   b"), (std::vector<std::string>{"a", "  ", " b"}));
  // Trailing whitespace stays whole; non-ASCII letters are letters.
  EXPECT_EQ((*t)->PreTokenize("h\xC3\xA9llo  "), (std::vector<std::string>{"h\xC3\xA9llo", "  "}));
}

TEST(Gpt2BpeTokenizerTest, AppliesMergesByRank) {
  std::string vocab = TmpPath("v2.json"), merges = TmpPath("m2.txt");
  WriteTinyVocab(vocab, merges);
  auto t = Gpt2BpeTokenizer::Load(vocab, merges);
  ASSERT_TRUE(t.ok()) << t.status();
  // "the" -> t,he ; " hello" -> Ġ,he,ll,o ; " " -> Ġ ; " the" -> Ġthe
  std::vector<int32_t> ids = (*t)->Encode("the hello  the");
  EXPECT_EQ(ids, (std::vector<int32_t>{116, 256, 32, 256, 259, 111, 32, 258}));
  EXPECT_EQ((*t)->Decode(ids), "the hello  the");
  EXPECT_EQ((*t)->eod_id(), 260);
  EXPECT_EQ((*t)->vocab_size(), 261);
  // Second call hits the cache and must agree.
  EXPECT_EQ((*t)->Encode("the hello  the"), ids);
}

TEST(Gpt2BpeTokenizerTest, BadFilesAreClearErrors) {
  std::string vocab = TmpPath("v3.json"), merges = TmpPath("m3.txt");
  WriteTinyVocab(vocab, merges);
  auto missing = Gpt2BpeTokenizer::Load(TmpPath("nope.json"), merges);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("--vocab-file"), std::string::npos);

  std::ofstream(TmpPath("bad.json")) << "[1, 2]";
  auto not_object = Gpt2BpeTokenizer::Load(TmpPath("bad.json"), merges);
  ASSERT_FALSE(not_object.ok());
  EXPECT_NE(not_object.status().message().find("JSON object"), std::string::npos);

  std::ofstream(TmpPath("badm.txt")) << "#version: 0.2\nx y z\n";
  auto bad_merge = Gpt2BpeTokenizer::Load(vocab, TmpPath("badm.txt"));
  ASSERT_FALSE(bad_merge.ok());
  EXPECT_NE(bad_merge.status().message().find("line 2"), std::string::npos);

  std::ofstream(TmpPath("unk.txt")) << "q z\n";
  auto unknown_result = Gpt2BpeTokenizer::Load(vocab, TmpPath("unk.txt"));
  ASSERT_FALSE(unknown_result.ok());
  EXPECT_NE(unknown_result.status().message().find("\"qz\""), std::string::npos);
}

// --tokenizer-type is parsed at the flag boundary: Megatron's names (and
// "byte"), exactly; anything else is refused with the choices.
TEST(TokenizerTypeTest, ParsesMegatronNames) {
  EXPECT_EQ(core::FindEnum<TokenizerType>("ByteLevelTokenizer"), TokenizerType::kByteLevel);
  EXPECT_EQ(core::FindEnum<TokenizerType>("byte"), TokenizerType::kByteLevel);
  EXPECT_EQ(core::FindEnum<TokenizerType>("GPT2BPETokenizer"), TokenizerType::kGpt2Bpe);
  EXPECT_EQ(core::FindEnum<TokenizerType>("HuggingFaceTokenizer"), TokenizerType::kHuggingFace);
  EXPECT_EQ(core::FindEnum<TokenizerType>("SentencePieceTokenizer"),
            TokenizerType::kSentencePiece);
  EXPECT_EQ(core::EnumName(TokenizerType::kByteLevel), "ByteLevelTokenizer");
  TokenizerType parsed;
  std::string error;
  EXPECT_FALSE(AbslParseFlag("Sentencepiece", &parsed, &error));
  EXPECT_NE(error.find("expected one of ByteLevelTokenizer | GPT2BPETokenizer | "
                       "HuggingFaceTokenizer | SentencePieceTokenizer"),
            std::string::npos)
      << error;
}

TEST(MakeTokenizerTest, NamesTheFlag) {
  EXPECT_TRUE(MakeTokenizer(TokenizerType::kByteLevel, {}).ok());
  auto no_files = MakeTokenizer(TokenizerType::kGpt2Bpe, {});
  ASSERT_FALSE(no_files.ok());
  EXPECT_NE(no_files.status().message().find("--vocab-file"), std::string::npos);
  for (TokenizerType type : {TokenizerType::kHuggingFace, TokenizerType::kSentencePiece}) {
    auto no_model = MakeTokenizer(type, {});
    ASSERT_FALSE(no_model.ok()) << core::EnumName(type);
    EXPECT_NE(no_model.status().message().find(
                  absl::StrCat("--tokenizer-type=", core::EnumName(type))),
              std::string::npos)
        << no_model.status();
    EXPECT_NE(no_model.status().message().find("needs --tokenizer-model"), std::string::npos)
        << no_model.status();
  }
  TokenizerFiles missing;
  missing.tokenizer_model = TmpPath("no_such_tokenizer");
  auto not_there = MakeTokenizer(TokenizerType::kHuggingFace, missing);
  ASSERT_FALSE(not_there.ok());
  EXPECT_NE(not_there.status().message().find("--tokenizer-model=" + missing.tokenizer_model),
            std::string::npos)
      << not_there.status();
}

}  // namespace
}  // namespace loom::train
