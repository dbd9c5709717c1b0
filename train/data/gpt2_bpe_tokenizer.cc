#include "train/data/gpt2_bpe_tokenizer.h"

#include <climits>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace loom::train {
namespace {

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

Gpt2BpeTokenizer::~Gpt2BpeTokenizer() = default;

absl::StatusOr<std::unique_ptr<Gpt2BpeTokenizer>> Gpt2BpeTokenizer::Load(
    const std::string& vocab_file, const std::string& merge_file) {
  std::unique_ptr<Gpt2BpeTokenizer> t(new Gpt2BpeTokenizer());
  absl::StatusOr<std::unique_ptr<bpe::SplitRegex>> split =
      bpe::SplitRegex::Compile(bpe::kGpt2Pattern);
  if (!split.ok()) return absl::InternalError(split.status().message());
  t->split_ = std::move(*split);

  absl::StatusOr<std::string> vocab_text = ReadFile(vocab_file, "--vocab-file");
  if (!vocab_text.ok()) return vocab_text.status();
  nlohmann::json vocab = nlohmann::json::parse(*vocab_text, nullptr, /*allow_exceptions=*/false);
  if (!vocab.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--vocab-file=", vocab_file, " is not a JSON object of token -> id (GPT-2 vocab.json)"));
  }
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat("--vocab-file=", vocab_file, ": token \"",
                                                     it.key(), "\" has no valid integer id"));
    }
    absl::Status added =
        t->model_.AddToken(it.key(), static_cast<int32_t>(it.value().get<int64_t>()));
    if (!added.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--vocab-file=", vocab_file, ": ", added.message()));
    }
  }
  int missing = t->model_.MissingByteSymbol();
  if (missing >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--vocab-file=", vocab_file, " lacks the symbol for byte ", missing,
                     ": a GPT-2 vocabulary has all 256 byte symbols"));
  }
  t->eod_id_ = t->model_.Id("<|endoftext|>");

  absl::StatusOr<std::string> merges = ReadFile(merge_file, "--merge-file");
  if (!merges.ok()) return merges.status();
  std::istringstream lines(*merges);
  std::string line;
  int line_no = 0;
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
    if (t->model_.Id(a + b) < 0) {
      return absl::InvalidArgumentError(absl::StrCat("--merge-file=", merge_file, " line ",
                                                     line_no, ": merge result \"", a + b,
                                                     "\" is not in --vocab-file"));
    }
    absl::Status merged = t->model_.AddMerge(a, b);
    if (!merged.ok()) return merged;
  }
  return t;
}

std::vector<std::string> Gpt2BpeTokenizer::PreTokenize(const std::string& text) const {
  std::vector<std::string> pieces;
  for (absl::string_view p : split_->Split(text)) pieces.emplace_back(p);
  return pieces;
}

std::vector<int32_t> Gpt2BpeTokenizer::Encode(const std::string& text) const {
  std::vector<int32_t> ids;
  for (absl::string_view piece : split_->Split(text)) {
    std::vector<int32_t> word = model_.EncodeWord(bpe::ToByteSymbols(piece));
    ids.insert(ids.end(), word.begin(), word.end());
  }
  return ids;
}

std::string Gpt2BpeTokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::vector<absl::string_view> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::string* token = model_.Token(id);
    if (token != nullptr) tokens.push_back(*token);
  }
  return bpe::DecodeByteLevel(tokens);
}

}  // namespace loom::train
