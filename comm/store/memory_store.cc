#include "comm/store/memory_store.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom::comm {

absl::Status MemoryStore::Set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> l(mu_);
    data_[key] = value;
  }
  cv_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::string> MemoryStore::Get(const std::string& key, absl::Duration timeout) {
  absl::Status s = Wait({key}, timeout);
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> l(mu_);
  return data_[key];
}

absl::StatusOr<int64_t> MemoryStore::Add(const std::string& key, int64_t delta) {
  int64_t v = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = data_.find(key);
    if (it != data_.end() && !absl::SimpleAtoi(it->second, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("memory store: Add on key '", key, "' whose value is not an integer"));
    }
    v += delta;
    data_[key] = absl::StrCat(v);
  }
  cv_.notify_all();
  return v;
}

absl::Status MemoryStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  std::unique_lock<std::mutex> l(mu_);
  auto all = [&] {
    for (const auto& k : keys) {
      if (!data_.count(k)) return false;
    }
    return true;
  };
  if (!cv_.wait_for(l, absl::ToChronoNanoseconds(timeout), all)) {
    std::vector<std::string> missing;
    for (const auto& k : keys) {
      if (!data_.count(k)) missing.push_back(k);
    }
    return absl::DeadlineExceededError(absl::StrCat("memory store: keys [",
                                                    absl::StrJoin(missing, ", "),
                                                    "] not set within ",
                                                    absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

std::shared_ptr<void> MemoryStore::GetOrCreateObject(
    const std::string& key, const std::function<std::shared_ptr<void>()>& make) {
  std::lock_guard<std::mutex> l(mu_);
  auto& slot = objects_[key];
  if (!slot) slot = make();
  return slot;
}

}  // namespace loom::comm
