#include "checkpoint/reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/file_util.h"
#include "core/status_macros.h"

namespace loom::checkpoint {

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    const std::string& iter_dir) {
  if (!IsDirectory(iter_dir)) {
    return absl::NotFoundError(absl::StrCat("checkpoint folder ", iter_dir, " does not exist"));
  }
  const std::string manifest_path = JoinPath(iter_dir, kManifestFile);
  if (!PathExists(manifest_path)) {
    return absl::DataLossError(absl::StrCat("checkpoint ", iter_dir, " has no ", kManifestFile,
                                            " (an incomplete save?)"));
  }
  LOOM_ASSIGN_OR_RETURN(std::string bytes, ReadFile(manifest_path));
  std::unique_ptr<CheckpointReader> r(new CheckpointReader());
  r->path_ = iter_dir;
  LOOM_ASSIGN_OR_RETURN(r->manifest_, DecodeManifest(bytes, manifest_path));
  for (int i = 0; i < r->manifest_.tensors_size(); ++i) {
    const TensorInfo& t = r->manifest_.tensors(i);
    r->index_[{t.name(), t.state()}] = i;
    for (const Slice& s : t.slices()) {
      if (s.file() < 0 || s.file() >= r->manifest_.files_size()) {
        return absl::DataLossError(absl::StrCat("manifest ", manifest_path, ": tensor ", t.name(),
                                                " names shard file #", s.file(), " of ",
                                                r->manifest_.files_size()));
      }
    }
  }
  for (const ShardFile& f : r->manifest_.files()) {
    const std::string path = JoinPath(iter_dir, f.name());
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      return absl::DataLossError(
          absl::StrCat("shard file ", path, " is missing (the manifest lists it)"));
    }
    if (static_cast<uint64_t>(st.st_size) != f.size_bytes()) {
      return absl::DataLossError(absl::StrCat("shard file ", path, " is truncated or resized: ",
                                              st.st_size, " bytes, the manifest says ",
                                              f.size_bytes()));
    }
  }
  return r;
}

CheckpointReader::~CheckpointReader() {
  for (auto& [i, m] : mapped_) {
    if (m.data != nullptr && m.size > 0) ::munmap(const_cast<char*>(m.data), m.size);
  }
}

const TensorInfo* CheckpointReader::Find(const std::string& name, State state) const {
  auto it = index_.find({name, state});
  return it == index_.end() ? nullptr : &manifest_.tensors(it->second);
}

absl::StatusOr<const char*> CheckpointReader::File(int index) {
  absl::MutexLock lock(&mu_);
  auto it = mapped_.find(index);
  if (it != mapped_.end()) return it->second.data;
  const ShardFile& f = manifest_.files(index);
  const std::string path = JoinPath(path_, f.name());
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return ErrnoError("cannot open shard file", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    absl::Status s = ErrnoError("cannot stat shard file", path);
    ::close(fd);
    return s;
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size != f.size_bytes() || size < static_cast<size_t>(kShardHeaderBytes)) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat("shard file ", path, " is truncated or resized: ",
                                            size, " bytes, the manifest says ", f.size_bytes()));
  }
  void* data = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (data == MAP_FAILED) return ErrnoError("cannot map shard file", path);
  ::madvise(data, size, MADV_SEQUENTIAL);
  const char* bytes = static_cast<const char*>(data);
  const uint32_t crc = Crc32c(bytes, size);
  if (crc != f.crc32c() || std::memcmp(bytes, kShardMagic, 8) != 0) {
    ::munmap(data, size);
    return absl::DataLossError(absl::StrCat(
        "checksum mismatch in shard file ", path, ": CRC32C ", crc, ", the manifest says ",
        f.crc32c(), " (the file is damaged; restore it or load an earlier checkpoint)"));
  }
  mapped_[index] = Mapped{bytes, size};
  return bytes;
}

absl::Status CheckpointReader::Read(const std::string& name, State state, const Region& region,
                                    float* out) {
  const TensorInfo* t = Find(name, state);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", path_, " has no tensor ", name, " (",
                                            StateName(state), ")"));
  }
  std::vector<int64_t> shape(t->global_shape().begin(), t->global_shape().end());
  int64_t rows, cols;
  MatrixDims(shape, &rows, &cols);
  if (!RegionInside(region, rows, cols)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", name, ": requested rows [", region.row_start, ", +", region.num_rows,
        ") cols [", region.col_start, ", +", region.num_cols, ") lie outside its global shape [",
        absl::StrJoin(shape, ", "), "] in checkpoint ", path_));
  }
  int64_t copied = 0;
  for (const Slice& s : t->slices()) {
    const Region src = RegionOf(s);
    if (!RegionInside(src, rows, cols)) {
      return absl::DataLossError(absl::StrCat("manifest of ", path_, ": a slice of tensor ", name,
                                              " lies outside its global shape"));
    }
    // Skip files whose rectangles do not touch the request.
    if (src.row_start >= region.row_start + region.num_rows ||
        region.row_start >= src.row_start + src.num_rows ||
        src.col_start >= region.col_start + region.num_cols ||
        region.col_start >= src.col_start + src.num_cols || src.numel() == 0) {
      continue;
    }
    const ShardFile& f = manifest_.files(s.file());
    if (s.offset() + static_cast<uint64_t>(src.numel()) * sizeof(float) > f.size_bytes()) {
      return absl::DataLossError(absl::StrCat("manifest of ", path_, ": a slice of tensor ", name,
                                              " runs past the end of ", f.name()));
    }
    LOOM_ASSIGN_OR_RETURN(const char* bytes, File(s.file()));
    copied += CopyOverlap(src, reinterpret_cast<const float*>(bytes + s.offset()), region, out);
  }
  if (copied != region.numel()) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path_, ": tensor ", name, " (",
                                            StateName(state), ") covers ", copied, " of the ",
                                            region.numel(), " requested elements"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> CheckpointReader::ReadGlobal(const std::string& name,
                                                                State state) {
  const TensorInfo* t = Find(name, state);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", path_, " has no tensor ", name, " (",
                                            StateName(state), ")"));
  }
  std::vector<int64_t> shape(t->global_shape().begin(), t->global_shape().end());
  int64_t rows, cols;
  MatrixDims(shape, &rows, &cols);
  std::vector<float> out(static_cast<size_t>(rows * cols));
  LOOM_RETURN_IF_ERROR(Read(name, state, Region::Rect(0, rows, 0, cols), out.data()));
  return out;
}

