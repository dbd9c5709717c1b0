#ifndef LOOM_TRAIN_DATA_PREPROCESS_H_
#define LOOM_TRAIN_DATA_PREPROCESS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "train/data/chat_template.h"
#include "train/data/hf_tokenizer.h"
#include "train/data/tokenizer.h"

namespace loom::train {

struct PreprocessOptions {
  std::vector<std::string> inputs;  // --input: files
  std::string output_prefix;        // --output-prefix: writes <prefix>.bin/.idx
  // --input-format: "jsonl" (one JSON object per line, text under json_key),
  // "text" (documents separated by lines equal to document_separator; the
  // whole file is one document when it is empty), or "auto" (jsonl for
  // .json/.jsonl files, text otherwise).
  std::string input_format = "auto";
  std::string json_key = "text";          // --json-keys
  std::string document_separator = "";    // --document-separator ("%" for fortune files)
  bool append_eod = false;                // --append-eod
  // --workers: threads tokenizing documents (Megatron's flag); the output is
  // the same for any number.
  int workers = 1;
};

struct PreprocessStats {
  int64_t documents = 0;
  int64_t tokens = 0;
  int64_t bytes_read = 0;
  int64_t loss_tokens = 0;  // SFT: tokens whose loss mask is 1
};

// Progress callback: (bytes read so far, total bytes).
using ProgressFn = std::function<void(int64_t, int64_t)>;

// Tokenizes the inputs into a Megatron indexed dataset, one sequence per
// document. Errors name the file and line.
absl::StatusOr<PreprocessStats> Preprocess(const PreprocessOptions& options,
                                           const Tokenizer& tokenizer,
                                           const ProgressFn& progress = nullptr);

// Supervised fine-tuning (--sft): each JSON line {"messages": [{"role": ...,
// "content": ...}, ...]} (with "tools", when there, passed to the template
// as apply_chat_template's tools=) is one conversation, rendered with the model's chat
// template and tokenized as transformers' apply_chat_template(...,
// return_assistant_tokens_mask=True) does, into one document of
// <prefix>.bin/.idx plus its loss mask in <prefix>_loss_mask.bin/.idx (1 on
// the assistant's tokens; loss_mask.h). --append-eod adds the end-of-document
// token with mask 0. Errors name the file and line: bad JSON, no "messages"
// array, a message without a string "role", a conversation without an
// assistant turn, and template errors (an undefined variable, the template's
// own raise_exception), which also name the template's file and line.
// Nothing is left half-written.
absl::StatusOr<PreprocessStats> PreprocessSft(const PreprocessOptions& options,
                                              const HuggingFaceTokenizer& tokenizer,
                                              const ChatTemplate& chat_template,
                                              const ProgressFn& progress = nullptr);

}  // namespace loom::train

#endif  // LOOM_TRAIN_DATA_PREPROCESS_H_
