#include "train/data/jinja/lexer.h"

#include <cctype>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "train/data/jinja/value.h"

namespace loom::jinja {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

class Lexer {
 public:
  explicit Lexer(const std::string& source) : src_(source) {
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> Run() {
    while (pos_ < src_.size()) {
      size_t tag = FindTag(pos_);
      std::string text = src_.substr(pos_, tag - pos_);
      int text_line = line_;
      Advance(tag);
      if (strip_next_text_) {
        size_t first = 0;
        while (first < text.size() && IsSpace(text[first])) ++first;
        text.erase(0, first);
        strip_next_text_ = false;
      }
      if (tag == src_.size()) {
        Emit(Token::Type::kText, text, text_line);
        break;
      }
      const char kind = src_[tag + 1];  // '{', '%' or '#'
      const char marker = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (marker == '-') {
        while (!text.empty() && IsSpace(text.back())) text.pop_back();
      } else if (kind != '{' && marker != '+') {
        LstripBlock(&text);
      }
      Emit(Token::Type::kText, text, text_line);
      line_starting_ = false;
      size_t body = tag + 2 + (marker == '-' || marker == '+' ? 1 : 0);
      Advance(body);
      if (kind == '#') {
        Comment();
      } else {
        Tag(kind == '{');
      }
    }
    tokens_.push_back({Token::Type::kEnd, "", line_});
    return std::move(tokens_);
  }

 private:
  // Index of the next "{{", "{%" or "{#" at or after `from` (size(): none).
  size_t FindTag(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return src_.size();
  }

  void Advance(size_t to) {
    for (; pos_ < to; ++pos_) {
      if (src_[pos_] == '\n') ++line_;
    }
  }

  // lstrip_blocks: a block or comment tag that starts its line (only spaces
  // and tabs before it) takes those with it. Jinja counts the text as
  // starting a line when it follows a newline, the template's start, or a
  // tag whose trim_blocks newline was eaten.
  void LstripBlock(std::string* text) const {
    size_t nl = text->rfind('\n');
    size_t from = nl == std::string::npos ? 0 : nl + 1;
    if (nl == std::string::npos && !line_starting_) return;
    for (size_t i = from; i < text->size(); ++i) {
      if ((*text)[i] != ' ' && (*text)[i] != '\t') return;
    }
    text->erase(from);
  }

  void Emit(Token::Type type, std::string text, int line) {
    if (type == Token::Type::kText && text.empty()) return;
    tokens_.push_back({type, std::move(text), line});
  }

  // After a closing marker: `-` strips the next text's leading whitespace;
  // otherwise a block or comment tag eats one newline (trim_blocks).
  void Close(size_t end_of_marker, char marker, bool is_variable) {
    Advance(end_of_marker);
    if (marker == '-') {
      strip_next_text_ = true;
    } else if (!is_variable && marker != '+') {
      if (pos_ < src_.size() && src_[pos_] == '\n') {
        Advance(pos_ + 1);
        line_starting_ = true;
      } else if (pos_ + 1 < src_.size() && src_[pos_] == '\r' && src_[pos_ + 1] == '\n') {
        Advance(pos_ + 2);
        line_starting_ = true;
      }
    }
  }

  void Comment() {
    int start_line = line_;
    size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) throw TemplateError("unterminated comment {# ... #}", start_line);
    char marker = end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
    Close(end + 2, marker, false);
  }

