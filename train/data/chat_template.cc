#include "train/data/chat_template.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace loom::train {
namespace {

using Json = nlohmann::ordered_json;

bool IsFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// What transformers passes as special_tokens_map: each token that is set, by
// its content.
jinja::Dict SpecialTokens(const Json& config) {
  jinja::Dict out;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                          "cls_token", "mask_token"}) {
    if (!config.contains(key)) continue;
    const Json& v = config[key];
    if (v.is_string()) {
      out.emplace_back(key, jinja::Value::String(v.get<std::string>()));
    } else if (v.is_object() && v.contains("content") && v["content"].is_string()) {
      out.emplace_back(key, jinja::Value::String(v["content"].get<std::string>()));
    }
  }
  return out;
}

// transformers' _alias_reasoning_fields: the first of reasoning_content,
// thinking, reasoning that is set fills `thinking` (first) and
// `reasoning_content` (last).
jinja::Value Message(const Json& message) {
  jinja::Dict fields;
  for (auto it = message.begin(); it != message.end(); ++it) {
    if (!it->is_null()) fields.emplace_back(it.key(), jinja::Value::FromJson(*it));
  }
  const jinja::Value* reasoning = nullptr;
  jinja::Value m = jinja::Value::MakeDict(fields);
  for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
    if ((reasoning = m.Find(key)) != nullptr) break;
  }
  if (reasoning == nullptr) return m;
  jinja::Value r = *reasoning;
  jinja::Dict aliased;
  if (m.Find("thinking") == nullptr) aliased.emplace_back("thinking", r);
  for (auto& [k, v] : fields) aliased.emplace_back(k, k == "reasoning_content" ? r : v);
  if (m.Find("reasoning_content") == nullptr) aliased.emplace_back("reasoning_content", r);
  return jinja::Value::MakeDict(std::move(aliased));
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Load(const std::string& tokenizer_path) {
  std::string dir = tokenizer_path;
  if (absl::EndsWith(dir, ".json") && IsFile(dir)) {
    size_t slash = dir.rfind('/');
    dir = slash == std::string::npos ? "." : dir.substr(0, slash);
  }
  const std::string jinja_file = absl::StrCat(dir, "/chat_template.jinja");
  const std::string config_file = absl::StrCat(dir, "/tokenizer_config.json");
  Json config = Json::object();
  if (IsFile(config_file)) {
    absl::StatusOr<std::string> text = ReadFile(config_file);
    if (!text.ok()) return text.status();
    config = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (!config.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(config_file, ": not a JSON object"));
    }
  }
  std::string source, name;
  if (IsFile(jinja_file)) {
    absl::StatusOr<std::string> text = ReadFile(jinja_file);
    if (!text.ok()) return text.status();
    source = *text;
    name = jinja_file;
  } else if (config.contains("chat_template")) {
    const Json& t = config["chat_template"];
    if (!t.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          config_file, ": chat_template is a list of named templates; Loom reads one template "
                       "(a string, or chat_template.jinja)"));
    }
    source = t.get<std::string>();
    name = absl::StrCat(config_file, " (chat_template)");
  } else {
    return absl::NotFoundError(absl::StrCat(
        "no chat template in ", dir, ": expected chat_template.jinja or a \"chat_template\" in ",
        "tokenizer_config.json"));
  }
  absl::StatusOr<jinja::Template> parsed = jinja::Template::Parse(source, name);
  if (!parsed.ok()) return parsed.status();
  ChatTemplate t;
  t.template_ = *std::move(parsed);
  t.special_tokens_ = SpecialTokens(config);
  return t;
}

absl::StatusOr<jinja::Rendered> ChatTemplate::Render(const nlohmann::ordered_json& messages,
                                                     const nlohmann::ordered_json& tools,
                                                     bool add_generation_prompt) const {
  if (!messages.is_array()) return absl::InvalidArgumentError("\"messages\" must be a JSON array");
  jinja::List list;
  for (const Json& m : messages) {
    if (!m.is_object()) return absl::InvalidArgumentError("each message must be a JSON object");
    try {
      list.push_back(Message(m));
    } catch (const jinja::TemplateError& e) {
      return absl::InvalidArgumentError(e.what());
    }
  }
  jinja::Dict variables = special_tokens_;
  variables.emplace_back("messages", jinja::Value::MakeList(std::move(list)));
  try {
    variables.emplace_back("tools", jinja::Value::FromJson(tools));
  } catch (const jinja::TemplateError& e) {
    return absl::InvalidArgumentError(absl::StrCat("\"tools\": ", e.what()));
  }
  variables.emplace_back("documents", jinja::Value());
  variables.emplace_back("add_generation_prompt", jinja::Value::Bool(add_generation_prompt));
  return template_.Render(variables);
}

absl::StatusOr<ChatTokens> ChatTemplate::Tokenize(const nlohmann::ordered_json& messages,
                                                  const nlohmann::ordered_json& tools,
                                                  const HuggingFaceTokenizer& tokenizer) const {
  absl::StatusOr<jinja::Rendered> rendered = Render(messages, tools);
  if (!rendered.ok()) return rendered.status();
  if (rendered->generation_spans.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        file(), ": the template marks no assistant tokens (it needs {% generation %} ... "
                "{% endgeneration %} around each answer, as transformers' "
                "return_assistant_tokens_mask does)"));
  }
  std::vector<std::pair<size_t, size_t>> offsets;
  ChatTokens out;
  out.ids = tokenizer.EncodeWithOffsets(rendered->text, &offsets);
  out.assistant_mask.assign(out.ids.size(), 0);
  // transformers' rule: a token is the assistant's when it overlaps a span
  // (spans and offsets both in order, one pass).
  const auto& spans = rendered->generation_spans;
  size_t span = 0;
  for (size_t i = 0; i < offsets.size(); ++i) {
    while (span < spans.size() && offsets[i].first >= spans[span].second) ++span;
    if (span == spans.size()) break;
    if (offsets[i].second > spans[span].first) out.assistant_mask[i] = 1;
  }
  return out;
}

}  // namespace loom::train
