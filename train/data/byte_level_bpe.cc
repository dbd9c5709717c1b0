#include "train/data/byte_level_bpe.h"

#include <array>
#include <climits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "re2/re2.h"

namespace loom::train::bpe {
namespace {

// Unicode White_Space, which is what \s means in Oniguruma and Python's
// `regex` (RE2's \s is [\t\n\f\r ]).
constexpr char kWs[] = "\\t\\n\\x0B\\f\\r\\x{85}\\p{Z}";
constexpr absl::string_view kLookahead = "\\s+(?!\\S)";
constexpr absl::string_view kLookaheadNext = "|\\s+";
constexpr char kLookaheadGroup[] = "loom_ws_lookahead";

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

struct ByteAlphabet {
  std::array<std::string, 256> symbol;
  absl::flat_hash_map<std::string, int> byte;
  ByteAlphabet() {
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      symbol[b] = Utf8(printable ? b : 256 + next++);
      byte[symbol[b]] = b;
    }
  }
};

const ByteAlphabet& Alphabet() {
  static const ByteAlphabet* a = new ByteAlphabet();
  return *a;
}

absl::Status Unsupported(const std::string& pattern, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("regex /", pattern, "/: ", what, " is not supported (RE2 would match "
                   "differently from Oniguruma)"));
}

// Oniguruma / Python `regex` syntax -> RE2 syntax with the same matches (see
// the header). Sets *lookahead when the \s+(?!\S) alternative was rewritten.
absl::StatusOr<std::string> Translate(const std::string& p, bool* lookahead) {
  const std::string ws = kWs;
  std::string out;
  bool in_class = false;
  int depth = 0;
  *lookahead = false;
  size_t i = 0;
  while (i < p.size()) {
    absl::string_view rest = absl::string_view(p).substr(i);
    const char c = p[i];
    if (!in_class && absl::StartsWith(rest, kLookahead)) {
      absl::string_view after = rest.substr(kLookahead.size());
      bool alone = depth == 0 && (i == 0 || p[i - 1] == '|') &&
                   absl::StartsWith(after, kLookaheadNext) &&
                   (after.size() == kLookaheadNext.size() || after[kLookaheadNext.size()] == '|');
      if (!alone || *lookahead) {
        return Unsupported(p, "a lookahead other than the top-level alternatives \\s+(?!\\S)|\\s+");
      }
      absl::StrAppend(&out, "(?P<", kLookaheadGroup, ">[", ws, "]+)");
      *lookahead = true;
      i += kLookahead.size();
      continue;
    }
    if (c == '\\') {
      if (i + 1 >= p.size()) return Unsupported(p, "a trailing backslash");
      const char e = p[i + 1];
      switch (e) {
        case 's':
          absl::StrAppend(&out, in_class ? ws : absl::StrCat("[", ws, "]"));
          break;
        case 'S':
          if (in_class) return Unsupported(p, "\\S inside [...]");
          absl::StrAppend(&out, "[^", ws, "]");
          break;
        case 'd':
          out += "\\p{Nd}";
          break;
        case 'D':
          out += "\\P{Nd}";
          break;
        case 'u': {  // \uHHHH
          if (i + 6 > p.size()) return Unsupported(p, "a short \\u escape");
          absl::StrAppend(&out, "\\x{", p.substr(i + 2, 4), "}");
          i += 6;
          continue;
        }
        case 'p':
        case 'P': {  // \p{...} as is (RE2 knows the same categories and scripts)
          size_t end = i + 2;
          if (end < p.size() && p[end] == '{') {
            end = p.find('}', end);
            if (end == std::string::npos) return Unsupported(p, "an unterminated \\p{");
            if (p[i + 3] == '^') return Unsupported(p, "\\p{^...}");
            ++end;
          } else {
            end = std::min(end + 1, p.size());
          }
          out += p.substr(i, end - i);
          i = end;
          continue;
        }
        case 'w': case 'W': case 'b': case 'B': case 'h': case 'H': case 'R': case 'X':
        case 'K': case 'G': case 'k': case 'g': case 'y': case 'Y': case 'O': case 'N':
        case 'A': case 'z': case 'Z': case '1': case '2': case '3': case '4': case '5':
        case '6': case '7': case '8': case '9':
          return Unsupported(p, absl::StrCat("\\", std::string(1, e)));
        default:  // \t \n \r \f \v \x.. and escaped punctuation mean the same in RE2
          out += p.substr(i, 2);
      }
      i += 2;
      continue;
    }
    if (in_class) {
      if (c == '[') return Unsupported(p, "a nested [...] or [:class:]");
      if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') return Unsupported(p, "&& in [...]");
      if (c == ']') in_class = false;
      out += c;
      ++i;
      continue;
    }
    switch (c) {
      case '[':
        in_class = true;
        out += c;
        ++i;
        if (i < p.size() && p[i] == '^') out += p[i++];
        if (i < p.size() && p[i] == ']') out += p[i++];  // a leading ] is literal
        continue;
      case '(':
        if (i + 1 < p.size() && p[i + 1] == '?') {
          const char k = i + 2 < p.size() ? p[i + 2] : '\0';
          const char k2 = i + 3 < p.size() ? p[i + 3] : '\0';
          if (k == '=' || k == '!' || (k == '<' && (k2 == '=' || k2 == '!'))) {
            return Unsupported(p, "lookaround (?= (?! (?<= (?<!");
          }
          if (k == '<') {  // (?<name>...) is (?P<name>...) in RE2
            out += "(?P<";
            i += 3;
            ++depth;
            continue;
          }
          if (k == 'P') {  // Python's (?P<name>...), RE2's too
            ++depth;
            break;
          }
          if (k != ':' && k != 'i' && k != '-') {
            return Unsupported(p, absl::StrCat("the group (?", std::string(1, k)));
          }
          size_t j = i + 2;
          while (j < p.size() && (p[j] == 'i' || p[j] == '-')) ++j;
          if (j >= p.size() || (p[j] != ':' && p[j] != ')')) {
            return Unsupported(p, "inline flags other than (?i)");
          }
        }
        ++depth;
        break;
      case ')':
        --depth;
        break;
      case '^':
      case '$':
        return Unsupported(p, "the anchors ^ and $");
      default:
        break;
    }
    out += c;
    ++i;
  }
  if (in_class) return Unsupported(p, "an unterminated [");
  return out;
}

}  // namespace

