#include "train/default_data.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "train/data/preprocess.h"

namespace loom::train {

absl::Status MakeCacheDir(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);  // no shell: any character is fine
  if (error || !std::filesystem::is_directory(dir)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot create --data-cache-dir ", dir, ": ",
        error ? error.message() : std::string("it exists and is not a folder")));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> FortuneFiles(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "the default corpus ", dir, " is missing: run tools/setup.sh (apt-get install fortunes) "
        "or pass --data-path=<prefix of a .bin/.idx dataset>"));
  }
  std::vector<std::string> files;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name[0] == '.' || absl::EndsWith(name, ".dat") || absl::EndsWith(name, ".u8")) continue;
    std::string path = dir + "/" + name;
    struct stat st;
    if (lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) files.push_back(path);
  }
  closedir(d);
  std::sort(files.begin(), files.end());  // a stable corpus order
  if (files.empty()) {
    return absl::NotFoundError(absl::StrCat("no fortune files in ", dir));
  }
  return files;
}

// Tells tokenizers of one type apart (another tokenizer.json, vocab.json or
// .model under the same --tokenizer-type): the ids of a fixed text, the
// vocabulary size and the end-of-document id, hashed (FNV-1a: the name of a
// cache file must not change from run to run, as absl::Hash's may).
std::string TokenizerFingerprint(const Tokenizer& tokenizer) {
  static constexpr char kProbe[] =
      "The quick brown fox jumps over the lazy dog. 0123456789 \n\t  spaces\n"
      "Fortune: \"You will be hungry again in one hour.\" -- caf\xc3\xa9 na\xc3\xafve "
      "\xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80 it's ISN'T we'll";
  std::vector<int64_t> values;
  for (int32_t id : tokenizer.Encode(kProbe)) values.push_back(id);
  values.push_back(tokenizer.vocab_size());
  values.push_back(tokenizer.eod_id());
  uint64_t h = 1469598103934665603ull;
  for (int64_t v : values) {
    for (int byte = 0; byte < 8; ++byte) {
      h ^= static_cast<uint64_t>(v >> (8 * byte)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return absl::StrFormat("%016x", h).substr(0, 8);
}

std::string DefaultDataPrefix(const std::string& cache_dir, const Tokenizer& tokenizer,
                              const std::string& tokenizer_name) {
  return absl::StrCat(cache_dir, "/fortunes_", tokenizer_name, "_", TokenizerFingerprint(tokenizer));
}

absl::StatusOr<std::string> PrepareDefaultData(const std::string& cache_dir,
                                               const Tokenizer& tokenizer,
                                               const std::string& tokenizer_name,
                                               const std::string& fortunes_dir) {
  const std::string prefix =
      DefaultDataPrefix(cache_dir, tokenizer, tokenizer_name);
  if (std::ifstream(prefix + ".idx").good()) return prefix;  // done on an earlier run
  absl::Status made = MakeCacheDir(cache_dir);
  if (!made.ok()) return made;
  absl::StatusOr<std::vector<std::string>> files = FortuneFiles(fortunes_dir);
  if (!files.ok()) return files.status();
  PreprocessOptions options;
  options.inputs = *files;
  options.output_prefix = prefix;
  options.input_format = "text";
  options.document_separator = "%";
  options.append_eod = true;
  absl::StatusOr<PreprocessStats> stats = Preprocess(options, tokenizer);
  if (!stats.ok()) return stats.status();
  std::printf("prepared the default corpus: %zu fortune files, %lld documents, %lld tokens -> %s\n",
              files->size(), static_cast<long long>(stats->documents),
              static_cast<long long>(stats->tokens), prefix.c_str());
  return prefix;
}

}  // namespace loom::train
