#ifndef LOOM_TRAIN_DATA_SENTENCEPIECE_TOKENIZER_H_
#define LOOM_TRAIN_DATA_SENTENCEPIECE_TOKENIZER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "train/data/tokenizer.h"

struct LoomSpm;

namespace loom::train {

struct SentencePieceLibrary;

// A SentencePiece model (Llama 2's tokenizer.model and the like), run by
// Debian's libsentencepiece (apt-get install libsentencepiece-dev). As
// Megatron's SentencePieceTokenizer: Encode is the model's EncodeAsIds (no
// bos/eos added), Decode its DecodeIds; eod_id() is the model's eos id and
// bos_id() its bos id (-1 when the model has none).
//
// libsentencepiece is loaded through libloom_sentencepiece.so with dlopen,
// never linked (see sentencepiece_shim.h: its bundled protobuf would clash
// with the system's). The library is found in the binary's runfiles, or at
// $LOOM_SENTENCEPIECE_SHIM.
class SentencePieceTokenizer : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> Load(const std::string& model_file);
  ~SentencePieceTokenizer() override;

  std::vector<int32_t> Encode(const std::string& text) const override;
  std::string Decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eod_id() const override { return eos_id_; }
  int32_t bos_id() const override { return bos_id_; }

 private:
  SentencePieceTokenizer() = default;

  const SentencePieceLibrary* lib_ = nullptr;
  LoomSpm* model_ = nullptr;
  int64_t vocab_size_ = 0;
  int32_t bos_id_ = -1, eos_id_ = -1;
};

}  // namespace loom::train

#endif  // LOOM_TRAIN_DATA_SENTENCEPIECE_TOKENIZER_H_
