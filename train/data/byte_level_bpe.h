#ifndef LOOM_TRAIN_DATA_BYTE_LEVEL_BPE_H_
#define LOOM_TRAIN_DATA_BYTE_LEVEL_BPE_H_

// The parts of byte-level BPE that GPT-2's two-file format
// (Gpt2BpeTokenizer) and Hugging Face's tokenizer.json (HuggingFaceTokenizer)
// share: the pre-tokenizer regex, the byte <-> printable-character alphabet,
// and the merge loop.

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace re2 {
class RE2;
}

namespace loom::train::bpe {

// GPT-2's pre-tokenizer regex as OpenAI's encoder.py and Hugging Face's
// ByteLevel pre-tokenizer write it.
inline constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// A pre-tokenizer regex written for Oniguruma (Hugging Face) or Python's
// `regex` (OpenAI), run with RE2. Translated so that both agree:
//  - \s is Unicode White_Space ([\t\n\v\f\r\x85\p{Z}]), as there; RE2's is
//    ASCII. \S outside a class, \d (Unicode digits, \p{Nd}) and \D likewise.
//  - RE2 has no lookaround. The one use in practice, the alternatives
//    `\s+(?!\S)|\s+` ending GPT-2's and Llama 3's patterns, is matched as
//    `\s+` and then, when that whitespace run is followed by more text, gives
//    its last character back (so that " word" keeps its space), which is
//    what the lookahead does.
// Anything that would match differently is an error that says what: other
// lookarounds, \w \b \h \R \X, backreferences, ^ $ (line anchors in
// Oniguruma, text anchors in RE2), nested classes, possessive quantifiers (RE2
// rejects them), and patterns that match the empty string.
class SplitRegex {
 public:
  static absl::StatusOr<std::unique_ptr<SplitRegex>> Compile(const std::string& pattern);
  ~SplitRegex();

  // Hugging Face's Split with behavior "Isolated": every match is a piece,
  // and so is the text between two matches.
  std::vector<absl::string_view> Split(absl::string_view text) const;

 private:
  SplitRegex() = default;
  std::unique_ptr<re2::RE2> re_;
  int lookahead_group_ = -1;  // the \s+(?!\S) alternative's capture group, or -1
  int groups_ = 0;
};

// OpenAI's bytes_to_unicode: every byte as a printable character (UTF-8).
const std::string& ByteSymbol(uint8_t b);
// The byte a symbol stands for, or -1 when `symbol` is not one of the 256.
int SymbolByte(absl::string_view symbol);
// Every byte of `bytes` as its symbol.
std::string ToByteSymbols(absl::string_view bytes);

// Hugging Face's ByteLevel decoder: each token whose characters are all byte
// symbols becomes those bytes, any other token (an added token such as
// "hello world") stays as it is; invalid UTF-8 in the result becomes U+FFFD.
std::string DecodeByteLevel(const std::vector<absl::string_view>& tokens);

// UTF-8 text split into characters; an invalid byte is a character of its own.
std::vector<absl::string_view> Utf8Chars(absl::string_view s);
// Invalid UTF-8 sequences replaced by U+FFFD, as Rust's String::from_utf8_lossy
// and Python's decode(errors="replace") do (one per maximal invalid subpart).
std::string Utf8Lossy(absl::string_view s);

// A BPE vocabulary and merge table over byte symbols.
class BpeModel {
 public:
  // Adds a vocabulary entry; an error if the token or the id is taken.
  absl::Status AddToken(const std::string& token, int32_t id);
  // Adds the next merge (rank = number of merges so far); an error when
  // a + b is not a vocabulary token.
  absl::Status AddMerge(const std::string& a, const std::string& b);
  // Llama 3: a pre-token that is a whole vocabulary token is not merged.
  void set_ignore_merges(bool v) { ignore_merges_ = v; }

  // Ids of one pre-token already mapped to byte symbols. Every character must
  // be a vocabulary token (checked once at load: HasAllByteSymbols).
  std::vector<int32_t> EncodeWord(const std::string& word) const;
  // The first byte whose symbol is not a token, or -1 when all are.
  int MissingByteSymbol() const;

  // The token with this id, or nullptr.
  const std::string* Token(int32_t id) const;
  // The id of this token, or -1.
  int32_t Id(const std::string& token) const;
  // 1 + the largest id.
  int64_t size() const { return static_cast<int64_t>(id_to_token_.size()); }

 private:
  std::vector<int32_t> Merge(const std::string& word) const;

  std::unordered_map<std::string, int32_t> token_to_id_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  absl::flat_hash_map<std::pair<std::string, std::string>, int> merge_rank_;
  bool ignore_merges_ = false;
  // Words already merged, in shards with a lock each, so that several threads
  // encoding at once (preprocess_data --workers) rarely wait for one another.
  struct CacheShard {
    absl::Mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>> words ABSL_GUARDED_BY(mu);
  };
  static constexpr size_t kCacheShards = 64;
  mutable std::array<CacheShard, kCacheShards> cache_;
};

}  // namespace loom::train::bpe

#endif  // LOOM_TRAIN_DATA_BYTE_LEVEL_BPE_H_
