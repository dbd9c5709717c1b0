#ifndef LOOM_CHECKPOINT_HF_JSON_UTIL_H_
#define LOOM_CHECKPOINT_HF_JSON_UTIL_H_

// JSON parsing for Hugging Face files (private to checkpoint/hf).

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace loom::checkpoint::hf {

// Parses `text`, read from `path` (named in errors, with `what`: "index",
// "config", ...). InvalidArgument on a syntax error or on a key that appears
// twice in one object (nlohmann would silently keep the last one).
absl::StatusOr<nlohmann::json> ParseJsonStrict(const std::string& text, const std::string& path,
                                               const std::string& what);

}  // namespace loom::checkpoint::hf

#endif  // LOOM_CHECKPOINT_HF_JSON_UTIL_H_
