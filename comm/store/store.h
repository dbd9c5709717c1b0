#ifndef LOOM_COMM_STORE_STORE_H_
#define LOOM_COMM_STORE_STORE_H_

// The rendezvous key-value store. Backends exchange addresses through it and
// never know which implementation they use (memory, file, TCP).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace loom::comm {

class Store {
 public:
  virtual ~Store() = default;
  // Sets (or overwrites) key.
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Waits until key exists (up to timeout), then returns its value.
  // DeadlineExceeded names the key and the store.
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
  // Atomically adds delta to the integer at key (missing: 0); returns the new value.
  virtual absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;
  // Waits until every key exists.
  virtual absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) = 0;
  // "memory", "file:/path", "tcp://host:port" (for error messages).
  virtual std::string Describe() const = 0;
};

// All `size` ranks call this with the same `name`: returns once every rank
// has arrived (a store-level barrier), or DeadlineExceeded listing the count.
absl::Status StoreBarrier(Store& store, const std::string& name, int size, absl::Duration timeout);

}  // namespace loom::comm

#endif  // LOOM_COMM_STORE_STORE_H_
