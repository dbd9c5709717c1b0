#include "train/data/hf_tokenizer.h"

#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "re2/re2.h"

namespace loom::train {

using Json = nlohmann::json;

namespace {

bool IsDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<Json> ParseJsonFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  try {
    return Json::parse(*text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not valid JSON (truncated?): ", e.what()));
  }
}

std::string Describe(const Json& j) {
  if (j.is_object() && j.contains("type") && j["type"].is_string()) {
    return absl::StrCat("{\"type\": ", j["type"].dump(), ", ...}");
  }
  std::string s = j.dump();
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

}  // namespace

// Reads tokenizer.json into a HuggingFaceTokenizer; every error names the
// file and the field.
class HuggingFaceTokenizer::Parser {
 public:
  Parser(HuggingFaceTokenizer* t, std::string file) : t_(t), file_(std::move(file)) {}

  absl::Status Parse(const Json& root) {
    if (!root.is_object()) return Bad("(top level)", "is not a JSON object");
    for (const char* field : {"truncation", "padding"}) {
      if (root.contains(field) && !root[field].is_null()) {
        return Bad(field, absl::StrCat("is ", Describe(root[field]),
                                       ": not supported (Loom encodes whole documents; "
                                       "expected null)"));
      }
    }
    if (root.contains("normalizer") && !root["normalizer"].is_null()) {
      return Bad("normalizer", absl::StrCat("is ", Describe(root["normalizer"]),
                                            ": Loom implements no normalizer (expected null)"));
    }
    if (!root.contains("model")) return Bad("model", "is missing");
    absl::Status s = ParseModel(root["model"]);
    if (s.ok()) s = ParseAddedTokens(root.contains("added_tokens") ? root["added_tokens"] : Json());
    if (!s.ok()) return s;
    if (!root.contains("pre_tokenizer") || root["pre_tokenizer"].is_null()) {
      return Bad("pre_tokenizer", "is null: Loom reads byte-level BPE (a ByteLevel pre-tokenizer)");
    }
    s = ParsePreTokenizer(root["pre_tokenizer"], "pre_tokenizer");
    if (!s.ok()) return s;
    if (t_->steps_.empty() || t_->steps_.back().kind != Step::kByteLevel) {
      return Bad("pre_tokenizer", "must end with ByteLevel (Loom reads byte-level BPE)");
    }
    if (root.contains("post_processor") && !root["post_processor"].is_null()) {
      s = ParsePostProcessor(root["post_processor"], "post_processor");
      if (!s.ok()) return s;
    }
    const Json decoder = root.contains("decoder") ? root["decoder"] : Json();
    if (!decoder.is_object() || decoder.value("type", "") != "ByteLevel") {
      return Bad("decoder", absl::StrCat("is ", Describe(decoder),
                                         ": Loom decodes byte-level BPE (expected ByteLevel)"));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Bad(const std::string& field, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(file_, ": ", field, " ", what));
  }

  absl::Status ParseModel(const Json& m) {
    if (!m.is_object()) return Bad("model", "is not an object");
    const std::string type = m.contains("type") && m["type"].is_string()
                                 ? m["type"].get<std::string>()
                                 : (m.contains("merges") ? "BPE" : "");
    if (type != "BPE") {
      return Bad("model.type", absl::StrCat("is \"", type,
                                            "\": Loom's HuggingFaceTokenizer reads byte-level "
                                            "BPE only (expected \"BPE\")"));
    }
    if (m.contains("dropout") && !m["dropout"].is_null() &&
        !(m["dropout"].is_number() && m["dropout"].get<double>() == 0)) {
      return Bad("model.dropout", "is set: BPE dropout is not supported (expected null)");
    }
    for (const char* field : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (m.contains(field) && !m[field].is_null() &&
          !(m[field].is_string() && m[field].get<std::string>().empty())) {
        return Bad(absl::StrCat("model.", field), "is set: not supported (expected null)");
      }
    }
    if (m.contains("byte_fallback") && m["byte_fallback"].is_boolean() &&
        m["byte_fallback"].get<bool>()) {
      return Bad("model.byte_fallback", "is true: not supported (expected false)");
    }
    if (m.contains("ignore_merges") && m["ignore_merges"].is_boolean()) {
      t_->model_.set_ignore_merges(m["ignore_merges"].get<bool>());
    }
    if (!m.contains("vocab") || !m["vocab"].is_object()) {
      return Bad("model.vocab", "is missing or not an object of token -> id");
    }
    for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
          it.value().get<int64_t>() > INT32_MAX) {
        return Bad("model.vocab", absl::StrCat("token \"", it.key(), "\" has no valid id"));
      }
      absl::Status s = t_->model_.AddToken(it.key(), static_cast<int32_t>(it.value().get<int64_t>()));
      if (!s.ok()) return Bad("model.vocab", std::string(s.message()));
    }
    int missing = t_->model_.MissingByteSymbol();
    if (missing >= 0) {
      return Bad("model.vocab", absl::StrCat("lacks the ByteLevel symbol for byte ", missing,
                                             ": Loom reads byte-level BPE with all 256"));
    }
    if (!m.contains("merges") || !m["merges"].is_array()) {
      return Bad("model.merges", "is missing or not an array");
    }
    const Json& merges = m["merges"];
    for (size_t i = 0; i < merges.size(); ++i) {
      const std::string field = absl::StrCat("model.merges[", i, "]");
      std::string a, b;
      if (merges[i].is_string()) {  // "a b" (tokenizers < 0.20)
        const std::string line = merges[i].get<std::string>();
        size_t space = line.find(' ');
        if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
          return Bad(field, absl::StrCat("is \"", line, "\": expected two symbols"));
        }
        a = line.substr(0, space);
        b = line.substr(space + 1);
      } else if (merges[i].is_array() && merges[i].size() == 2 && merges[i][0].is_string() &&
                 merges[i][1].is_string()) {
        a = merges[i][0].get<std::string>();
        b = merges[i][1].get<std::string>();
      } else {
        return Bad(field, "is neither \"a b\" nor [\"a\", \"b\"]");
      }
      absl::Status s = t_->model_.AddMerge(a, b);
      if (!s.ok()) return Bad(field, std::string(s.message()));
    }
    t_->vocab_size_ = t_->model_.size();
    return absl::OkStatus();
  }

