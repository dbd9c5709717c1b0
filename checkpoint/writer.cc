#include "checkpoint/writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/file_util.h"
#include "core/status_macros.h"
#include "google/protobuf/text_format.h"

namespace loom::checkpoint {
namespace {

// Buffered, checksummed writes to one fd: small pieces are gathered into a
// staging buffer, large ones go straight from the caller's memory in chunks,
// each checksummed just before it is written (so the write copies cache-hot
// bytes). Every kWriteback bytes, the kernel is asked to start writing the
// finished part to the device (sync_file_range, a hint: durability still
// comes from the fsync at the end), so the disk works while we copy.
class ChecksummedFile {
 public:
  ChecksummedFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {
    staging_.reserve(kStaging);
  }
  absl::Status Append(const void* data, size_t n) {
    if (n < kStaging / 4) {
      crc_ = Crc32cExtend(crc_, data, n);
      size_ += n;
      if (staging_.size() + n > kStaging) LOOM_RETURN_IF_ERROR(Flush());
      staging_.append(static_cast<const char*>(data), n);
      return absl::OkStatus();
    }
    LOOM_RETURN_IF_ERROR(Flush());
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const size_t k = std::min(n, kChunk);
      crc_ = Crc32cExtend(crc_, p, k);
      size_ += k;
      LOOM_RETURN_IF_ERROR(WriteAll(p, k));
      p += k;
      n -= k;
    }
    return absl::OkStatus();
  }
  absl::Status Flush() {
    absl::Status s = WriteAll(staging_.data(), staging_.size());
    staging_.clear();
    return s;
  }
  uint32_t crc() const { return crc_; }
  uint64_t size() const { return size_; }

 private:
  static constexpr size_t kStaging = 4 << 20;
  static constexpr size_t kChunk = 1 << 20;
  static constexpr uint64_t kWriteback = 32 << 20;
  absl::Status WriteAll(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, std::min<size_t>(n, 1 << 30));
      if (w < 0) {
        if (errno == EINTR) continue;
        return ErrnoError("cannot write", path_);
      }
      p += w;
      n -= static_cast<size_t>(w);
      written_ += static_cast<uint64_t>(w);
    }
#if defined(__linux__)
    if (written_ - flushed_ >= kWriteback) {
      ::sync_file_range(fd_, static_cast<off_t>(flushed_), static_cast<off_t>(written_ - flushed_),
                        SYNC_FILE_RANGE_WRITE);
      flushed_ = written_;
    }
#endif
    return absl::OkStatus();
  }
  int fd_;
  std::string path_;
  std::string staging_;
  uint32_t crc_ = 0;
  uint64_t size_ = 0;
  uint64_t written_ = 0, flushed_ = 0;
};

std::string Basename(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::atomic<ShardWriteHook> g_shard_write_hook{nullptr};  // SetShardWriteHookForTesting

}  // namespace

std::string TmpDirFor(const std::string& dir, int64_t iteration) {
  return JoinPath(dir, IterDirName(iteration) + ".tmp");
}
std::string FinalDirFor(const std::string& dir, int64_t iteration) {
  return JoinPath(dir, IterDirName(iteration));
}

absl::Status BeginCheckpoint(const std::string& dir, int64_t iteration) {
  LOOM_RETURN_IF_ERROR(MakeDirs(dir));
  const std::string tmp = TmpDirFor(dir, iteration);
  LOOM_RETURN_IF_ERROR(RemoveTree(tmp));
  return MakeDirs(tmp);
}

void SetShardWriteHookForTesting(ShardWriteHook hook) {
  g_shard_write_hook.store(hook, std::memory_order_release);
}

absl::StatusOr<ShardReport> WriteShardFile(const std::string& path, int global_rank,
                                           const std::vector<Piece>& pieces) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return ErrnoError("cannot create shard file", path);
  ChecksummedFile out(fd, path);
  ShardReport report;
  auto fail = [&](absl::Status s) {
    ::close(fd);
    return s;
  };
  char header[kShardHeaderBytes] = {};
  std::memcpy(header, kShardMagic, 8);
  const uint32_t version = kFormatVersion, rank = static_cast<uint32_t>(global_rank);
  std::memcpy(header + 8, &version, 4);
  std::memcpy(header + 12, &rank, 4);
  absl::Status s = out.Append(header, sizeof(header));
  if (!s.ok()) return fail(s);
  const ShardWriteHook hook = g_shard_write_hook.load(std::memory_order_acquire);
  auto halfway = [&]() {
    s = out.Flush();  // what was written so far is in the file when the hook runs
    if (s.ok()) hook(path, global_rank);
    return s;
  };
  if (hook != nullptr && pieces.empty() && !halfway().ok()) return fail(s);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    if (hook != nullptr && i == pieces.size() / 2 && !halfway().ok()) return fail(s);
    TensorInfo* t = report.add_tensors();
    t->set_name(p.name);
    t->set_state(p.state);
    t->set_dtype(F32);
    for (int64_t d : p.global_shape) t->add_global_shape(d);
    Slice* slice = t->add_slices();
    slice->set_file(0);
    slice->set_offset(out.size());
    SetRegion(p.region, slice);
    s = out.Append(p.data, static_cast<size_t>(p.region.numel()) * sizeof(float));
    if (!s.ok()) return fail(s);
  }
  s = out.Flush();
  if (!s.ok()) return fail(s);
  if (::fsync(fd) != 0) return fail(ErrnoError("cannot fsync shard file", path));
  if (::close(fd) != 0) return ErrnoError("cannot close shard file", path);
  ShardFile* f = report.mutable_file();
  f->set_name(Basename(path));
  f->set_global_rank(global_rank);
  f->set_size_bytes(out.size());
  f->set_crc32c(out.crc());
  return report;
}