absl::Status CheckpointReader::VerifyAll() {
  for (int i = 0; i < manifest_.files_size(); ++i) LOOM_RETURN_IF_ERROR(File(i).status());
  for (const TensorInfo& t : manifest_.tensors()) {
    std::vector<int64_t> shape(t.global_shape().begin(), t.global_shape().end());
    int64_t rows, cols;
    MatrixDims(shape, &rows, &cols);
    int64_t held = 0;
    for (const Slice& s : t.slices()) held += RegionOf(s).numel();
    if (held != rows * cols) {
      return absl::DataLossError(absl::StrCat("checkpoint ", path_, ": tensor ", t.name(), " (",
                                              StateName(t.state()), ") has ", held, " of ",
                                              rows * cols, " elements in its slices"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ResolveCheckpoint(const std::string& dir,
                                              std::optional<int64_t> iteration) {
  if (!IsDirectory(dir)) {
    return absl::NotFoundError(
        absl::StrCat("--load=", dir, ": no such folder (nothing to resume from)"));
  }
  if (iteration.has_value()) {
    const std::string path = JoinPath(dir, IterDirName(*iteration));
    if (!IsDirectory(path)) {
      const std::string earlier = NewestCompleteBefore(dir, *iteration + 1);
      return absl::NotFoundError(absl::StrCat(
          "--load-iteration=", *iteration, ": ", path, " does not exist",
          earlier.empty() ? std::string(" (no complete checkpoint in the folder)")
                          : absl::StrCat(" (newest complete one at or before it: ", earlier, ")")));
    }
    return path;
  }
  const std::string latest = JoinPath(dir, kLatestFile);
  if (!PathExists(latest)) {
    const std::string earlier = NewestCompleteBefore(dir, INT64_MAX);
    return absl::NotFoundError(absl::StrCat(
        "--load=", dir, ": no `latest` file, so no complete checkpoint to resume from",
        earlier.empty() ? std::string()
                        : absl::StrCat(" (found ", earlier, ": use --load-iteration)")));
  }
  LOOM_ASSIGN_OR_RETURN(std::string name, ReadFile(latest));
  name = std::string(absl::StripAsciiWhitespace(name));
  const std::optional<int64_t> it = ParseIterDirName(name);
  if (!it.has_value()) {
    return absl::DataLossError(
        absl::StrCat(latest, " holds \"", name, "\", expected a name like iter_0000100"));
  }
  const std::string path = JoinPath(dir, name);
  if (!IsDirectory(path)) {
    return WithEarlierCheckpointHint(
        absl::DataLossError(absl::StrCat(latest, " names ", path, ", which does not exist")), dir,
        *it);
  }
  return path;
}

std::string NewestCompleteBefore(const std::string& dir, int64_t before) {
  auto names = ListDir(dir);
  if (!names.ok()) return "";
  for (auto n = names->rbegin(); n != names->rend(); ++n) {
    const std::optional<int64_t> it = ParseIterDirName(*n);
    if (!it.has_value() || *it >= before) continue;
    auto reader = CheckpointReader::Open(JoinPath(dir, *n));
    if (reader.ok() && (*reader)->VerifyAll().ok()) return JoinPath(dir, *n);
  }
  return "";
}

absl::Status WithEarlierCheckpointHint(const absl::Status& error, const std::string& dir,
                                       int64_t iteration) {
  const std::string earlier = NewestCompleteBefore(dir, iteration);
  std::string hint;
  if (earlier.empty()) {
    hint = "; no earlier complete checkpoint exists in " + dir;
  } else {
    const std::optional<int64_t> it = ParseIterDirName(earlier.substr(earlier.rfind('/') + 1));
    hint = absl::StrCat("; the newest earlier complete checkpoint is ", earlier,
                        " (resume from it with --load-iteration=", it.value_or(-1), ")");
  }
  return absl::Status(error.code(), absl::StrCat(error.message(), hint));
}

}  // namespace loom::checkpoint
