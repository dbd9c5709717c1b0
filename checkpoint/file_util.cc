#include "checkpoint/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace loom::checkpoint {

absl::Status ErrnoError(const std::string& what, const std::string& path) {
  const int e = errno;
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(e));
  if (e == ENOENT) return absl::NotFoundError(msg);
  if (e == ENOSPC) return absl::ResourceExhaustedError(absl::StrCat(msg, " (disk full?)"));
  return absl::InternalError(msg);
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (a.back() == '/') return a + b;
  return a + "/" + b;
}

absl::Status MakeDirs(const std::string& path) {
  if (path.empty() || IsDirectory(path)) return absl::OkStatus();
  const size_t slash = path.find_last_of('/');
  if (slash != std::string::npos && slash > 0) {
    absl::Status s = MakeDirs(path.substr(0, slash));
    if (!s.ok()) return s;
  }
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoError("cannot create folder", path);
  }
  return absl::OkStatus();
}

absl::Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoError("cannot stat", path);
  }
  if (S_ISDIR(st.st_mode)) {
    auto names = ListDir(path);
    if (!names.ok()) return names.status();
    for (const std::string& n : *names) {
      absl::Status s = RemoveTree(JoinPath(path, n));
      if (!s.ok()) return s;
    }
    if (::rmdir(path.c_str()) != 0 && errno != ENOENT) return ErrnoError("cannot remove", path);
  } else if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoError("cannot remove", path);
  }
  return absl::OkStatus();
}

absl::Status FsyncDir(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return ErrnoError("cannot open folder", path);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return ErrnoError("cannot fsync folder", path);
  return absl::OkStatus();
}

absl::Status WriteFileDurably(const std::string& path, const std::string& data) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return ErrnoError("cannot create", path);
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = ErrnoError("cannot write", path);
      ::close(fd);
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    absl::Status s = ErrnoError("cannot fsync", path);
    ::close(fd);
    return s;
  }
  if (::close(fd) != 0) return ErrnoError("cannot close", path);
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& data) {
  const std::string tmp = path + ".tmp";
  absl::Status s = WriteFileDurably(tmp, data);
  if (!s.ok()) return s;
  if (::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoError("cannot rename onto", path);
  const size_t slash = path.find_last_of('/');
  return FsyncDir(slash == std::string::npos ? "." : path.substr(0, std::max<size_t>(slash, 1)));
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return ErrnoError("cannot open", path);
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = ErrnoError("cannot read", path);
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) {
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return ErrnoError("cannot list folder", path);
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace loom::checkpoint
