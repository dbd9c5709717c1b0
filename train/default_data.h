#ifndef LOOM_TRAIN_DEFAULT_DATA_H_
#define LOOM_TRAIN_DEFAULT_DATA_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "train/data/tokenizer.h"

namespace loom::train {

// The default corpus: the English text of Debian's `fortunes` package
// (installed by tools/setup.sh), one document per fortune.
inline constexpr char kFortunesDir[] = "/usr/share/games/fortunes";

// Creates `dir` and its missing parents (no shell: quotes and spaces are
// fine). An error names --data-cache-dir and the reason.
absl::Status MakeCacheDir(const std::string& dir);

// The fortune text files in `dir` (no .dat/.u8 indexes, no sub-folders).
absl::StatusOr<std::vector<std::string>> FortuneFiles(const std::string& dir);

// 8 hex digits that differ between tokenizers of one type (another
// tokenizer.json or vocabulary), stable from run to run.
std::string TokenizerFingerprint(const Tokenizer& tokenizer);

// Where the default corpus tokenized by `tokenizer` lives in `cache_dir`:
// the dataset prefix cache_dir/fortunes_<tokenizer name>_<fingerprint>.
std::string DefaultDataPrefix(const std::string& cache_dir, const Tokenizer& tokenizer,
                              const std::string& tokenizer_name);

// Makes sure the default corpus is tokenized into `cache_dir` and returns
// the dataset prefix (DefaultDataPrefix). Preprocesses
// on first use of that tokenizer only (the dataset writer is atomic, so an
// interrupted run leaves no half-written files).
absl::StatusOr<std::string> PrepareDefaultData(const std::string& cache_dir,
                                               const Tokenizer& tokenizer,
                                               const std::string& tokenizer_name,
                                               const std::string& fortunes_dir = kFortunesDir);

}  // namespace loom::train

#endif  // LOOM_TRAIN_DEFAULT_DATA_H_
