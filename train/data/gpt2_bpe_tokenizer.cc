#include "train/data/gpt2_bpe_tokenizer.h"

#include <climits>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "re2/re2.h"

namespace loom::train {
namespace {

// GPT-2's pre-tokenizer, without its (?!\S) lookahead (RE2 has none): the
// lookahead is applied by hand in PreTokenize. Whitespace is spelled out to
// match Python's Unicode \s rather than RE2's ASCII one.
constexpr char kWs[] = "\\t\\n\\x0B\\f\\r\\p{Z}";

std::string Pattern() {
  return absl::StrCat("('s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^", kWs,
                      "\\p{L}\\p{N}]+|[", kWs, "]+)");
}

std::string Utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    s.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

// Splits UTF-8 text into characters (a byte that is not valid UTF-8 is one char).
std::vector<std::string> Utf8Chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = 1;
    unsigned char c = s[i];
    if (c >= 0xF0) {
      n = 4;
    } else if (c >= 0xE0) {
      n = 3;
    } else if (c >= 0xC0) {
      n = 2;
    }
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

std::string FirstChar(re2::StringPiece s) {
  return Utf8Chars(std::string(s.substr(0, 4))).front();
}

bool IsWhitespacePiece(const re2::RE2& ws, const std::string& piece) {
  return re2::RE2::FullMatch(piece, ws);
}

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open ", flag, "=", path));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

Gpt2BpeTokenizer::Gpt2BpeTokenizer() : pattern_(new re2::RE2(Pattern())) {
  // OpenAI's bytes_to_unicode: printable bytes map to themselves, the rest
  // to code points from 256 up, so every byte has a visible character.
  int next = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    uint32_t cp = printable ? b : 256 + next++;
    byte_to_unicode_[b] = Utf8(cp);
    unicode_to_byte_[byte_to_unicode_[b]] = static_cast<uint8_t>(b);
  }
}

Gpt2BpeTokenizer::~Gpt2BpeTokenizer() = default;

absl::StatusOr<std::unique_ptr<Gpt2BpeTokenizer>> Gpt2BpeTokenizer::Load(
    const std::string& vocab_file, const std::string& merge_file) {
  std::unique_ptr<Gpt2BpeTokenizer> t(new Gpt2BpeTokenizer());
  if (!t->pattern_->ok()) return absl::InternalError("GPT-2 pre-tokenizer regex failed to compile");

  absl::StatusOr<std::string> vocab_text = ReadFile(vocab_file, "--vocab-file");
  if (!vocab_text.ok()) return vocab_text.status();
  nlohmann::json vocab = nlohmann::json::parse(*vocab_text, nullptr, /*allow_exceptions=*/false);
  if (!vocab.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--vocab-file=", vocab_file, " is not a JSON object of token -> id (GPT-2 vocab.json)"));
  }
  int64_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat("--vocab-file=", vocab_file, ": token \"",
                                                     it.key(), "\" has no valid integer id"));
    }
    max_id = std::max<int64_t>(max_id, it.value().get<int64_t>());
  }
  t->id_to_token_.assign(max_id + 1, "");
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    int32_t id = static_cast<int32_t>(it.value().get<int64_t>());
    t->token_to_id_[it.key()] = id;
    t->id_to_token_[id] = it.key();
  }
  for (int b = 0; b < 256; ++b) {
    if (!t->token_to_id_.count(t->byte_to_unicode_[b])) {
      return absl::InvalidArgumentError(
          absl::StrCat("--vocab-file=", vocab_file, " lacks the symbol for byte ", b,
                       ": a GPT-2 vocabulary has all 256 byte symbols"));
    }
  }
  auto eod = t->token_to_id_.find("<|endoftext|>");
  t->eod_id_ = eod != t->token_to_id_.end() ? eod->second : -1;

  absl::StatusOr<std::string> merges = ReadFile(merge_file, "--merge-file");
  if (!merges.ok()) return merges.status();
  std::istringstream lines(*merges);
  std::string line;
  int rank = 0, line_no = 0;
  while (std::getline(lines, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("--merge-file=", merge_file, " line ",
                                                     line_no, ": expected two symbols, got \"",
                                                     line, "\""));
    }
    std::string a = line.substr(0, space), b = line.substr(space + 1);
    if (!t->token_to_id_.count(a + b)) {
      return absl::InvalidArgumentError(absl::StrCat("--merge-file=", merge_file, " line ",
                                                     line_no, ": merge result \"", a + b,
                                                     "\" is not in --vocab-file"));
    }
    t->merge_rank_.emplace(std::make_pair(a, b), rank++);
  }
  return t;
}

