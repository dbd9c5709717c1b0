#include "train/data/tokenizer.h"

#include "absl/strings/str_cat.h"
#include "train/data/byte_tokenizer.h"
#include "train/data/gpt2_bpe_tokenizer.h"

namespace loom::train {

absl::StatusOr<std::unique_ptr<Tokenizer>> MakeTokenizer(const std::string& type,
                                                         const std::string& vocab_file,
                                                         const std::string& merge_file) {
  if (type == "ByteLevelTokenizer" || type == "byte") {
    return std::unique_ptr<Tokenizer>(new ByteTokenizer());
  }
  if (type == "GPT2BPETokenizer") {
    if (vocab_file.empty() || merge_file.empty()) {
      return absl::InvalidArgumentError(
          "--tokenizer-type=GPT2BPETokenizer needs --vocab-file (vocab.json) and --merge-file "
          "(merges.txt)");
    }
    absl::StatusOr<std::unique_ptr<Gpt2BpeTokenizer>> t =
        Gpt2BpeTokenizer::Load(vocab_file, merge_file);
    if (!t.ok()) return t.status();
    return std::unique_ptr<Tokenizer>(std::move(*t));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--tokenizer-type=", type, " is unknown: expected ByteLevelTokenizer or GPT2BPETokenizer"));
}

}  // namespace loom::train
