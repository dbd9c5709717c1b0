// HuggingFaceTokenizer (and the GPT-2 two-file tokenizer sharing its BPE)
// against Hugging Face `tokenizers`: the ids and decoded texts in
// testdata/tokenizers/expected.json, made by
// tools/tokenizer_reference/make_reference.sh, must match exactly.
#include "train/data/hf_tokenizer.h"

#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "train/data/byte_level_bpe.h"
#include "train/data/gpt2_bpe_tokenizer.h"
#include "train/data/tokenizer.h"

namespace loom::train {
namespace {

using Json = nlohmann::json;
using Pieces = std::vector<std::string>;

std::string TestData(const std::string& name = "") {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  std::string dir = std::string(srcdir ? srcdir : ".") + "/" + (ws ? ws : "loom") +
                    "/train/data/testdata/tokenizers";
  return name.empty() ? dir : dir + "/" + name;
}

std::string TmpPath(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

const Json& Expected() {
  static const Json* j = [] {
    std::ifstream in(TestData("expected.json"));
    std::stringstream ss;
    ss << in.rdbuf();
    return new Json(Json::parse(ss.str()));
  }();
  return *j;
}

// Every reference text: Loom's ids and decoded text equal the reference's.
void ExpectMatchesReference(const Tokenizer& t, const std::string& name) {
  const Json& texts = Expected()["texts"];
  const Json& ref = Expected()[name];
  ASSERT_EQ(ref["cases"].size(), texts.size());
  EXPECT_EQ(t.vocab_size(), ref["vocab_size"].get<int64_t>());
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i].get<std::string>();
    const Json& c = ref["cases"][i];
    const std::vector<int32_t> ids = t.Encode(text);
    EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>()) << name << " text " << i << ": " << text;
    EXPECT_EQ(t.Decode(c["ids"].get<std::vector<int32_t>>()), c["decoded"].get<std::string>())
        << name << " text " << i;
    if (c["lossless"].get<bool>()) {
      EXPECT_EQ(t.Decode(ids), text) << name << " text " << i;
    }
  }
}

TEST(HuggingFaceTokenizerTest, Gpt2StyleMatchesReference) {
  auto t = HuggingFaceTokenizer::Load(TestData("gpt2_style"));
  ASSERT_TRUE(t.ok()) << t.status();
  ExpectMatchesReference(**t, "gpt2_style");
  EXPECT_EQ((*t)->eod_id(), Expected()["gpt2_style"]["eod_id"].get<int32_t>());
  EXPECT_EQ((*t)->bos_id(), -1);
}

TEST(HuggingFaceTokenizerTest, Llama3StyleMatchesReference) {
  // The file itself (not its folder) works too; tokenizer_config.json beside
  // it names the eos token.
  auto t = HuggingFaceTokenizer::Load(TestData("llama3_style/tokenizer.json"));
  ASSERT_TRUE(t.ok()) << t.status();
  ExpectMatchesReference(**t, "llama3_style");
  EXPECT_EQ((*t)->eod_id(), Expected()["llama3_style"]["eod_id"].get<int32_t>());
  EXPECT_EQ((*t)->bos_id(), Expected()["llama3_style"]["bos_id"].get<int32_t>());
  // The post-processor puts <|begin_of_text|> first, so a round trip keeps it.
  EXPECT_EQ((*t)->Decode((*t)->Encode("caf\xC3\xA9 42")), "<|begin_of_text|>caf\xC3\xA9 42");
}

Json Gpt2StyleJson();
std::string Write(const std::string& name, const std::string& text);

TEST(HuggingFaceTokenizerTest, AddPrefixSpaceMatchesReference) {
  // The reference made the same edit (make_reference.py).
  Json j = Gpt2StyleJson();
  j["pre_tokenizer"]["add_prefix_space"] = true;
  auto t = HuggingFaceTokenizer::Load(Write("prefix_space.json", j.dump()));
  ASSERT_TRUE(t.ok()) << t.status();
  ExpectMatchesReference(**t, "gpt2_style_add_prefix_space");
}

TEST(HuggingFaceTokenizerTest, ThroughTheFactory) {
  TokenizerFiles files;
  files.tokenizer_model = TestData("gpt2_style");
  auto t = MakeTokenizer(TokenizerType::kHuggingFace, files);
  ASSERT_TRUE(t.ok()) << t.status();
  ExpectMatchesReference(**t, "gpt2_style");
}

TEST(Gpt2BpeTokenizerTest, VocabMergesMatchReference) {
  TokenizerFiles files;
  files.vocab_file = TestData("gpt2_style/vocab.json");
  files.merge_file = TestData("gpt2_style/merges.txt");
  auto t = MakeTokenizer(TokenizerType::kGpt2Bpe, files);
  ASSERT_TRUE(t.ok()) << t.status();
  ExpectMatchesReference(**t, "gpt2_style_vocab_merges");
}

