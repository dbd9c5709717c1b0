#ifndef LOOM_CHECKPOINT_FILE_UTIL_H_
#define LOOM_CHECKPOINT_FILE_UTIL_H_

// POSIX file helpers for durable writes. Every error names the path and the
// errno text.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom::checkpoint {

absl::Status ErrnoError(const std::string& what, const std::string& path);

bool PathExists(const std::string& path);
bool IsDirectory(const std::string& path);
// mkdir -p.
absl::Status MakeDirs(const std::string& path);
// rm -rf (no error if missing).
absl::Status RemoveTree(const std::string& path);
// fsync of a folder (makes renames and new entries in it durable).
absl::Status FsyncDir(const std::string& path);
// Writes `data` to `path` (truncating), fsyncs it. Not atomic by itself.
absl::Status WriteFileDurably(const std::string& path, const std::string& data);
// Writes path.tmp, fsyncs, renames over path, fsyncs the folder.
absl::Status WriteFileAtomically(const std::string& path, const std::string& data);
absl::StatusOr<std::string> ReadFile(const std::string& path);
// Names in a folder (not "." or ".."), sorted.
absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path);
std::string JoinPath(const std::string& a, const std::string& b);

}  // namespace loom::checkpoint

#endif  // LOOM_CHECKPOINT_FILE_UTIL_H_
