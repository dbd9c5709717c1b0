#include "train/data/preprocess.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "train/data/indexed_dataset.h"
#include "train/data/loss_mask.h"

namespace loom::train {
namespace {

// Documents in input order, tokenized a batch at a time by `workers` threads
// (Tokenizer::Encode is const and thread-safe) and written in input order, so
// the output does not depend on the number of workers.
class DocumentSink {
 public:
  DocumentSink(IndexedDatasetWriter* writer, const Tokenizer& tokenizer, bool append_eod,
               int workers, PreprocessStats* stats)
      : writer_(writer),
        tokenizer_(tokenizer),
        append_eod_(append_eod),
        workers_(std::max(1, workers)),
        stats_(stats) {}

  absl::Status Add(std::string text) {
    batch_bytes_ += static_cast<int64_t>(text.size());
    batch_.push_back(std::move(text));
    // Large enough that starting the threads is noise, small enough to stay in cache-sized
    // pieces of memory whatever the corpus.
    if (batch_bytes_ >= (4 << 20) || batch_.size() >= 4096) return Flush();
    return absl::OkStatus();
  }

  // Tokenizes and writes what is queued.
  absl::Status Flush() {
    ids_.assign(batch_.size(), {});
    std::atomic<size_t> next{0};
    auto encode = [&] {
      for (size_t i = next++; i < batch_.size(); i = next++) ids_[i] = tokenizer_.Encode(batch_[i]);
    };
    const int threads = static_cast<int>(std::min<size_t>(workers_, batch_.size()));
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(encode);
    encode();
    for (std::thread& t : pool) t.join();
    for (std::vector<int32_t>& ids : ids_) {
      if (append_eod_) ids.push_back(tokenizer_.eod_id());
      if (ids.empty()) continue;  // Megatron skips empty documents
      absl::Status s = writer_->AddSequence(ids.data(), ids.size());
      if (s.ok()) s = writer_->EndDocument();
      if (!s.ok()) return s;
      stats_->documents++;
      stats_->tokens += static_cast<int64_t>(ids.size());
    }
    batch_.clear();
    batch_bytes_ = 0;
    return absl::OkStatus();
  }

 private:
  IndexedDatasetWriter* writer_;
  const Tokenizer& tokenizer_;
  bool append_eod_;
  int workers_;
  PreprocessStats* stats_;
  std::vector<std::string> batch_;
  int64_t batch_bytes_ = 0;
  std::vector<std::vector<int32_t>> ids_;
};

bool IsJsonl(const std::string& path, const std::string& format) {
  if (format == "jsonl") return true;
  if (format == "text") return false;
  return absl::EndsWith(path, ".jsonl") || absl::EndsWith(path, ".json");
}

// --input names readable files and --output-prefix is set.
absl::Status CheckInputsAndPrefix(const PreprocessOptions& options) {
  if (options.inputs.empty()) {
    return absl::InvalidArgumentError("--input: expected at least one file");
  }
  if (options.output_prefix.empty()) {
    return absl::InvalidArgumentError("--output-prefix: expected a path prefix");
  }
  for (const std::string& path : options.inputs) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return absl::NotFoundError(absl::StrCat("--input: ", path, " is not a readable file"));
    }
  }
  return absl::OkStatus();
}

int64_t TotalBytes(const PreprocessOptions& options) {
  int64_t total = 0;
  for (const std::string& path : options.inputs) {
    struct stat st;
    if (stat(path.c_str(), &st) == 0) total += st.st_size;
  }
  return total;
}

absl::Status AddDocument(IndexedDatasetWriter* writer, const std::vector<int32_t>& tokens) {
  absl::Status s = writer->AddSequence(tokens.data(), tokens.size());
  return s.ok() ? writer->EndDocument() : s;
}

// One conversation line -> its JSON object, the messages checked before the
// template sees them (errors without the file:line prefix, which the caller
// adds).
absl::StatusOr<nlohmann::ordered_json> Conversation(const std::string& line) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("not valid JSON");
  if (!j.is_object() || !j.contains("messages") || !j["messages"].is_array()) {
    return absl::InvalidArgumentError(
        "expected a JSON object with a \"messages\" array of {\"role\": ..., \"content\": ...} (--sft)");
  }
  bool has_assistant = false;
  int index = 0;
  for (const auto& m : j["messages"]) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("message ", index, ": expected an object with a string \"role\""));
    }
    has_assistant = has_assistant || m["role"] == "assistant";
    ++index;
  }
  if (!has_assistant) {
    return absl::InvalidArgumentError(
        "the conversation has no assistant turn (nothing to train on)");
  }
  return j;
}

}  // namespace

