#include "checkpoint/hf/json_util.h"

#include <set>
#include <vector>

#include "absl/strings/str_cat.h"

namespace loom::checkpoint::hf {

absl::StatusOr<nlohmann::json> ParseJsonStrict(const std::string& text, const std::string& path,
                                               const std::string& what) {
  using nlohmann::json;
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::string duplicate;
  auto callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys.empty() && !keys.back().insert(parsed.get<std::string>()).second &&
            duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  json out;
  try {
    out = json::parse(text, callback);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": bad ", what, " JSON: ", e.what()));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": bad ", what, " JSON: name '", duplicate, "' appears twice"));
  }
  return out;
}

}  // namespace loom::checkpoint::hf
