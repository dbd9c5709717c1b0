#ifndef LOOM_TRAIN_DATA_GPT2_BPE_TOKENIZER_H_
#define LOOM_TRAIN_DATA_GPT2_BPE_TOKENIZER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "train/data/byte_level_bpe.h"
#include "train/data/tokenizer.h"

namespace loom::train {

// GPT-2's byte-level BPE, from a user-provided vocab.json + merges.txt
// (OpenAI's or any file in the same format). Same algorithm as OpenAI's
// encoder.py: regex pre-tokenization, bytes mapped to printable unicode,
// merges applied lowest rank first. The format has no special tokens:
// "<|endoftext|>" in text is tokenized as text (its vocabulary id is the
// end-of-document id). Decoding replaces invalid UTF-8 with U+FFFD, as
// encoder.py (errors="replace") and Hugging Face do.
class Gpt2BpeTokenizer : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<Gpt2BpeTokenizer>> Load(const std::string& vocab_file,
                                                                const std::string& merge_file);
  ~Gpt2BpeTokenizer() override;

  std::vector<int32_t> Encode(const std::string& text) const override;
  std::string Decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return model_.size(); }
  int32_t eod_id() const override { return eod_id_; }

  // The pre-tokenizer's pieces (exposed for tests).
  std::vector<std::string> PreTokenize(const std::string& text) const;

 private:
  Gpt2BpeTokenizer() = default;

  std::unique_ptr<bpe::SplitRegex> split_;
  bpe::BpeModel model_;
  int32_t eod_id_ = -1;
};

}  // namespace loom::train

#endif  // LOOM_TRAIN_DATA_GPT2_BPE_TOKENIZER_H_