// Pre-tokenizer pieces as Hugging Face's Split(..., "isolated") gives them
// (pre_tokenize_str in tokenizers 0.23.3).
TEST(SplitRegexTest, Gpt2PatternMatchesHuggingFace) {
  auto re = bpe::SplitRegex::Compile(bpe::kGpt2Pattern);
  ASSERT_TRUE(re.ok()) << re.status();
  auto split = [&](const std::string& s) {
    Pieces out;
    for (absl::string_view p : (*re)->Split(s)) out.emplace_back(p);
    return out;
  };
  EXPECT_EQ(split("I'M 1234567 ok!!\n\n  x"),
            (Pieces{"I", "'", "M", " 1234567", " ok", "!!", "\n\n ", " x"}));
  EXPECT_EQ(split("a   b\t\tc \n d  "), (Pieces{"a", "  ", " b", "\t", "\t", "c", " \n", " d", "  "}));
  EXPECT_EQ(split("don'T\r\n\r\nend.\n"), (Pieces{"don", "'", "T", "\r\n\r", "\n", "end", ".", "\n"}));
  // No-break space, ideographic space and U+0085 are whitespace (\s is Unicode).
  EXPECT_EQ(split("x\xC2\xA0\xC2\xA0y\xE3\x80\x80z\xC2\x85w"),
            (Pieces{"x", "\xC2\xA0", "\xC2\xA0", "y", "\xE3\x80\x80", "z", "\xC2\x85", "w"}));
}

TEST(SplitRegexTest, Llama3PatternMatchesHuggingFace) {
  auto re = bpe::SplitRegex::Compile(
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)");
  ASSERT_TRUE(re.ok()) << re.status();
  auto split = [&](const std::string& s) {
    Pieces out;
    for (absl::string_view p : (*re)->Split(s)) out.emplace_back(p);
    return out;
  };
  EXPECT_EQ(split("I'M 1234567 ok!!\n\n  x"),
            (Pieces{"I", "'M", " ", "123", "456", "7", " ok", "!!\n\n", " ", " x"}));
  EXPECT_EQ(split("a   b\t\tc \n d  "), (Pieces{"a", "  ", " b", "\t", "\tc", " \n", " d", "  "}));
  EXPECT_EQ(split("don'T\r\n\r\nend.\n"), (Pieces{"don", "'T", "\r\n\r\n", "end", ".\n"}));
  EXPECT_EQ(split("x\xC2\xA0\xC2\xA0y\xE3\x80\x80z\xC2\x85w"),
            (Pieces{"x", "\xC2\xA0", "\xC2\xA0y", "\xE3\x80\x80z", "\xC2\x85w"}));
}

TEST(SplitRegexTest, RejectsWhatRe2WouldMatchDifferently) {
  for (const char* pattern : {R"((?<=a)b)", R"(a(?=b))", R"(\w+)", R"(\bword)", R"([[:alpha:]]+)",
                              R"(^a)", R"(a*)", R"(\s+(?!\S))", R"((\s+(?!\S)|\s+))", R"((a)\1)"}) {
    auto re = bpe::SplitRegex::Compile(pattern);
    EXPECT_FALSE(re.ok()) << pattern;
    if (!re.ok()) {
      EXPECT_NE(re.status().message().find(pattern), std::string::npos) << re.status();
    }
  }
  EXPECT_TRUE(bpe::SplitRegex::Compile(R"(\p{N}{1,3}|(?i:x)|[^\s\d]+)").ok());
}

