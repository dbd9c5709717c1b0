#include "train/data/tokenizer.h"

#include "absl/strings/str_cat.h"
#include "train/data/byte_tokenizer.h"
#include "train/data/gpt2_bpe_tokenizer.h"
#include "train/data/hf_tokenizer.h"
#include "train/data/sentencepiece_tokenizer.h"

namespace loom::train {
namespace {

template <typename T>
absl::StatusOr<std::unique_ptr<Tokenizer>> Upcast(absl::StatusOr<std::unique_ptr<T>> t) {
  if (!t.ok()) return t.status();
  return std::unique_ptr<Tokenizer>(std::move(*t));
}

absl::Status NeedsModel(TokenizerType type, const char* what) {
  return absl::InvalidArgumentError(absl::StrCat("--tokenizer-type=", core::EnumName(type),
                                                 " needs --tokenizer-model: ", what));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> MakeTokenizer(TokenizerType type,
                                                         const TokenizerFiles& files) {
  switch (type) {
    case TokenizerType::kByteLevel:
      return std::unique_ptr<Tokenizer>(new ByteTokenizer());
    case TokenizerType::kGpt2Bpe:
      if (files.vocab_file.empty() || files.merge_file.empty()) {
        return absl::InvalidArgumentError(
            "--tokenizer-type=GPT2BPETokenizer needs --vocab-file (vocab.json) and --merge-file "
            "(merges.txt)");
      }
      return Upcast(Gpt2BpeTokenizer::Load(files.vocab_file, files.merge_file));
    case TokenizerType::kHuggingFace:
      if (files.tokenizer_model.empty()) {
        return NeedsModel(type, "a folder holding tokenizer.json (or the tokenizer.json file)");
      }
      return Upcast(HuggingFaceTokenizer::Load(files.tokenizer_model));
    case TokenizerType::kSentencePiece:
      if (files.tokenizer_model.empty()) {
        return NeedsModel(type, "a SentencePiece model file (tokenizer.model)");
      }
      return Upcast(SentencePieceTokenizer::Load(files.tokenizer_model));
  }
  return absl::InvalidArgumentError(absl::StrCat("--tokenizer-type: value ",
                                                 static_cast<int>(type), " is not a tokenizer"));
}

}  // namespace loom::train
