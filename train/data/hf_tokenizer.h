#ifndef LOOM_TRAIN_DATA_HF_TOKENIZER_H_
#define LOOM_TRAIN_DATA_HF_TOKENIZER_H_

#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "train/data/byte_level_bpe.h"
#include "train/data/tokenizer.h"

namespace loom::train {

// A Hugging Face `tokenizers` tokenizer.json holding byte-level BPE, as GPT-2,
// Llama 3 and most recent models use. Encodes as `Tokenizer.encode(text).ids`
// does (special tokens added by the post-processor included) and decodes as
// `decode(ids)` (special tokens kept). Read from the file:
//  - added_tokens, matched in the text first (leftmost-longest; the ones with
//    normalized=false before those with normalized=true), never split;
//  - pre_tokenizer: ByteLevel (its add_prefix_space and GPT-2 regex), Split
//    (a regex or string, behavior Isolated), a Sequence of those ending in
//    ByteLevel (Llama 3: Split with its regex, then ByteLevel without one);
//  - model: BPE (vocab, merges as "a b" or ["a", "b"], ignore_merges) over
//    all 256 byte symbols;
//  - post_processor: ByteLevel, TemplateProcessing (its "single" template),
//    a Sequence of those, or null; decoder: ByteLevel;
//  - tokenizer_config.json beside it, when there, names eos_token/bos_token.
// Anything else (a WordPiece/Unigram/WordLevel model, a normalizer, other
// pre-tokenizers, BPE dropout, ...) is rejected with an error that names the
// file and the JSON field, rather than tokenized differently.
class HuggingFaceTokenizer : public Tokenizer {
 public:
  // `path`: a folder holding tokenizer.json, or the tokenizer.json file.
  static absl::StatusOr<std::unique_ptr<HuggingFaceTokenizer>> Load(const std::string& path);
  ~HuggingFaceTokenizer() override;

  std::vector<int32_t> Encode(const std::string& text) const override;
  // Encodes as transformers' apply_chat_template does (add_special_tokens=
  // False: no post-processor template) and gives each token's byte range
  // [begin, end) in `text` (Hugging Face's offsets, in bytes). A prefix space
  // the pre-tokenizer adds belongs to no byte of `text`.
  std::vector<int32_t> EncodeWithOffsets(const std::string& text,
                                         std::vector<std::pair<size_t, size_t>>* offsets) const;
  std::string Decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  // eos_token of tokenizer_config.json, else the first of <|endoftext|>,
  // <|end_of_text|>, </s>, <eos> that exists; -1 when none does.
  int32_t eod_id() const override { return eod_id_; }
  // bos_token of tokenizer_config.json, else <|begin_of_text|>, <s>, <bos>.
  int32_t bos_id() const override { return bos_id_; }

  // The pre-tokenizer's pieces of text without added tokens, before the
  // byte mapping (exposed for tests).
  std::vector<std::string> PreTokenize(const std::string& text) const;

 private:
  struct AddedToken {
    std::string content;
    int32_t id;
  };
  enum class Step { kSplit, kPrefixSpace, kByteLevel };
  struct PreTokenizerStep {
    Step kind;
    std::unique_ptr<bpe::SplitRegex> split;
  };
  // Added tokens grouped by first byte, longest first (one pass's matcher).
  using AddedIndex = std::array<std::vector<const AddedToken*>, 256>;
  class Parser;

  HuggingFaceTokenizer() = default;
  // Calls emit(text, nullptr) for each stretch of text and emit("", token)
  // for each added token of `index` found, leftmost-longest.
  template <typename Emit>
  static void SplitOnAdded(absl::string_view text, const AddedIndex& index, Emit emit);
  // `prefixed` (when given): whether a prefix space was added to each piece.
  std::vector<std::string> Pieces(absl::string_view segment,
                                  std::vector<bool>* prefixed = nullptr) const;
  // Appends the segment's ids; with `offsets`, their byte ranges, counted
  // from `at` (the segment's position in the encoded text).
  void EncodeSegment(absl::string_view segment, std::vector<int32_t>* ids,
                     std::vector<std::pair<size_t, size_t>>* offsets = nullptr,
                     size_t at = 0) const;
  // Added tokens and BPE over the text, without the post-processor template.
  std::vector<int32_t> EncodeText(const std::string& text,
                                  std::vector<std::pair<size_t, size_t>>* offsets) const;

  std::string file_;
  bpe::BpeModel model_;
  std::vector<std::unique_ptr<AddedToken>> added_;
  AddedIndex raw_added_, normalized_added_;
  absl::flat_hash_map<int32_t, std::string> added_by_id_;
  std::vector<PreTokenizerStep> steps_;
  // TemplateProcessing's single template: ids, with `sequence_at` where the
  // encoded text goes (-1: no template).
  std::vector<int32_t> template_ids_;
  int sequence_at_ = -1;
  int64_t vocab_size_ = 0;
  int32_t eod_id_ = -1;
  int32_t bos_id_ = -1;
};

}  // namespace loom::train

#endif  // LOOM_TRAIN_DATA_HF_TOKENIZER_H_