absl::Status MergeReports(const std::vector<ShardReport>& reports, Manifest* manifest) {
  manifest->clear_files();
  manifest->clear_tensors();
  std::map<std::pair<std::string, int>, TensorInfo*> by_key;
  for (const ShardReport& r : reports) {
    const int file = manifest->files_size();
    *manifest->add_files() = r.file();
    for (const TensorInfo& t : r.tensors()) {
      TensorInfo*& merged = by_key[{t.name(), t.state()}];
      if (merged == nullptr) {
        merged = manifest->add_tensors();
        merged->set_name(t.name());
        merged->set_state(t.state());
        merged->set_dtype(t.dtype());
        *merged->mutable_global_shape() = t.global_shape();
      } else if (absl::StrJoin(merged->global_shape(), ",") !=
                 absl::StrJoin(t.global_shape(), ",")) {
        return absl::InternalError(absl::StrCat(
            "tensor ", t.name(), " (", StateName(t.state()), "): rank ",
            r.file().global_rank(), " says global shape [", absl::StrJoin(t.global_shape(), ","),
            "], an earlier rank [", absl::StrJoin(merged->global_shape(), ","), "]"));
      }
      for (const Slice& s : t.slices()) {
        Slice* out = merged->add_slices();
        *out = s;
        out->set_file(file);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CommitCheckpoint(const std::string& dir, const Manifest& manifest, int keep_last) {
  const int64_t iteration = manifest.training().iteration();
  const std::string tmp = TmpDirFor(dir, iteration), final_dir = FinalDirFor(dir, iteration);
  LOOM_RETURN_IF_ERROR(
      WriteFileDurably(JoinPath(tmp, kManifestFile), EncodeManifest(manifest)));
  std::string text;
  google::protobuf::TextFormat::PrintToString(manifest, &text);
  LOOM_RETURN_IF_ERROR(WriteFileDurably(JoinPath(tmp, kManifestTextFile), text));
  LOOM_RETURN_IF_ERROR(FsyncDir(tmp));
  // Saving an iteration that already exists (a resumed run): move the old one
  // aside first; `latest` still names a complete checkpoint if we crash here
  // only when it named another one, so never delete before the new one is in.
  const std::string old = final_dir + ".old";
  if (PathExists(final_dir)) {
    LOOM_RETURN_IF_ERROR(RemoveTree(old));
    if (::rename(final_dir.c_str(), old.c_str()) != 0) {
      return ErrnoError("cannot move aside the existing", final_dir);
    }
  }
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
    return ErrnoError(absl::StrCat("cannot rename ", tmp, " to"), final_dir);
  }
  LOOM_RETURN_IF_ERROR(FsyncDir(dir));
  LOOM_RETURN_IF_ERROR(
      WriteFileAtomically(JoinPath(dir, kLatestFile), IterDirName(iteration) + "\n"));
  LOOM_RETURN_IF_ERROR(RemoveTree(old));

  // Pruning, only now that the new checkpoint is complete and current.
  LOOM_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(dir));
  std::vector<std::pair<int64_t, std::string>> complete;
  for (const std::string& n : names) {
    if (auto it = ParseIterDirName(n)) {
      complete.push_back({*it, n});
    } else if (n.compare(0, 5, "iter_") == 0 && n.size() > 4 &&
               (n.compare(n.size() - 4, 4, ".tmp") == 0 ||
                n.compare(n.size() - 4, 4, ".del") == 0)) {
      LOOM_RETURN_IF_ERROR(RemoveTree(JoinPath(dir, n)));  // a crashed save's leftovers
    }
  }
  if (keep_last > 0 && static_cast<int>(complete.size()) > keep_last) {
    std::sort(complete.begin(), complete.end());
    for (size_t i = 0; i + keep_last < complete.size(); ++i) {
      if (complete[i].first == iteration) continue;
      // Renamed first, so a crash mid-delete never leaves a half-deleted
      // folder that looks like a complete checkpoint.
      const std::string victim = JoinPath(dir, complete[i].second);
      if (::rename(victim.c_str(), (victim + ".del").c_str()) != 0) {
        return ErrnoError("cannot rename for deletion", victim);
      }
      LOOM_RETURN_IF_ERROR(RemoveTree(victim + ".del"));
    }
  }
  return FsyncDir(dir);
}

}  // namespace loom::checkpoint
