#include "train/data/preprocess.h"

#include <sys/stat.h>

#include <fstream>

#include "gtest/gtest.h"
#include "train/data/byte_tokenizer.h"
#include "train/data/chat_template.h"
#include "train/data/hf_tokenizer.h"
#include "train/data/indexed_dataset.h"
#include "train/data/loss_mask.h"

namespace loom::train {
namespace {

std::string Tmp(const std::string& name) { return std::string(getenv("TEST_TMPDIR")) + "/" + name; }

std::vector<int32_t> Tokens(const IndexedDataset& ds, size_t seq) {
  std::vector<int32_t> t(ds.sequence_length(seq));
  EXPECT_TRUE(ds.Read(seq, 0, t.size(), t.data()).ok());
  return t;
}

TEST(PreprocessTest, FortuneStyleTextSplitsOnSeparator) {
  std::ofstream(Tmp("f.txt")) << "ab\n%\ncd\nef\n%\n";
  PreprocessOptions o;
  o.inputs = {Tmp("f.txt")};
  o.output_prefix = Tmp("fortune");
  o.document_separator = "%";
  ByteTokenizer bytes;
  int64_t last_done = -1;
  auto stats = Preprocess(o, bytes, [&](int64_t done, int64_t total) { last_done = done; });
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->documents, 2);
  EXPECT_EQ(stats->tokens, 3 + 6);
  EXPECT_EQ(last_done, 13);  // all bytes of the file
  auto ds = IndexedDataset::Open(Tmp("fortune"));
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ((*ds)->token_type(), TokenType::kU16);
  EXPECT_EQ(bytes.Decode(Tokens(**ds, 1)), "cd\nef\n");
}

TEST(PreprocessTest, JsonLinesWithEod) {
  std::ofstream(Tmp("d.jsonl")) << "{\"text\": \"hi\"}\n\n{\"text\": \"yo!\", \"id\": 3}\n";
  PreprocessOptions o;
  o.inputs = {Tmp("d.jsonl")};
  o.output_prefix = Tmp("jsonl");
  o.append_eod = true;
  ByteTokenizer bytes;
  auto stats = Preprocess(o, bytes);
  ASSERT_TRUE(stats.ok()) << stats.status();
  auto ds = IndexedDataset::Open(Tmp("jsonl"));
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ(Tokens(**ds, 0), (std::vector<int32_t>{'h', 'i', 0}));
  EXPECT_EQ((*ds)->num_documents(), 2u);
}

TEST(PreprocessTest, BadJsonNamesFileAndLine) {
  std::ofstream(Tmp("bad.jsonl")) << "{\"text\": \"ok\"}\n{\"body\": \"x\"}\n";
  PreprocessOptions o;
  o.inputs = {Tmp("bad.jsonl")};
  o.output_prefix = Tmp("bad");
  ByteTokenizer bytes;
  auto stats = Preprocess(o, bytes);
  ASSERT_FALSE(stats.ok());
  EXPECT_NE(stats.status().message().find("bad.jsonl:2"), std::string::npos);
  EXPECT_NE(stats.status().message().find("--json-keys"), std::string::npos);
  // Nothing half-written is left behind.
  EXPECT_FALSE(std::ifstream(Tmp("bad.idx")).good());
  EXPECT_FALSE(std::ifstream(Tmp("bad.bin")).good());
}

TEST(PreprocessTest, MissingInputIsAnError) {
  PreprocessOptions o;
  o.inputs = {Tmp("nope.txt")};
  o.output_prefix = Tmp("x");
  ByteTokenizer bytes;
  auto stats = Preprocess(o, bytes);
  ASSERT_FALSE(stats.ok());
  EXPECT_NE(stats.status().message().find("nope.txt"), std::string::npos);
}

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// --workers: the same files, byte for byte, for 1 and 3 threads, over more
// documents than one batch holds (4096) and with a BPE tokenizer whose merge
// cache the threads share.
TEST(PreprocessTest, WorkersWriteTheSameFilesAsOne) {
  {
    std::ofstream out(Tmp("many.jsonl"));
    for (int i = 0; i < 5000; ++i) {
      out << "{\"text\": \"document " << i << ": the quick brown fox " << (i * 7919 % 1000)
          << " jumps over the lazy dog\"}\n";
    }
  }
  auto tokenizer = HuggingFaceTokenizer::Load("train/data/testdata/tokenizers/gpt2_style");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  for (int workers : {1, 3}) {
    PreprocessOptions o;
    o.inputs = {Tmp("many.jsonl")};
    o.output_prefix = Tmp("many" + std::to_string(workers));
    o.append_eod = true;
    o.workers = workers;
    auto stats = Preprocess(o, **tokenizer);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->documents, 5000);
  }
  EXPECT_EQ(FileBytes(Tmp("many1.bin")), FileBytes(Tmp("many3.bin")));
  EXPECT_EQ(FileBytes(Tmp("many1.idx")), FileBytes(Tmp("many3.idx")));
  auto ds = IndexedDataset::Open(Tmp("many3"));
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ((*tokenizer)->Decode(Tokens(**ds, 4999)),
            "document 4999: the quick brown fox 81 jumps over the lazy dog<|endoftext|>");

  PreprocessOptions zero;
  zero.inputs = {Tmp("many.jsonl")};
  zero.output_prefix = Tmp("zero");
  zero.workers = 0;
  auto refused = Preprocess(zero, **tokenizer);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--workers=0"), std::string::npos);
}

