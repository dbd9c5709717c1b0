#ifndef LOOM_TRAIN_DATA_TOKENIZER_H_
#define LOOM_TRAIN_DATA_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "train/data/tokenizer_type.h"

namespace loom::train {

// Text <-> token ids. Implementations: ByteTokenizer, Gpt2BpeTokenizer,
// HuggingFaceTokenizer, SentencePieceTokenizer. Encode and Decode may be
// called from several threads at once.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> Encode(const std::string& text) const = 0;
  virtual std::string Decode(const std::vector<int32_t>& ids) const = 0;
  // 1 + the largest id Encode can return.
  virtual int64_t vocab_size() const = 0;
  // End-of-document id, appended between documents with --append-eod; -1: none.
  virtual int32_t eod_id() const = 0;
  // Beginning-of-sequence id, -1 when the tokenizer has none.
  virtual int32_t bos_id() const { return -1; }
};

// The files a tokenizer is read from (flags of the same names).
struct TokenizerFiles {
  std::string vocab_file;       // --vocab-file: GPT2BPETokenizer's vocab.json
  std::string merge_file;       // --merge-file: GPT2BPETokenizer's merges.txt
  std::string tokenizer_model;  // --tokenizer-model: HuggingFaceTokenizer (a folder holding
                                // tokenizer.json, or the file), SentencePieceTokenizer (.model)
};

// The one place that maps --tokenizer-type (tokenizer_type.h) to a tokenizer
// and checks that the files it needs were given. Errors name the flags as
// typed and what was expected.
absl::StatusOr<std::unique_ptr<Tokenizer>> MakeTokenizer(TokenizerType type,
                                                         const TokenizerFiles& files);

}  // namespace loom::train

#endif  // LOOM_TRAIN_DATA_TOKENIZER_H_