std::vector<std::string> Gpt2BpeTokenizer::PreTokenize(const std::string& text) const {
  static const re2::RE2 ws(absl::StrCat("[", kWs, "]+"));
  std::vector<std::string> pieces;
  re2::StringPiece input(text);
  std::string piece;
  while (!input.empty()) {
    if (!re2::RE2::Consume(&input, *pattern_, &piece)) {
      // Unreachable for valid UTF-8 (the last alternatives cover everything);
      // take one byte so malformed input still makes progress.
      piece = std::string(input.substr(0, 1));
      input.remove_prefix(1);
    } else if (!input.empty() && IsWhitespacePiece(ws, piece) &&
               !IsWhitespacePiece(ws, FirstChar(input))) {
      // \s+(?!\S): a whitespace run followed by text gives its last
      // character back, to become the " ?" prefix of the next piece.
      std::vector<std::string> chars = Utf8Chars(piece);
      if (chars.size() > 1) {
        size_t keep = piece.size() - chars.back().size();
        input = re2::StringPiece(input.data() - chars.back().size(),
                                 input.size() + chars.back().size());
        piece.resize(keep);
      }
    }
    pieces.push_back(piece);
  }
  return pieces;
}

std::vector<int32_t> Gpt2BpeTokenizer::EncodeWord(const std::string& word) const {
  std::vector<std::string> symbols = Utf8Chars(word);
  while (symbols.size() > 1) {
    int best_rank = INT32_MAX;
    size_t best = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto it = merge_rank_.find(std::make_pair(symbols[i], symbols[i + 1]));
      if (it != merge_rank_.end() && it->second < best_rank) {
        best_rank = it->second;
        best = i;
      }
    }
    if (best_rank == INT32_MAX) break;
    // Merge every occurrence of the best pair, left to right (encoder.py).
    const std::string a = symbols[best], b = symbols[best + 1];
    std::vector<std::string> merged;
    for (size_t i = 0; i < symbols.size();) {
      if (i + 1 < symbols.size() && symbols[i] == a && symbols[i + 1] == b) {
        merged.push_back(a + b);
        i += 2;
      } else {
        merged.push_back(symbols[i++]);
      }
    }
    symbols.swap(merged);
  }
  std::vector<int32_t> ids;
  ids.reserve(symbols.size());
  for (const std::string& s : symbols) ids.push_back(token_to_id_.at(s));  // checked at Load
  return ids;
}

std::vector<int32_t> Gpt2BpeTokenizer::Encode(const std::string& text) const {
  std::vector<int32_t> ids;
  for (const std::string& piece : PreTokenize(text)) {
    {
      absl::MutexLock lock(&cache_mu_);
      auto it = cache_.find(piece);
      if (it != cache_.end()) {
        ids.insert(ids.end(), it->second.begin(), it->second.end());
        continue;
      }
    }
    std::string mapped;
    for (unsigned char c : piece) mapped += byte_to_unicode_[c];
    std::vector<int32_t> word = EncodeWord(mapped);
    ids.insert(ids.end(), word.begin(), word.end());
    absl::MutexLock lock(&cache_mu_);
    if (cache_.size() < (1u << 20)) cache_.emplace(piece, std::move(word));
  }
  return ids;
}

std::string Gpt2BpeTokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (int32_t id : ids) {
    if (id < 0 || id >= static_cast<int32_t>(id_to_token_.size())) continue;
    for (const std::string& ch : Utf8Chars(id_to_token_[id])) {
      auto it = unicode_to_byte_.find(ch);
      if (it != unicode_to_byte_.end()) {
        text.push_back(static_cast<char>(it->second));
      } else {
        text += ch;  // special tokens such as <|endoftext|> are plain text
      }
    }
  }
  return text;
}

}  // namespace loom::train
