#ifndef LOOM_COMM_STORE_MEMORY_STORE_H_
#define LOOM_COMM_STORE_MEMORY_STORE_H_

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/store/store.h"

namespace loom::comm {

// A store shared by the threads of one process (tests, the local backend).
class MemoryStore : public Store {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  std::string Describe() const override { return "memory store"; }

  // In-process objects shared by the ranks (threads) that use this store,
  // e.g. the local backend's mailboxes: the first caller creates it.
  std::shared_ptr<void> GetOrCreateObject(const std::string& key,
                                          const std::function<std::shared_ptr<void>()>& make);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;
  std::map<std::string, std::shared_ptr<void>> objects_;
};

}  // namespace loom::comm

#endif  // LOOM_COMM_STORE_MEMORY_STORE_H_