absl::StatusOr<PreprocessStats> Preprocess(const PreprocessOptions& options,
                                           const Tokenizer& tokenizer,
                                           const ProgressFn& progress) {
  absl::Status checked = CheckInputsAndPrefix(options);
  if (!checked.ok()) return checked;
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
  const int64_t total_bytes = TotalBytes(options);

  absl::StatusOr<std::unique_ptr<IndexedDatasetWriter>> writer =
      IndexedDatasetWriter::Create(options.output_prefix, TokenTypeForVocab(tokenizer.vocab_size()));
  if (!writer.ok()) return writer.status();
  PreprocessStats stats;
  if (options.workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--workers=", options.workers, ": expected at least 1 tokenizing thread"));
  }
  DocumentSink sink(writer->get(), tokenizer, options.append_eod, options.workers, &stats);

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
        absl::Status s = sink.Add(std::move(doc));
        if (!s.ok()) return s;
        doc.clear();
      } else {
        doc += line;
        doc += '\n';
      }
      if (progress && line_no % 4096 == 0) progress(stats.bytes_read, total_bytes);
    }
    if (!jsonl && !doc.empty()) {
      absl::Status s = sink.Add(std::move(doc));
      if (!s.ok()) return s;
    }
  }
  absl::Status flushed = sink.Flush();
  if (!flushed.ok()) return flushed;
  if (progress) progress(total_bytes, total_bytes);
  if (stats.documents == 0) {
    return absl::InvalidArgumentError("--input: the files hold no non-empty document");
  }
  absl::Status done = (*writer)->Finalize();
  if (!done.ok()) return done;
  return stats;
}

absl::StatusOr<PreprocessStats> PreprocessSft(const PreprocessOptions& options,
                                              const HuggingFaceTokenizer& tokenizer,
                                              const ChatTemplate& chat_template,
                                              const ProgressFn& progress) {
  absl::Status checked = CheckInputsAndPrefix(options);
  if (!checked.ok()) return checked;
  if (options.input_format == "text") {
    return absl::InvalidArgumentError("--input-format=text: --sft reads JSON lines");
  }
  if (options.append_eod && tokenizer.eod_id() < 0) {
    return absl::InvalidArgumentError(
        "--append-eod: the tokenizer has no end-of-document token (no eos_token in "
        "tokenizer_config.json and none of <|endoftext|>, <|end_of_text|>, </s>, <eos>)");
  }
  const int64_t total_bytes = TotalBytes(options);
  const std::string mask_prefix = LossMaskPrefix(options.output_prefix);
  auto ids = IndexedDatasetWriter::Create(options.output_prefix,
                                          TokenTypeForVocab(tokenizer.vocab_size()));
  if (!ids.ok()) return ids.status();
  auto mask = IndexedDatasetWriter::Create(mask_prefix, TokenType::kU8);
  if (!mask.ok()) return mask.status();

  PreprocessStats stats;
  std::vector<int32_t> mask_values;
  for (const std::string& path : options.inputs) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("--input: cannot open ", path));
    std::string line;
    int64_t line_no = 0;
    while (std::getline(in, line)) {
      ++line_no;
      stats.bytes_read += static_cast<int64_t>(line.size()) + 1;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      auto at = [&](const absl::Status& s) {
        return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": ", s.message()));
      };
      absl::StatusOr<nlohmann::ordered_json> conversation = Conversation(line);
      if (!conversation.ok()) return at(conversation.status());
      const nlohmann::ordered_json no_tools;
      const auto tools = conversation->find("tools");
      absl::StatusOr<ChatTokens> chat = chat_template.Tokenize(
          (*conversation)["messages"], tools == conversation->end() ? no_tools : *tools, tokenizer);
      if (!chat.ok()) return at(chat.status());
      if (options.append_eod) {
        chat->ids.push_back(tokenizer.eod_id());
        chat->assistant_mask.push_back(0);
      }
      mask_values.assign(chat->assistant_mask.begin(), chat->assistant_mask.end());
      int64_t loss_tokens = 0;
      for (int32_t m : mask_values) loss_tokens += m;
      if (loss_tokens == 0) {
        return at(absl::InvalidArgumentError(
            "the template marks none of the assistant's tokens (empty answers?)"));
      }
      absl::Status s = AddDocument(ids->get(), chat->ids);
      if (s.ok()) s = AddDocument(mask->get(), mask_values);
      if (!s.ok()) return s;
      stats.documents++;
      stats.tokens += static_cast<int64_t>(chat->ids.size());
      stats.loss_tokens += loss_tokens;
      if (progress && line_no % 1024 == 0) progress(stats.bytes_read, total_bytes);
    }
  }
  if (progress) progress(total_bytes, total_bytes);
  if (stats.documents == 0) {
    return absl::InvalidArgumentError("--input: the files hold no conversation");
  }
  // The mask first: a dataset whose ids exist always has its mask.
  absl::Status done = (*mask)->Finalize();
  if (done.ok()) done = (*ids)->Finalize();
  if (!done.ok()) {
    std::remove((mask_prefix + ".bin").c_str());
    std::remove((mask_prefix + ".idx").c_str());
    return done;
  }
  return stats;
}

}  // namespace loom::train