const char kQwen2Style[] = "train/data/testdata/chat/qwen2_style";

struct Sft {
  std::unique_ptr<HuggingFaceTokenizer> tokenizer;
  ChatTemplate chat;
};

Sft LoadSft(const std::string& folder) {
  auto tokenizer = HuggingFaceTokenizer::Load(folder);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto chat = ChatTemplate::Load(folder);
  EXPECT_TRUE(chat.ok()) << chat.status();
  return {*std::move(tokenizer), *std::move(chat)};
}

bool Exists(const std::string& path) { return std::ifstream(path).good(); }

// Each conversation of the reference is one document of ids and one of mask,
// equal to transformers' input_ids and assistant_masks (plus the EOD with
// --append-eod, mask 0).
TEST(PreprocessSftTest, WritesIdsAndTheirLossMask) {
  std::ifstream in(std::string(kQwen2Style) + "/reference.json");
  nlohmann::ordered_json reference = nlohmann::ordered_json::parse(in)["conversations"];
  {
    std::ofstream out(Tmp("chat.jsonl"));
    for (const auto& c : reference) out << nlohmann::ordered_json{{"messages", c["messages"]}}.dump() << "\n\n";
  }
  Sft sft = LoadSft(kQwen2Style);
  PreprocessOptions o;
  o.inputs = {Tmp("chat.jsonl")};
  o.output_prefix = Tmp("sft");
  o.append_eod = true;
  auto stats = PreprocessSft(o, *sft.tokenizer, sft.chat);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->documents, static_cast<int64_t>(reference.size()));
  auto ids = IndexedDataset::Open(Tmp("sft"));
  ASSERT_TRUE(ids.ok()) << ids.status();
  auto mask = IndexedDataset::Open(LossMaskPrefix(Tmp("sft")));
  ASSERT_TRUE(mask.ok()) << mask.status();
  EXPECT_EQ((*mask)->token_type(), TokenType::kU8);
  ASSERT_EQ((*ids)->num_documents(), reference.size());
  EXPECT_EQ((*mask)->document_index(), (*ids)->document_index());
  int64_t loss_tokens = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    std::vector<int32_t> want_ids = reference[i]["input_ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> want_mask = reference[i]["assistant_masks"].get<std::vector<int32_t>>();
    want_ids.push_back(sft.tokenizer->eod_id());
    want_mask.push_back(0);
    EXPECT_EQ(Tokens(**ids, i), want_ids) << i;
    EXPECT_EQ(Tokens(**mask, i), want_mask) << i;
    for (int32_t m : want_mask) loss_tokens += m;
  }
  EXPECT_EQ(stats->loss_tokens, loss_tokens);
}

std::string SftError(const std::string& jsonl, const std::string& folder = kQwen2Style) {
  std::ofstream(Tmp("e.jsonl")) << jsonl;
  Sft sft = LoadSft(folder);
  PreprocessOptions o;
  o.inputs = {Tmp("e.jsonl")};
  o.output_prefix = Tmp("e");
  auto stats = PreprocessSft(o, *sft.tokenizer, sft.chat);
  // Nothing half-written, ids nor mask.
  for (const char* suffix : {".bin", ".idx", "_loss_mask.bin", "_loss_mask.idx", ".bin.tmp",
                             "_loss_mask.bin.tmp"}) {
    EXPECT_FALSE(Exists(Tmp("e") + suffix)) << suffix;
  }
  return stats.ok() ? "ok" : std::string(stats.status().message());
}

const char kGood[] = R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})";

TEST(PreprocessSftTest, BadInputNamesFileAndLine) {
  const std::string file = Tmp("e.jsonl");
  EXPECT_EQ(SftError(std::string(kGood) + "\n{\"messages\": [\n"), file + ":2: not valid JSON");
  EXPECT_EQ(SftError(std::string(kGood) + "\n\n{\"text\": \"x\"}\n"),
            file + ":3: expected a JSON object with a \"messages\" array of {\"role\": ..., "
                   "\"content\": ...} (--sft)");
  EXPECT_EQ(SftError(R"({"messages": [{"content": "x"}]})"),
            file + ":1: message 0: expected an object with a string \"role\"");
  EXPECT_EQ(SftError(std::string(kGood) + "\n" +
                     R"({"messages": [{"role": "user", "content": "only a question"}]})"),
            file + ":2: the conversation has no assistant turn (nothing to train on)");
  // The template's own error, with both places: the line and the template's line.
  EXPECT_EQ(SftError(R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "tool_calls": []}]})"),
            file + ":1: " + kQwen2Style + "/chat_template.jinja:17: the template raised an exception: "
                   "tool calls are not part of this test template");
}

TEST(PreprocessSftTest, UndefinedTemplateVariableNamesIt) {
  const std::string dir = Tmp("undefined_var");
  mkdir(dir.c_str(), 0755);
  std::ifstream src(std::string(kQwen2Style) + "/tokenizer.json", std::ios::binary);
  std::ofstream(dir + "/tokenizer.json", std::ios::binary) << src.rdbuf();
  std::ofstream(dir + "/chat_template.jinja")
      << "{% for m in messages %}\n{{ m.content }}{% generation %}{{ eos_tokn }}{% endgeneration %}{% endfor %}";
  EXPECT_EQ(SftError(kGood, dir), Tmp("e.jsonl") + ":1: " + dir +
                                      "/chat_template.jinja:2: undefined variable 'eos_tokn'");
}

}  // namespace
}  // namespace loom::train