  absl::Status ParseAddedTokens(const Json& added) {
    if (added.is_null()) return absl::OkStatus();
    if (!added.is_array()) return Bad("added_tokens", "is not an array");
    for (size_t i = 0; i < added.size(); ++i) {
      const std::string field = absl::StrCat("added_tokens[", i, "]");
      const Json& a = added[i];
      if (!a.is_object() || !a.contains("content") || !a["content"].is_string() ||
          a["content"].get<std::string>().empty() || !a.contains("id") ||
          !a["id"].is_number_integer() || a["id"].get<int64_t>() < 0 ||
          a["id"].get<int64_t>() > INT32_MAX) {
        return Bad(field, "needs a non-empty \"content\" and an \"id\"");
      }
      for (const char* flag : {"single_word", "lstrip", "rstrip"}) {
        if (a.contains(flag) && a[flag].is_boolean() && a[flag].get<bool>()) {
          return Bad(absl::StrCat(field, ".", flag), "is true: not supported (expected false)");
        }
      }
      auto token = std::make_unique<AddedToken>();
      token->content = a["content"].get<std::string>();
      token->id = static_cast<int32_t>(a["id"].get<int64_t>());
      const bool normalized = a.value("normalized", true);
      AddedIndex& index = normalized ? t_->normalized_added_ : t_->raw_added_;
      index[static_cast<unsigned char>(token->content[0])].push_back(token.get());
      t_->added_by_id_[token->id] = token->content;
      t_->vocab_size_ = std::max<int64_t>(t_->vocab_size_, token->id + int64_t{1});
      t_->added_.push_back(std::move(token));
    }
    for (AddedIndex* index : {&t_->raw_added_, &t_->normalized_added_}) {
      for (auto& bucket : *index) {
        std::stable_sort(bucket.begin(), bucket.end(), [](const AddedToken* x, const AddedToken* y) {
          return x->content.size() > y->content.size();
        });
      }
    }
    return absl::OkStatus();
  }

  absl::Status AddSplit(const std::string& pattern, const std::string& field) {
    absl::StatusOr<std::unique_ptr<bpe::SplitRegex>> split = bpe::SplitRegex::Compile(pattern);
    if (!split.ok()) return Bad(field, std::string(split.status().message()));
    t_->steps_.push_back({Step::kSplit, std::move(*split)});
    return absl::OkStatus();
  }

