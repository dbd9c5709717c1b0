#ifndef LOOM_TRAIN_DATA_GPT2_BPE_TOKENIZER_H_
#define LOOM_TRAIN_DATA_GPT2_BPE_TOKENIZER_H_

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "train/data/tokenizer.h"

namespace re2 {
class RE2;
}

namespace loom::train {

// GPT-2's byte-level BPE, from a user-provided vocab.json + merges.txt
// (OpenAI's or any file in the same format). Same algorithm as OpenAI's
// encoder.py: regex pre-tokenization, bytes mapped to printable unicode,
// merges applied lowest rank first.
class Gpt2BpeTokenizer : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<Gpt2BpeTokenizer>> Load(const std::string& vocab_file,
                                                                const std::string& merge_file);
  ~Gpt2BpeTokenizer() override;

  std::vector<int32_t> Encode(const std::string& text) const override;
  std::string Decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_token_.size()); }
  int32_t eod_id() const override { return eod_id_; }

  // The pre-tokenizer's pieces (exposed for tests).
  std::vector<std::string> PreTokenize(const std::string& text) const;

 private:
  Gpt2BpeTokenizer();
  // BPE over one pre-token already mapped to the byte alphabet.
  std::vector<int32_t> EncodeWord(const std::string& word) const;

  std::unique_ptr<re2::RE2> pattern_;
  std::unordered_map<std::string, int32_t> token_to_id_;
  std::vector<std::string> id_to_token_;
  absl::flat_hash_map<std::pair<std::string, std::string>, int> merge_rank_;
  std::string byte_to_unicode_[256];
  std::unordered_map<std::string, uint8_t> unicode_to_byte_;
  int32_t eod_id_ = -1;
  mutable absl::Mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_ ABSL_GUARDED_BY(cache_mu_);
};

}  // namespace loom::train

#endif  // LOOM_TRAIN_DATA_GPT2_BPE_TOKENIZER_H_
