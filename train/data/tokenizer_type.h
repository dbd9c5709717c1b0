#ifndef LOOM_TRAIN_DATA_TOKENIZER_TYPE_H_
#define LOOM_TRAIN_DATA_TOKENIZER_TYPE_H_

// --tokenizer-type (Megatron's names), parsed at the flag boundary; the
// tokenizers themselves are //train/data:tokenizer (MakeTokenizer).

#include "core/enum_names.h"

namespace loom::train {

enum class TokenizerType {
  kByteLevel,      // 256 byte ids, no files
  kGpt2Bpe,        // --vocab-file and --merge-file
  kHuggingFace,    // --tokenizer-model: tokenizer.json (byte-level BPE) or its folder
  kSentencePiece,  // --tokenizer-model: a SentencePiece .model
};
LOOM_ENUM_NAMES(TokenizerType, {TokenizerType::kByteLevel, "ByteLevelTokenizer"},
                {TokenizerType::kGpt2Bpe, "GPT2BPETokenizer"},
                {TokenizerType::kHuggingFace, "HuggingFaceTokenizer"},
                {TokenizerType::kSentencePiece, "SentencePieceTokenizer"},
                {TokenizerType::kByteLevel, "byte", /*alias=*/true})

}  // namespace loom::train

#endif  // LOOM_TRAIN_DATA_TOKENIZER_TYPE_H_