  void Tag(bool is_variable) {
    const int start_line = line_;
    Emit(is_variable ? Token::Type::kVarBegin : Token::Type::kBlockBegin, "", line_);
    const char close = is_variable ? '}' : '%';
    bool first = true;
    while (true) {
      while (pos_ < src_.size() && IsSpace(src_[pos_])) Advance(pos_ + 1);
      if (pos_ >= src_.size()) {
        throw TemplateError(is_variable ? "unterminated {{ ... }}" : "unterminated {% ... %}",
                            start_line);
      }
      char c = src_[pos_];
      char next = pos_ + 1 < src_.size() ? src_[pos_ + 1] : '\0';
      char after = pos_ + 2 < src_.size() ? src_[pos_ + 2] : '\0';
      if ((c == '-' || c == '+') && next == close && after == '}') {
        Emit(is_variable ? Token::Type::kVarEnd : Token::Type::kBlockEnd, "", line_);
        Close(pos_ + 3, c, is_variable);
        return;
      }
      if (c == close && next == '}') {
        Emit(is_variable ? Token::Type::kVarEnd : Token::Type::kBlockEnd, "", line_);
        Close(pos_ + 2, 0, is_variable);
        return;
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t end = pos_;
        while (end < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) {
          ++end;
        }
        std::string name = src_.substr(pos_, end - pos_);
        if (first && !is_variable && name == "raw") {
          throw TemplateError("unsupported construct {% raw %}", line_);
        }
        Emit(Token::Type::kName, name, line_);
        Advance(end);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        Number();
      } else if (c == '\'' || c == '"') {
        String(c);
      } else {
        Operator();
      }
      first = false;
    }
  }

  void Number() {
    size_t end = pos_;
    bool is_float = false;
    while (end < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) ++end;
    if (end + 1 < src_.size() && src_[end] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[end + 1]))) {
      is_float = true;
      ++end;
      while (end < src_.size() && std::isdigit(static_cast<unsigned char>(src_[end]))) ++end;
    }
    if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
      size_t e = end + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      if (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) {
        is_float = true;
        end = e;
        while (end < src_.size() && std::isdigit(static_cast<unsigned char>(src_[end]))) ++end;
      }
    }
    std::string text;
    for (size_t i = pos_; i < end; ++i) {
      if (src_[i] != '_') text += src_[i];
    }
    Emit(is_float ? Token::Type::kFloat : Token::Type::kInt, text, line_);
    Advance(end);
  }

  // Python's string escapes (Jinja decodes literals with unicode-escape).
  void String(char quote) {
    const int start_line = line_;
    size_t i = pos_ + 1;
    std::string raw;
    while (true) {
      if (i >= src_.size()) throw TemplateError("unterminated string literal", start_line);
      char c = src_[i];
      if (c == quote) break;
      if (c != '\\') {
        raw += c;
        ++i;
        continue;
      }
      char e = i + 1 < src_.size() ? src_[i + 1] : '\0';
      i += 2;
      auto hex = [&](int digits) {
        if (i + digits > src_.size()) throw TemplateError("truncated \\x/\\u escape", line_);
        std::string h = src_.substr(i, digits);
        i += digits;
        char32_t cp = static_cast<char32_t>(std::strtoul(h.c_str(), nullptr, 16));
        raw += EncodeUtf8(std::u32string(1, cp));
      };
      switch (e) {
        case 'n': raw += '\n'; break;
        case 't': raw += '\t'; break;
        case 'r': raw += '\r'; break;
        case '0': raw += '\0'; break;
        case '\\': raw += '\\'; break;
        case '\'': raw += '\''; break;
        case '"': raw += '"'; break;
        case '\n': break;  // a line continuation
        case 'x': hex(2); break;
        case 'u': hex(4); break;
        case 'U': hex(8); break;
        default:  // Python keeps an unknown escape as written
          raw += '\\';
          raw += e;
      }
    }
    Emit(Token::Type::kString, raw, start_line);
    Advance(i + 1);
  }

  void Operator() {
    static const char* kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : kTwo) {
      if (src_.compare(pos_, 2, op) == 0) {
        Emit(Token::Type::kOp, op, line_);
        Advance(pos_ + 2);
        return;
      }
    }
    const std::string kOne = "+-*/%~<>=()[]{},.:|";
    char c = src_[pos_];
    if (kOne.find(c) == std::string::npos) {
      throw TemplateError(absl::StrCat("unexpected character '", std::string(1, c), "' in a tag"),
                          line_);
    }
    Emit(Token::Type::kOp, std::string(1, c), line_);
    Advance(pos_ + 1);
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool strip_next_text_ = false;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> Lex(const std::string& source) { return Lexer(source).Run(); }

}  // namespace loom::jinja
