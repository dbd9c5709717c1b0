#ifndef LOOM_TRAIN_DATA_TOKENIZER_H_
#define LOOM_TRAIN_DATA_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::train {

// Text <-> token ids. Implementations: ByteTokenizer, Gpt2BpeTokenizer.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> Encode(const std::string& text) const = 0;
  virtual std::string Decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  // End-of-document id, appended between documents with --append-eod.
  virtual int32_t eod_id() const = 0;
};

// --tokenizer-type values (Megatron's names): "ByteLevelTokenizer" (alias
// "byte") and "GPT2BPETokenizer" (needs --vocab-file and --merge-file).
absl::StatusOr<std::unique_ptr<Tokenizer>> MakeTokenizer(const std::string& type,
                                                         const std::string& vocab_file,
                                                         const std::string& merge_file);

}  // namespace loom::train

#endif  // LOOM_TRAIN_DATA_TOKENIZER_H_