SplitRegex::~SplitRegex() = default;

absl::StatusOr<std::unique_ptr<SplitRegex>> SplitRegex::Compile(const std::string& pattern) {
  bool lookahead = false;
  absl::StatusOr<std::string> translated = Translate(pattern, &lookahead);
  if (!translated.ok()) return translated.status();
  RE2::Options options;
  options.set_log_errors(false);
  options.set_max_mem(64 << 20);
  std::unique_ptr<SplitRegex> r(new SplitRegex());
  r->re_ = std::make_unique<re2::RE2>(*translated, options);
  if (!r->re_->ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("regex /", pattern, "/ does not compile with RE2: ", r->re_->error()));
  }
  if (re2::RE2::FullMatch("", *r->re_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("regex /", pattern, "/ matches the empty string; not supported"));
  }
  r->groups_ = r->re_->NumberOfCapturingGroups();
  if (lookahead) r->lookahead_group_ = r->re_->NamedCapturingGroups().at(kLookaheadGroup);
  return r;
}

std::vector<absl::string_view> SplitRegex::Split(absl::string_view text) const {
  std::vector<absl::string_view> pieces;
  std::vector<re2::StringPiece> sub(groups_ + 1);
  const re2::StringPiece input(text.data(), text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    if (!re_->Match(input, pos, text.size(), RE2::UNANCHORED, sub.data(), groups_ + 1)) {
      pieces.push_back(text.substr(pos));
      break;
    }
    size_t start = sub[0].data() - text.data();
    size_t end = start + sub[0].size();
    if (end == start) {  // cannot happen (empty matches are rejected): stay safe
      end = start + 1;
    } else if (lookahead_group_ > 0 && sub[lookahead_group_].data() != nullptr &&
               end < text.size()) {
      // \s+(?!\S) followed by text: the run gives its last character back
      // (a run of one character is what the \s+ alternative matches anyway).
      size_t last = end - 1;
      while (last > start && (static_cast<unsigned char>(text[last]) & 0xC0) == 0x80) --last;
      if (last > start) end = last;
    }
    if (start > pos) pieces.push_back(text.substr(pos, start - pos));
    pieces.push_back(text.substr(start, end - start));
    pos = end;
  }
  return pieces;
}

const std::string& ByteSymbol(uint8_t b) { return Alphabet().symbol[b]; }

int SymbolByte(absl::string_view symbol) {
  const auto& m = Alphabet().byte;
  auto it = m.find(symbol);
  return it == m.end() ? -1 : it->second;
}

std::string ToByteSymbols(absl::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) out += Alphabet().symbol[c];
  return out;
}

std::string DecodeByteLevel(const std::vector<absl::string_view>& tokens) {
  std::string bytes;
  for (absl::string_view token : tokens) {
    const size_t start = bytes.size();
    for (absl::string_view ch : Utf8Chars(token)) {
      int b = SymbolByte(ch);
      if (b < 0) {  // not a byte-level token: keep it whole
        bytes.resize(start);
        bytes.append(token.data(), token.size());
        break;
      }
      bytes.push_back(static_cast<char>(b));
    }
  }
  return Utf8Lossy(bytes);
}

