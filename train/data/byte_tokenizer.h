#ifndef LOOM_TRAIN_DATA_BYTE_TOKENIZER_H_
#define LOOM_TRAIN_DATA_BYTE_TOKENIZER_H_

#include "train/data/tokenizer.h"

namespace loom::train {

// One id per byte (256 ids): needs no files, handles any text. The NUL byte
// (id 0), which never occurs in text, doubles as the end-of-document id.
class ByteTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> Encode(const std::string& text) const override;
  std::string Decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return 256; }
  int32_t eod_id() const override { return 0; }
};

}  // namespace loom::train

#endif  // LOOM_TRAIN_DATA_BYTE_TOKENIZER_H_
