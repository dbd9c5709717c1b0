#include "comm/store/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace loom::comm {

absl::StatusOr<std::unique_ptr<FileStore>> FileStore::Open(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("file store: empty directory name");
  // mkdir -p
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos == dir.size() || dir[pos] == '/') {
      std::string part = dir.substr(0, pos);
      if (mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
        return absl::FailedPreconditionError(absl::StrCat("file store: cannot create directory '",
                                                          part, "': ", std::strerror(errno)));
      }
    }
  }
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("file store: '", dir, "' is not a directory"));
  }
  return std::unique_ptr<FileStore>(new FileStore(dir));
}

std::string FileStore::PathOf(const std::string& key) const {
  std::string name;
  for (unsigned char ch : key) {
    if (std::isalnum(ch) || ch == '-' || ch == '_' || ch == '.') {
      name.push_back(static_cast<char>(ch));
    } else {
      name += absl::StrFormat("%%%02x", ch);
    }
  }
  return absl::StrCat(dir_, "/k_", name);
}

absl::Status FileStore::WriteAtomic(const std::string& key, const std::string& value) {
  static std::atomic<int> counter{0};
  std::string path = PathOf(key);
  std::string tmp = absl::StrCat(dir_, "/.tmp.", getpid(), ".", counter++);
  {
    std::ofstream f(tmp, std::ios::binary);
    f << value;
    if (!f) {
      return absl::UnavailableError(
          absl::StrCat("file store: cannot write '", tmp, "': ", std::strerror(errno)));
    }
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("file store: cannot rename '", tmp, "' to '", path,
                                               "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FileStore::ReadIfExists(const std::string& key, bool* exists) const {
  std::ifstream f(PathOf(key), std::ios::binary);
  *exists = static_cast<bool>(f);
  if (!*exists) return std::string();
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

absl::Status FileStore::Set(const std::string& key, const std::string& value) {
  return WriteAtomic(key, value);
}

absl::StatusOr<std::string> FileStore::Get(const std::string& key, absl::Duration timeout) {
  absl::Status s = Wait({key}, timeout);
  if (!s.ok()) return s;
  bool exists;
  return ReadIfExists(key, &exists);
}

absl::StatusOr<int64_t> FileStore::Add(const std::string& key, int64_t delta) {
  std::string lock_path = dir_ + "/.lock";
  int fd = open(lock_path.c_str(), O_CREAT | O_RDWR, 0644);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("file store: cannot open '", lock_path, "': ", std::strerror(errno)));
  }
  flock(fd, LOCK_EX);
  bool exists;
  absl::StatusOr<std::string> cur = ReadIfExists(key, &exists);
  int64_t v = 0;
  absl::Status s;
  if (exists && !absl::SimpleAtoi(*cur, &v)) {
    s = absl::InvalidArgumentError(
        absl::StrCat("file store: Add on key '", key, "' whose value is not an integer"));
  } else {
    v += delta;
    s = WriteAtomic(key, absl::StrCat(v));
  }
  flock(fd, LOCK_UN);
  close(fd);
  if (!s.ok()) return s;
  return v;
}

absl::Status FileStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  absl::Duration nap = absl::Milliseconds(1);
  for (;;) {
    std::vector<std::string> missing;
    for (const auto& k : keys) {
      if (access(PathOf(k).c_str(), F_OK) != 0) missing.push_back(k);
    }
    if (missing.empty()) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(Describe(), ": keys [",
                                                      absl::StrJoin(missing, ", "),
                                                      "] not set within ",
                                                      absl::FormatDuration(timeout)));
    }
    absl::SleepFor(nap);
    nap = std::min(nap * 2, absl::Milliseconds(50));
  }
}

}  // namespace loom::comm