TEST(ByteLevelTest, DecodeReplacesInvalidUtf8AsHuggingFaceDoes) {
  EXPECT_EQ(bpe::Utf8Lossy("caf\xC3\xA9 \xF0\x9F\x99\x82"), "caf\xC3\xA9 \xF0\x9F\x99\x82");
  EXPECT_EQ(bpe::Utf8Lossy("a\xC3"), "a\xEF\xBF\xBD");
  // One U+FFFD per maximal invalid subpart.
  EXPECT_EQ(bpe::Utf8Lossy("\xE2\x82x\xFF"), "\xEF\xBF\xBDx\xEF\xBF\xBD");
  EXPECT_EQ(bpe::Utf8Lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  // A token that is not all byte symbols (an added token with a space) is kept whole.
  EXPECT_EQ(bpe::DecodeByteLevel({"\xC4\xA0hi", "hello world", "<|x|>"}), " hihello world<|x|>");
}

// --- Bad input: each error names the file and the JSON field. ---

Json Gpt2StyleJson() {
  std::ifstream in(TestData("gpt2_style/tokenizer.json"));
  std::stringstream ss;
  ss << in.rdbuf();
  return Json::parse(ss.str());
}

std::string Write(const std::string& name, const std::string& text) {
  std::string path = TmpPath(name);
  std::ofstream(path) << text;
  return path;
}

void ExpectError(const std::string& path, const std::vector<std::string>& parts) {
  auto t = HuggingFaceTokenizer::Load(path);
  ASSERT_FALSE(t.ok()) << path;
  for (const std::string& part : parts) {
    EXPECT_NE(t.status().message().find(part), std::string::npos)
        << "\"" << part << "\" not in: " << t.status().message();
  }
}

TEST(HuggingFaceTokenizerTest, MissingFiles) {
  ExpectError(TmpPath("no_such_dir"), {"--tokenizer-model=", "no_such_dir", "cannot open"});
  ExpectError(std::getenv("TEST_TMPDIR"), {"has no tokenizer.json"});
}

TEST(HuggingFaceTokenizerTest, InvalidJsonNamesTheFile) {
  std::string text = Gpt2StyleJson().dump();
  std::string truncated = Write("truncated.json", text.substr(0, text.size() / 2));
  ExpectError(truncated, {truncated, "not valid JSON"});
  std::string garbage = Write("garbage.json", "{\"model\": ");
  ExpectError(garbage, {garbage, "not valid JSON"});
  ExpectError(Write("array.json", "[1, 2]"), {"array.json", "not a JSON object"});
}

TEST(HuggingFaceTokenizerTest, UnsupportedModelTypesNameTheField) {
  Json j = Gpt2StyleJson();
  j["model"]["type"] = "WordPiece";
  std::string path = Write("wordpiece.json", j.dump());
  ExpectError(path, {path, "model.type", "WordPiece", "BPE"});
  j["model"] = {{"type", "Unigram"}, {"vocab", Json::array()}};
  ExpectError(Write("unigram.json", j.dump()), {"model.type", "Unigram"});
}

TEST(HuggingFaceTokenizerTest, UnsupportedComponentsNameTheField) {
  struct Case {
    std::string name;
    std::function<void(Json&)> edit;
    std::vector<std::string> expect;
  };
  std::vector<Case> cases = {
      {"normalizer", [](Json& j) { j["normalizer"] = {{"type", "NFKC"}}; },
       {"normalizer", "NFKC"}},
      {"metaspace", [](Json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}}; },
       {"pre_tokenizer.type", "Metaspace"}},
      {"lookbehind",
       [](Json& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers",
                                {{{"type", "Split"},
                                  {"pattern", {{"Regex", "(?<=x)y"}}},
                                  {"behavior", "Isolated"},
                                  {"invert", false}},
                                 {{"type", "ByteLevel"}, {"add_prefix_space", false},
                                  {"use_regex", false}}}}};
       },
       {"pre_tokenizer.pretokenizers[0].pattern.Regex", "lookaround"}},
      {"removed",
       [](Json& j) {
         j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}},
                               {"behavior", "Removed"}};
       },
       {"pre_tokenizer.behavior", "Removed"}},
      {"no_byte_level",
       [](Json& j) {
         j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}},
                               {"behavior", "Isolated"}};
       },
       {"pre_tokenizer", "ByteLevel"}},
      {"decoder", [](Json& j) { j["decoder"] = {{"type", "WordPiece"}}; },
       {"decoder", "WordPiece"}},
      {"no_decoder", [](Json& j) { j["decoder"] = nullptr; }, {"decoder", "null"}},
      {"roberta", [](Json& j) { j["post_processor"] = {{"type", "RobertaProcessing"}}; },
       {"post_processor.type", "RobertaProcessing"}},
      {"dropout", [](Json& j) { j["model"]["dropout"] = 0.1; }, {"model.dropout"}},
      {"lstrip", [](Json& j) { j["added_tokens"][1]["lstrip"] = true; },
       {"added_tokens[1].lstrip"}},
      {"bad_merge", [](Json& j) { j["model"]["merges"][3] = "x y z"; },
       {"model.merges[3]", "x y z"}},
      {"unknown_merge", [](Json& j) { j["model"]["merges"][0] = {"q", "\xC4\xA0zz"}; },
       {"model.merges[0]", "not in the vocabulary"}},
      {"missing_byte", [](Json& j) { j["model"]["vocab"].erase("A"); },
       {"model.vocab", "byte 65"}},
      {"truncation", [](Json& j) { j["truncation"] = {{"max_length", 8}}; }, {"truncation"}},
      {"wrong_json_type", [](Json& j) { j["model"]["vocab"] = Json::array(); }, {"model.vocab"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Json j = Gpt2StyleJson();
    c.edit(j);
    std::string path = Write(c.name + ".json", j.dump());
    std::vector<std::string> expect = c.expect;
    expect.push_back(path);
    ExpectError(path, expect);
  }
}

TEST(HuggingFaceTokenizerTest, BadTokenizerConfigNamesTheFile) {
  std::string dir = TmpPath("cfg");
  ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  std::ofstream(dir + "/tokenizer.json") << Gpt2StyleJson().dump();
  std::ofstream(dir + "/tokenizer_config.json") << R"({"eos_token": "<|nope|>"})";
  ExpectError(dir, {"tokenizer_config.json", "eos_token", "<|nope|>"});
  std::ofstream(dir + "/tokenizer_config.json") << R"({"eos_token": {"content": "<|pad|>"}})";
  auto t = HuggingFaceTokenizer::Load(dir);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->eod_id(), 1);
}

}  // namespace
}  // namespace loom::train
