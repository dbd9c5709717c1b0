#include "train/data/chat_template.h"

#include <sys/stat.h>

#include <fstream>

#include "gtest/gtest.h"

namespace loom::train {
namespace {

using Json = nlohmann::ordered_json;

const char kChat[] = "train/data/testdata/chat/";

std::string Tmp(const std::string& name) { return std::string(getenv("TEST_TMPDIR")) + "/" + name; }

// Loom's text, ids and assistant mask equal those of transformers'
// apply_chat_template(..., return_assistant_tokens_mask=True), written by
// tools/chat_template_reference/make_reference.py, for every conversation
// (single and multi-turn, system prompts, unicode, whitespace) and style.
class ReferenceTest : public testing::TestWithParam<std::string> {};

TEST_P(ReferenceTest, TextIdsAndMasksEqualTransformers) {
  const std::string folder = kChat + GetParam();
  auto tokenizer = HuggingFaceTokenizer::Load(folder);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto chat = ChatTemplate::Load(folder);
  ASSERT_TRUE(chat.ok()) << chat.status();
  std::ifstream in(folder + "/reference.json");
  Json reference = Json::parse(in);
  ASSERT_GE(reference["conversations"].size(), 5u);
  int masked = 0, tokens = 0;
  for (const Json& c : reference["conversations"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    auto rendered = chat->Render(c["messages"]);
    ASSERT_TRUE(rendered.ok()) << rendered.status();
    EXPECT_EQ(rendered->text, c["text"].get<std::string>());
    auto out = chat->Tokenize(c["messages"], nullptr, **tokenizer);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->ids, c["input_ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(out->assistant_mask, c["assistant_masks"].get<std::vector<uint8_t>>());
    for (uint8_t m : out->assistant_mask) masked += m;
    tokens += static_cast<int>(out->ids.size());
  }
  // Both classes of token are present: the mask is not trivially all 0 or 1.
  EXPECT_GT(masked, 20);
  EXPECT_LT(masked, tokens - 20);
}

INSTANTIATE_TEST_SUITE_P(Styles, ReferenceTest,
                         testing::Values("llama3_style", "qwen2_style", "mistral_style"));

TEST(ChatTemplateTest, TemplateFromTokenizerConfigAndSpecialTokens) {
  const std::string dir = Tmp("from_config");
  mkdir(dir.c_str(), 0755);
  std::ofstream(dir + "/tokenizer_config.json")
      << R"({"bos_token": {"content": "<s>"}, "eos_token": "</s>", "chat_template": )"
      << R"("{{ bos_token }}{% for m in messages %}{{ m.role }}:{% generation %}{{ m.content }}{{ eos_token }}{% endgeneration %}{% endfor %}"})";
  auto chat = ChatTemplate::Load(dir);
  ASSERT_TRUE(chat.ok()) << chat.status();
  auto r = chat->Render(Json::parse(R"([{"role": "assistant", "content": "hi", "name": null}])"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->text, "<s>assistant:hi</s>");
}

// A conversation's tools reach the template (None without them).
TEST(ChatTemplateTest, ToolsReachTheTemplate) {
  const std::string dir = Tmp("tools");
  mkdir(dir.c_str(), 0755);
  std::ofstream(dir + "/chat_template.jinja")
      << "{% if tools is none %}none{% else %}{{ tools | tojson }}{% endif %}";
  auto chat = ChatTemplate::Load(dir);
  ASSERT_TRUE(chat.ok()) << chat.status();
  Json messages = Json::parse(R"([{"role": "user", "content": "q"}])");
  EXPECT_EQ(chat->Render(messages)->text, "none");
  EXPECT_EQ(chat->Render(messages, Json::parse(R"([{"name": "f", "b": 1, "a": [true]}])"))->text,
            R"([{"name": "f", "b": 1, "a": [true]}])");
}

TEST(ChatTemplateTest, ErrorsNameTheFile) {
  const std::string dir = Tmp("no_template");
  mkdir(dir.c_str(), 0755);
  std::ofstream(dir + "/tokenizer_config.json") << "{}";
  auto missing = ChatTemplate::Load(dir);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(),
            "no chat template in " + dir +
                ": expected chat_template.jinja or a \"chat_template\" in tokenizer_config.json");

  std::ofstream(dir + "/chat_template.jinja") << "{% for m in messages %}\n{{ m.content }}{% macro x() %}{% endmacro %}{% endfor %}";
  auto bad = ChatTemplate::Load(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), dir + "/chat_template.jinja:2: unsupported construct {% macro %}");

  std::ofstream(dir + "/chat_template.jinja") << "{% for m in messages %}{{ m.content }}{% endfor %}";
  auto no_generation = ChatTemplate::Load(dir);
  ASSERT_TRUE(no_generation.ok());
  auto tokenizer = HuggingFaceTokenizer::Load(std::string(kChat) + "qwen2_style");
  ASSERT_TRUE(tokenizer.ok());
  auto out = no_generation->Tokenize(
      Json::parse(R"([{"role": "assistant", "content": "x"}])"), nullptr, **tokenizer);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(),
            dir + "/chat_template.jinja: the template marks no assistant tokens (it needs "
                  "{% generation %} ... {% endgeneration %} around each answer, as transformers' "
                  "return_assistant_tokens_mask does)");
}

// Mistral's template refuses roles out of order through raise_exception.
TEST(ChatTemplateTest, TemplateExceptionsReachTheCaller) {
  auto chat = ChatTemplate::Load(std::string(kChat) + "mistral_style");
  ASSERT_TRUE(chat.ok());
  auto r = chat->Render(Json::parse(R"([{"role": "assistant", "content": "x"}])"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("chat_template.jinja:14: the template raised an exception: "
                                      "After the optional system message"),
            std::string::npos)
      << r.status();
}

}  // namespace
}  // namespace loom::train