  absl::Status ParsePreTokenizer(const Json& p, const std::string& field) {
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) {
      return Bad(field, "is not an object with a \"type\"");
    }
    if (!t_->steps_.empty() && t_->steps_.back().kind == Step::kByteLevel) {
      return Bad(field, "follows ByteLevel: Loom needs ByteLevel last");
    }
    const std::string type = p["type"].get<std::string>();
    if (type == "Sequence") {
      if (!p.contains("pretokenizers") || !p["pretokenizers"].is_array()) {
        return Bad(field + ".pretokenizers", "is missing or not an array");
      }
      for (size_t i = 0; i < p["pretokenizers"].size(); ++i) {
        absl::Status s = ParsePreTokenizer(p["pretokenizers"][i],
                                           absl::StrCat(field, ".pretokenizers[", i, "]"));
        if (!s.ok()) return s;
      }
      return absl::OkStatus();
    }
    if (type == "Split") {
      if (p.value("behavior", "") != "Isolated") {
        return Bad(field + ".behavior",
                   absl::StrCat("is ", p.contains("behavior") ? p["behavior"].dump() : "missing",
                                ": only \"Isolated\" is supported"));
      }
      if (p.value("invert", false)) return Bad(field + ".invert", "is true: not supported");
      const Json pattern = p.contains("pattern") ? p["pattern"] : Json();
      if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
        return AddSplit(pattern["Regex"].get<std::string>(), field + ".pattern.Regex");
      }
      if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
        return AddSplit(re2::RE2::QuoteMeta(pattern["String"].get<std::string>()),
                        field + ".pattern.String");
      }
      return Bad(field + ".pattern", "is neither {\"Regex\": ...} nor {\"String\": ...}");
    }
    if (type == "ByteLevel") {
      if (p.value("add_prefix_space", true)) t_->steps_.push_back({Step::kPrefixSpace, nullptr});
      if (p.value("use_regex", true)) {
        absl::Status s = AddSplit(bpe::kGpt2Pattern, field);
        if (!s.ok()) return s;
      }
      t_->steps_.push_back({Step::kByteLevel, nullptr});
      return absl::OkStatus();
    }
    return Bad(field + ".type", absl::StrCat("is \"", type,
                                             "\": supported pre-tokenizers are ByteLevel, Split "
                                             "and a Sequence of them"));
  }

  absl::Status ParsePostProcessor(const Json& p, const std::string& field) {
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) {
      return Bad(field, "is not an object with a \"type\"");
    }
    const std::string type = p["type"].get<std::string>();
    if (type == "ByteLevel") return absl::OkStatus();  // offsets only
    if (type == "Sequence") {
      if (!p.contains("processors") || !p["processors"].is_array()) {
        return Bad(field + ".processors", "is missing or not an array");
      }
      for (size_t i = 0; i < p["processors"].size(); ++i) {
        absl::Status s =
            ParsePostProcessor(p["processors"][i], absl::StrCat(field, ".processors[", i, "]"));
        if (!s.ok()) return s;
      }
      return absl::OkStatus();
    }
    if (type == "TemplateProcessing") {
      if (t_->sequence_at_ >= 0) return Bad(field, "is a second TemplateProcessing");
      if (!p.contains("single") || !p["single"].is_array()) {
        return Bad(field + ".single", "is missing or not an array");
      }
      const Json specials = p.contains("special_tokens") ? p["special_tokens"] : Json::object();
      const Json& single = p["single"];
      for (size_t i = 0; i < single.size(); ++i) {
        const std::string item = absl::StrCat(field, ".single[", i, "]");
        const Json& piece = single[i];
        if (piece.is_object() && piece.contains("Sequence")) {
          if (piece["Sequence"].value("id", "") != "A" || t_->sequence_at_ >= 0) {
            return Bad(item, "must be the one Sequence \"A\"");
          }
          t_->sequence_at_ = static_cast<int>(t_->template_ids_.size());
        } else if (piece.is_object() && piece.contains("SpecialToken")) {
          const std::string name = piece["SpecialToken"].value("id", "");
          if (!specials.is_object() || !specials.contains(name) ||
              !specials[name].contains("ids") || !specials[name]["ids"].is_array()) {
            return Bad(item, absl::StrCat("names \"", name, "\", which ", field,
                                          ".special_tokens does not give ids"));
          }
          for (const Json& id : specials[name]["ids"]) {
            if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
              return Bad(absl::StrCat(field, ".special_tokens.", name, ".ids"), "holds a bad id");
            }
            t_->template_ids_.push_back(static_cast<int32_t>(id.get<int64_t>()));
            t_->vocab_size_ = std::max<int64_t>(t_->vocab_size_, id.get<int64_t>() + 1);
          }
        } else {
          return Bad(item, "is neither {\"SpecialToken\": ...} nor {\"Sequence\": ...}");
        }
      }
      if (t_->sequence_at_ < 0) return Bad(field + ".single", "has no Sequence \"A\"");
      return absl::OkStatus();
    }
    return Bad(field + ".type", absl::StrCat("is \"", type,
                                             "\": supported post-processors are ByteLevel, "
                                             "TemplateProcessing and a Sequence of them"));
  }

  HuggingFaceTokenizer* t_;
  std::string file_;
};

