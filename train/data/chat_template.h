#ifndef LOOM_TRAIN_DATA_CHAT_TEMPLATE_H_
#define LOOM_TRAIN_DATA_CHAT_TEMPLATE_H_

// A model's chat template, read from its tokenizer folder as transformers
// reads it (chat_template.jinja, else tokenizer_config.json's
// "chat_template"), rendering a conversation and tokenizing it as
//   tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True,
//                                 return_assistant_tokens_mask=True)
// does: same text, same ids, same assistant mask. The template is Jinja,
// interpreted by train/data/jinja (what it refuses, it refuses by name).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "train/data/hf_tokenizer.h"
#include "train/data/jinja/template.h"
#include "train/data/jinja/value.h"

namespace loom::train {

struct ChatTokens {
  std::vector<int32_t> ids;
  // 1 for each token that overlaps a {% generation %} span (the assistant's
  // answers), as transformers marks them; else 0.
  std::vector<uint8_t> assistant_mask;
};

class ChatTemplate {
 public:
  // `tokenizer_path`: the tokenizer folder (or its tokenizer.json). Errors
  // name the file: no template there, a template that does not parse.
  static absl::StatusOr<ChatTemplate> Load(const std::string& tokenizer_path);

  // `messages`: the conversation's JSON array of {"role", "content", ...}.
  // Keys whose value is null are dropped and reasoning fields aliased, as
  // transformers does; the template also sees `tools` (JSON null: None),
  // add_generation_prompt, documents = None, and tokenizer_config.json's
  // special tokens (bos_token, eos_token, ...).
  absl::StatusOr<jinja::Rendered> Render(const nlohmann::ordered_json& messages,
                                         const nlohmann::ordered_json& tools = nullptr,
                                         bool add_generation_prompt = false) const;

  // Renders and tokenizes (no special tokens added: the template writes
  // them); the mask comes from the generation spans. An error when the
  // template marks no assistant tokens.
  absl::StatusOr<ChatTokens> Tokenize(const nlohmann::ordered_json& messages,
                                      const nlohmann::ordered_json& tools,
                                      const HuggingFaceTokenizer& tokenizer) const;

  const std::string& file() const { return template_.file(); }

 private:
  jinja::Template template_;
  jinja::Dict special_tokens_;
};

}  // namespace loom::train

#endif  // LOOM_TRAIN_DATA_CHAT_TEMPLATE_H_
