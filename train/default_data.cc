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

absl::StatusOr<std::string> PrepareDefaultData(const std::string& cache_dir,
                                               const Tokenizer& tokenizer,
                                               const std::string& tokenizer_name,
                                               const std::string& fortunes_dir) {
  const std::string prefix = absl::StrCat(cache_dir, "/fortunes_", tokenizer_name);
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