HuggingFaceTokenizer::~HuggingFaceTokenizer() = default;

absl::StatusOr<std::unique_ptr<HuggingFaceTokenizer>> HuggingFaceTokenizer::Load(
    const std::string& path) {
  std::string file = path, dir;
  if (IsDirectory(path)) {
    dir = path;
    file = absl::StrCat(path, "/tokenizer.json");
    if (!std::ifstream(file).good()) {
      return absl::NotFoundError(absl::StrCat("--tokenizer-model=", path,
                                              " has no tokenizer.json (expected a Hugging Face "
                                              "tokenizer folder or the tokenizer.json file)"));
    }
  } else {
    if (!std::ifstream(file).good()) {
      return absl::NotFoundError(absl::StrCat(
          "--tokenizer-model=", path,
          ": cannot open (expected a folder holding tokenizer.json, or the tokenizer.json file)"));
    }
    size_t slash = file.rfind('/');
    dir = slash == std::string::npos ? "." : file.substr(0, slash);
  }
  absl::StatusOr<Json> root = ParseJsonFile(file);
  if (!root.ok()) return root.status();
  std::unique_ptr<HuggingFaceTokenizer> t(new HuggingFaceTokenizer());
  t->file_ = file;
  absl::Status parsed;
  try {
    parsed = Parser(t.get(), file).Parse(*root);
  } catch (const Json::exception& e) {  // a field of an unexpected JSON type
    parsed = absl::InvalidArgumentError(absl::StrCat(file, ": unexpected structure: ", e.what()));
  }
  if (!parsed.ok()) return parsed;

  // eos/bos: tokenizer_config.json when there (as transformers reads them).
  auto lookup = [&t](const std::string& token) -> int32_t {
    for (const auto& a : t->added_) {
      if (a->content == token) return a->id;
    }
    return t->model_.Id(token);
  };
  const std::string config_file = absl::StrCat(dir, "/tokenizer_config.json");
  Json config = Json::object();
  if (std::ifstream(config_file).good()) {
    absl::StatusOr<Json> c = ParseJsonFile(config_file);
    if (!c.ok()) return c.status();
    if (c->is_object()) config = *c;
  }
  auto special = [&](const char* field, std::initializer_list<const char*> fallbacks,
                     int32_t* id) -> absl::Status {
    if (config.contains(field) && !config[field].is_null()) {
      const Json& v = config[field];
      std::string token = v.is_string() ? v.get<std::string>()
                                        : (v.is_object() ? v.value("content", "") : "");
      *id = lookup(token);
      if (*id < 0) {
        return absl::InvalidArgumentError(absl::StrCat(config_file, ": ", field, " \"", token,
                                                       "\" is not a token of ", file));
      }
      return absl::OkStatus();
    }
    for (const char* name : fallbacks) {
      *id = lookup(name);
      if (*id >= 0) break;
    }
    return absl::OkStatus();
  };
  absl::Status s = special("eos_token", {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"},
                           &t->eod_id_);
  if (s.ok()) s = special("bos_token", {"<|begin_of_text|>", "<s>", "<bos>"}, &t->bos_id_);
  if (!s.ok()) return s;
  return t;
}

template <typename Emit>
void HuggingFaceTokenizer::SplitOnAdded(absl::string_view text, const AddedIndex& index,
                                        Emit emit) {
  size_t start = 0, i = 0;
  while (i < text.size()) {
    const AddedToken* found = nullptr;
    for (const AddedToken* a : index[static_cast<unsigned char>(text[i])]) {
      if (absl::StartsWith(text.substr(i), a->content)) {
        found = a;  // the longest, as the bucket is sorted longest first
        break;
      }
    }
    if (found == nullptr) {
      ++i;
      continue;
    }
    if (i > start) emit(text.substr(start, i - start), nullptr);
    emit(text.substr(i, 0), found);  // empty, but where the token is
    i += found->content.size();
    start = i;
  }
  if (start < text.size()) emit(text.substr(start), nullptr);
}

std::vector<std::string> HuggingFaceTokenizer::Pieces(absl::string_view segment,
                                                      std::vector<bool>* prefixed) const {
  std::vector<std::string> pieces = {std::string(segment)};
  std::vector<bool> added = {false};
  for (const PreTokenizerStep& step : steps_) {
    if (step.kind == Step::kSplit) {
      std::vector<std::string> next;
      std::vector<bool> next_added;
      for (size_t i = 0; i < pieces.size(); ++i) {
        bool first = true;
        for (absl::string_view q : step.split->Split(pieces[i])) {
          next_added.push_back(added[i] && first);
          first = false;
          next.emplace_back(q);
        }
      }
      pieces.swap(next);
      added.swap(next_added);
    } else if (step.kind == Step::kPrefixSpace) {
      for (size_t i = 0; i < pieces.size(); ++i) {
        if (!absl::StartsWith(pieces[i], " ")) {
          pieces[i].insert(0, " ");
          added[i] = true;
        }
      }
    }
  }
  if (prefixed != nullptr) *prefixed = std::move(added);
  return pieces;
}

void HuggingFaceTokenizer::EncodeSegment(absl::string_view segment, std::vector<int32_t>* ids,
                                         std::vector<std::pair<size_t, size_t>>* offsets,
                                         size_t at) const {
  std::vector<bool> prefixed;
  std::vector<std::string> pieces = Pieces(segment, &prefixed);
  for (size_t p = 0; p < pieces.size(); ++p) {
    const std::string& piece = pieces[p];
    if (piece.empty()) continue;
    std::vector<int32_t> word = model_.EncodeWord(bpe::ToByteSymbols(piece));
    ids->insert(ids->end(), word.begin(), word.end());
    if (offsets == nullptr) continue;
    bool skip_space = prefixed[p];
    for (int32_t id : word) {
      // A token's string holds one byte-level character per byte.
      size_t bytes = 0;
      for (unsigned char c : *model_.Token(id)) bytes += (c & 0xC0) != 0x80;
      if (skip_space && bytes > 0) {
        --bytes;
        skip_space = false;
      }
      offsets->emplace_back(at, at + bytes);
      at += bytes;
    }
  }
}

std::vector<std::string> HuggingFaceTokenizer::PreTokenize(const std::string& text) const {
  return Pieces(text);
}

std::vector<int32_t> HuggingFaceTokenizer::EncodeText(
    const std::string& text, std::vector<std::pair<size_t, size_t>>* offsets) const {
  std::vector<int32_t> ids;
  auto added = [&](const AddedToken* token, absl::string_view where) {
    ids.push_back(token->id);
    if (offsets != nullptr) {
      size_t at = static_cast<size_t>(where.data() - text.data());
      offsets->emplace_back(at, at + token->content.size());
    }
  };
  // SplitOnAdded hands out views into `text`; an added token's view is
  // empty, placed where the token starts.
  SplitOnAdded(text, raw_added_, [&](absl::string_view segment, const AddedToken* token) {
    if (token != nullptr) {
      added(token, segment);
      return;
    }
    SplitOnAdded(segment, normalized_added_, [&](absl::string_view s, const AddedToken* t) {
      if (t != nullptr) {
        added(t, s);
      } else {
        EncodeSegment(s, &ids, offsets, static_cast<size_t>(s.data() - text.data()));
      }
    });
  });
  return ids;
}

std::vector<int32_t> HuggingFaceTokenizer::EncodeWithOffsets(
    const std::string& text, std::vector<std::pair<size_t, size_t>>* offsets) const {
  offsets->clear();
  return EncodeText(text, offsets);
}

std::vector<int32_t> HuggingFaceTokenizer::Encode(const std::string& text) const {
  std::vector<int32_t> ids = EncodeText(text, nullptr);
  if (sequence_at_ < 0) return ids;
  std::vector<int32_t> out(template_ids_.begin(), template_ids_.begin() + sequence_at_);
  out.insert(out.end(), ids.begin(), ids.end());
  out.insert(out.end(), template_ids_.begin() + sequence_at_, template_ids_.end());
  return out;
}

std::string HuggingFaceTokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::vector<absl::string_view> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    auto added = added_by_id_.find(id);
    if (added != added_by_id_.end()) {
      tokens.push_back(added->second);
    } else if (const std::string* token = model_.Token(id)) {
      tokens.push_back(*token);
    }  // unknown ids are skipped, as Hugging Face does
  }
  return bpe::DecodeByteLevel(tokens);
}

}  // namespace loom::train