std::vector<absl::string_view> Utf8Chars(absl::string_view s) {
  std::vector<absl::string_view> out;
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

std::string Utf8Lossy(absl::string_view s) {
  static const char kReplacement[] = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // bounds of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    }
    if (len == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    size_t j = 1;
    for (; j < len && i + j < s.size(); ++j) {
      const unsigned char d = s[i + j];
      const unsigned char l = j == 1 ? lo : 0x80, h = j == 1 ? hi : 0xBF;
      if (d < l || d > h) break;
    }
    if (j == len) {
      out.append(s.data() + i, len);
    } else {
      out += kReplacement;  // the maximal invalid subpart is one replacement
    }
    i += j;
  }
  return out;
}

absl::Status BpeModel::AddToken(const std::string& token, int32_t id) {
  if (id < 0) return absl::InvalidArgumentError(absl::StrCat("negative id ", id));
  if (!token_to_id_.emplace(token, id).second) {
    return absl::InvalidArgumentError(absl::StrCat("token \"", token, "\" appears twice"));
  }
  if (static_cast<size_t>(id) >= id_to_token_.size()) {
    id_to_token_.resize(id + 1);
    has_id_.resize(id + 1, false);
  }
  if (has_id_[id]) {
    return absl::InvalidArgumentError(absl::StrCat("id ", id, " is given to both \"",
                                                   id_to_token_[id], "\" and \"", token, "\""));
  }
  id_to_token_[id] = token;
  has_id_[id] = true;
  return absl::OkStatus();
}

absl::Status BpeModel::AddMerge(const std::string& a, const std::string& b) {
  if (Id(a + b) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("merge result \"", a + b, "\" is not in the vocabulary"));
  }
  // A repeated pair keeps its first (best) rank.
  merge_rank_.emplace(std::make_pair(a, b), static_cast<int>(merge_rank_.size()));
  return absl::OkStatus();
}

int BpeModel::MissingByteSymbol() const {
  for (int b = 0; b < 256; ++b) {
    if (!token_to_id_.count(ByteSymbol(static_cast<uint8_t>(b)))) return b;
  }
  return -1;
}

const std::string* BpeModel::Token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

int32_t BpeModel::Id(const std::string& token) const {
  auto it = token_to_id_.find(token);
  return it == token_to_id_.end() ? -1 : it->second;
}

std::vector<int32_t> BpeModel::Merge(const std::string& word) const {
  std::vector<std::string> symbols;
  for (absl::string_view ch : Utf8Chars(word)) symbols.emplace_back(ch);
  while (symbols.size() > 1) {
    int best_rank = INT_MAX;
    size_t best = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto it = merge_rank_.find(std::make_pair(symbols[i], symbols[i + 1]));
      if (it != merge_rank_.end() && it->second < best_rank) {
        best_rank = it->second;
        best = i;
      }
    }
    if (best_rank == INT_MAX) break;
    // Merge every occurrence of the best pair, left to right (encoder.py; the
    // same result as Hugging Face's priority queue for merges learned in order).
    const std::string a = symbols[best], b = symbols[best + 1];
    std::vector<std::string> merged;
    merged.reserve(symbols.size());
    for (size_t i = 0; i < symbols.size();) {
      if (i + 1 < symbols.size() && symbols[i] == a && symbols[i + 1] == b) {
        merged.push_back(a + b);
        i += 2;
      } else {
        merged.push_back(std::move(symbols[i++]));
      }
    }
    symbols.swap(merged);
  }
  std::vector<int32_t> ids;
  ids.reserve(symbols.size());
  for (const std::string& s : symbols) ids.push_back(token_to_id_.at(s));  // checked at load
  return ids;
}

std::vector<int32_t> BpeModel::EncodeWord(const std::string& word) const {
  if (ignore_merges_) {
    auto it = token_to_id_.find(word);
    if (it != token_to_id_.end()) return {it->second};
  }
  CacheShard& shard = cache_[std::hash<std::string>()(word) % kCacheShards];
  {
    absl::MutexLock lock(&shard.mu);
    auto it = shard.words.find(word);
    if (it != shard.words.end()) return it->second;
  }
  std::vector<int32_t> ids = Merge(word);
  absl::MutexLock lock(&shard.mu);
  if (shard.words.size() < (1u << 20) / kCacheShards) shard.words.emplace(word, ids);
  return ids;
}

}  // namespace loom::train::bpe
