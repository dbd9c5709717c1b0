// bazel run //train:preprocess_data -- --input=a.jsonl,b.txt --output-prefix=data/my
//     --tokenizer-type=GPT2BPETokenizer --vocab-file=vocab.json --merge-file=merges.txt
// (or --tokenizer-type=HuggingFaceTokenizer --tokenizer-model=DIR_WITH_TOKENIZER_JSON,
//  or --tokenizer-type=SentencePieceTokenizer --tokenizer-model=tokenizer.model)
// Tokenizes text or JSON-lines files into a Megatron indexed dataset
// (<prefix>.bin/.idx) that //train:gpt reads with --data-path=<prefix>.
// With --sft, JSON lines of {"messages": [...]} are rendered with the chat
// template of the --tokenizer-model folder, and the loss mask (the
// assistant's tokens) goes to <prefix>_loss_mask.bin/.idx beside them.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "core/cli.h"
#include "train/data/chat_template.h"
#include "train/data/hf_tokenizer.h"
#include "train/data/loss_mask.h"
#include "train/data/preprocess.h"
#include "train/data/tokenizer.h"

ABSL_FLAG(std::string, input, "", "Comma-separated input files (text, or JSON lines)");
ABSL_FLAG(std::string, output_prefix, "", "Output path prefix: writes <prefix>.bin and <prefix>.idx");
ABSL_FLAG(loom::train::TokenizerType, tokenizer_type, loom::train::TokenizerType::kGpt2Bpe,
          "ByteLevelTokenizer (256 byte ids) | GPT2BPETokenizer | HuggingFaceTokenizer | "
          "SentencePieceTokenizer");
ABSL_FLAG(std::string, vocab_file, "", "GPT-2 vocab.json (GPT2BPETokenizer)");
ABSL_FLAG(std::string, merge_file, "", "GPT-2 merges.txt (GPT2BPETokenizer)");
ABSL_FLAG(std::string, tokenizer_model, "",
          "HuggingFaceTokenizer: folder holding tokenizer.json (or the file); "
          "SentencePieceTokenizer: the .model file");
ABSL_FLAG(std::string, input_format, "auto", "auto (by extension), jsonl or text");
ABSL_FLAG(std::string, json_keys, "text", "JSON field holding the document text");
ABSL_FLAG(std::string, document_separator, "",
          "Text input: a line equal to this ends a document (\"%\" for fortune files); empty: "
          "one document per file");
ABSL_FLAG(bool, append_eod, false, "Append the end-of-document token to every document");
ABSL_FLAG(int, workers, 1,
          "Threads tokenizing documents (Megatron's --workers); the output is the same for any "
          "number");
ABSL_FLAG(bool, sft, false,
          "Supervised fine-tuning data: JSON lines {\"messages\": [{\"role\", \"content\"}, ...]} "
          "rendered with the chat template of --tokenizer-model (HuggingFaceTokenizer); also "
          "writes <prefix>_loss_mask.bin/.idx, 1 on the assistant's tokens");

namespace {

void DrawProgress(int64_t done, int64_t total, std::chrono::steady_clock::time_point start) {
  const int width = 40;
  double frac = total > 0 ? static_cast<double>(done) / total : 1.0;
  int filled = static_cast<int>(frac * width);
  double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() + 1e-9;
  std::fprintf(stderr, "\r[%s%s] %5.1f%%  %.1f MB/s", std::string(filled, '#').c_str(),
               std::string(width - filled, ' ').c_str(), 100 * frac, done / secs / 1e6);
  std::fflush(stderr);
}

}  // namespace

using loom::core::ResolveUserPath;

