#include "train/data/preprocess.h"

#include <sys/stat.h>

#include <fstream>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "train/data/indexed_dataset.h"

namespace loom::train {
namespace {

class DocumentSink {
 public:
  DocumentSink(IndexedDatasetWriter* writer, const Tokenizer& tokenizer, bool append_eod,
               PreprocessStats* stats)
      : writer_(writer), tokenizer_(tokenizer), append_eod_(append_eod), stats_(stats) {}

  absl::Status Add(const std::string& text) {
    std::vector<int32_t> ids = tokenizer_.Encode(text);
    if (append_eod_) ids.push_back(tokenizer_.eod_id());
    if (ids.empty()) return absl::OkStatus();  // Megatron skips empty documents
    absl::Status s = writer_->AddSequence(ids.data(), ids.size());
    if (!s.ok()) return s;
    stats_->documents++;
    stats_->tokens += static_cast<int64_t>(ids.size());
    return writer_->EndDocument();
  }

 private:
  IndexedDatasetWriter* writer_;
  const Tokenizer& tokenizer_;
  bool append_eod_;
  PreprocessStats* stats_;
};

bool IsJsonl(const std::string& path, const std::string& format) {
  if (format == "jsonl") return true;
  if (format == "text") return false;
  return absl::EndsWith(path, ".jsonl") || absl::EndsWith(path, ".json");
}

}  // namespace

absl::StatusOr<PreprocessStats> Preprocess(const PreprocessOptions& options,
                                           const Tokenizer& tokenizer,
                                           const ProgressFn& progress) {
  if (options.inputs.empty()) {
    return absl::InvalidArgumentError("--input: expected at least one file");
  }
  if (options.output_prefix.empty()) {
    return absl::InvalidArgumentError("--output-prefix: expected a path prefix");
  }
  if (options.input_format != "auto" && options.input_format != "jsonl" &&
      options.input_format != "text") {
    return absl::InvalidArgumentError(absl::StrCat("--input-format=", options.input_format,
                                                   ": expected auto, jsonl or text"));
  }
  if (options.append_eod && tokenizer.eod_id() < 0) {
    return absl::InvalidArgumentError(
        "--append-eod: the tokenizer has no end-of-document token (GPT-2: <|endoftext|> missing "
        "from --vocab-file; Hugging Face: no eos_token in tokenizer_config.json and none of "
        "<|endoftext|>, <|end_of_text|>, </s>, <eos>; SentencePiece: the model has no eos)");
  }
  int64_t total_bytes = 0;
  for (const std::string& path : options.inputs) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return absl::NotFoundError(absl::StrCat("--input: ", path, " is not a readable file"));
    }
    total_bytes += st.st_size;
  }

  absl::StatusOr<std::unique_ptr<IndexedDatasetWriter>> writer =
      IndexedDatasetWriter::Create(options.output_prefix, TokenTypeForVocab(tokenizer.vocab_size()));
  if (!writer.ok()) return writer.status();
  PreprocessStats stats;
  DocumentSink sink(writer->get(), tokenizer, options.append_eod, &stats);

  for (const std::string& path : options.inputs) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("--input: cannot open ", path));
    const bool jsonl = IsJsonl(path, options.input_format);
    std::string line, doc;
    int64_t line_no = 0;
    while (std::getline(in, line)) {
      ++line_no;
      stats.bytes_read += static_cast<int64_t>(line.size()) + 1;
      if (jsonl) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (!j.is_object() || !j.contains(options.json_key) || !j[options.json_key].is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(
              path, ":", line_no, ": expected a JSON object with a string field \"",
              options.json_key, "\" (--json-keys)"));
        }
        absl::Status s = sink.Add(j[options.json_key].get<std::string>());
        if (!s.ok()) return s;
      } else if (!options.document_separator.empty() && line == options.document_separator) {
        absl::Status s = sink.Add(doc);
        if (!s.ok()) return s;
        doc.clear();
      } else {
        doc += line;
        doc += '\n';
      }
      if (progress && line_no % 4096 == 0) progress(stats.bytes_read, total_bytes);
    }
    if (!jsonl && !doc.empty()) {
      absl::Status s = sink.Add(doc);
      if (!s.ok()) return s;
    }
  }
  if (progress) progress(total_bytes, total_bytes);
  if (stats.documents == 0) {
    return absl::InvalidArgumentError("--input: the files hold no non-empty document");
  }
  absl::Status done = (*writer)->Finalize();
  if (!done.ok()) return done;
  return stats;
}

}  // namespace loom::train
