#ifndef LOOM_COMM_STORE_FILE_STORE_H_
#define LOOM_COMM_STORE_FILE_STORE_H_

#include <string>

#include "absl/status/statusor.h"
#include "comm/store/store.h"

namespace loom::comm {

// A store in a directory on a shared file system: one file per key, written
// atomically (write + rename); Add holds an flock on `<dir>/.lock`.
class FileStore : public Store {
 public:
  // Creates `dir` if needed; the error names the directory and the reason.
  static absl::StatusOr<std::unique_ptr<FileStore>> Open(const std::string& dir);

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  std::string Describe() const override { return "file store " + dir_; }

 private:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {}
  std::string PathOf(const std::string& key) const;
  absl::Status WriteAtomic(const std::string& key, const std::string& value);
  absl::StatusOr<std::string> ReadIfExists(const std::string& key, bool* exists) const;
  std::string dir_;
};

}  // namespace loom::comm

#endif  // LOOM_COMM_STORE_FILE_STORE_H_