namespace {

int Fail(const std::string& message, int code) {
  std::fprintf(stderr, "preprocess_data: %s\n", message.c_str());
  return code;
}

int RunSft(const loom::train::PreprocessOptions& options) {
  const loom::train::TokenizerType type = absl::GetFlag(FLAGS_tokenizer_type);
  if (type != loom::train::TokenizerType::kHuggingFace) {
    return Fail("--sft: needs --tokenizer-type=HuggingFaceTokenizer (the chat template comes from "
                "its --tokenizer-model folder), got --tokenizer-type=" +
                    std::string(loom::core::EnumName(type)),
                2);
  }
  const std::string folder = ResolveUserPath(absl::GetFlag(FLAGS_tokenizer_model));
  if (folder.empty()) return Fail("--sft: needs --tokenizer-model=FOLDER (tokenizer.json and its chat template)", 2);
  auto tokenizer = loom::train::HuggingFaceTokenizer::Load(folder);
  if (!tokenizer.ok()) return Fail(std::string(tokenizer.status().message()), 2);
  auto chat = loom::train::ChatTemplate::Load(folder);
  if (!chat.ok()) return Fail(std::string(chat.status().message()), 2);
  auto start = std::chrono::steady_clock::now();
  auto stats = loom::train::PreprocessSft(options, **tokenizer, *chat, [&](int64_t done, int64_t total) {
    DrawProgress(done, total, start);
  });
  std::fprintf(stderr, "\n");
  if (!stats.ok()) return Fail(std::string(stats.status().message()), 1);
  std::printf("wrote %s.bin/.idx and %s.bin/.idx: %lld conversations, %lld tokens, %lld in the "
              "loss (template %s)\n",
              options.output_prefix.c_str(),
              loom::train::LossMaskPrefix(options.output_prefix).c_str(),
              static_cast<long long>(stats->documents), static_cast<long long>(stats->tokens),
              static_cast<long long>(stats->loss_tokens), chat->file().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Tokenizes text or JSON-lines files into a Megatron indexed dataset.\n"
      "  preprocess_data --input=FILES --output-prefix=PREFIX --tokenizer-type=TYPE");
  // A misspelt flag or value (--tokenizer-type=HuggingFace) exits 2 naming it.
  loom::core::ParseCommandLine(argc, argv);
  loom::train::PreprocessOptions options;
  for (absl::string_view f : absl::StrSplit(absl::GetFlag(FLAGS_input), ',', absl::SkipEmpty())) {
    options.inputs.push_back(ResolveUserPath(std::string(f)));
  }
  options.output_prefix = ResolveUserPath(absl::GetFlag(FLAGS_output_prefix));
  options.input_format = absl::GetFlag(FLAGS_input_format);
  options.json_key = absl::GetFlag(FLAGS_json_keys);
  options.document_separator = absl::GetFlag(FLAGS_document_separator);
  options.append_eod = absl::GetFlag(FLAGS_append_eod);
  options.workers = absl::GetFlag(FLAGS_workers);

  if (absl::GetFlag(FLAGS_sft)) return RunSft(options);

  loom::train::TokenizerFiles files;
  files.vocab_file = ResolveUserPath(absl::GetFlag(FLAGS_vocab_file));
  files.merge_file = ResolveUserPath(absl::GetFlag(FLAGS_merge_file));
  files.tokenizer_model = ResolveUserPath(absl::GetFlag(FLAGS_tokenizer_model));
  auto tokenizer = loom::train::MakeTokenizer(absl::GetFlag(FLAGS_tokenizer_type), files);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "preprocess_data: %s\n", std::string(tokenizer.status().message()).c_str());
    return 2;
  }
  auto start = std::chrono::steady_clock::now();
  auto stats = loom::train::Preprocess(options, **tokenizer, [&](int64_t done, int64_t total) {
    DrawProgress(done, total, start);
  });
  std::fprintf(stderr, "\n");
  if (!stats.ok()) {
    std::fprintf(stderr, "preprocess_data: %s\n", std::string(stats.status().message()).c_str());
    return 1;
  }
  // Reading, tokenizing and writing (the tokenizer's loading excluded).
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("wrote %s.bin/.idx: %lld documents, %lld tokens (vocab %lld) in %.2f s, %.0f "
              "tokens/s with %d worker(s)\n",
              options.output_prefix.c_str(), static_cast<long long>(stats->documents),
              static_cast<long long>(stats->tokens),
              static_cast<long long>((*tokenizer)->vocab_size()), seconds,
              static_cast<double>(stats->tokens) / seconds, options.workers);
  return 0;
}
