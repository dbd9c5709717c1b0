#include "checkpoint/reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/file_util.h"
#include "core/status_macros.h"

namespace loom::checkpoint {

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    const std::string& iter_dir, const ReaderOptions& options) {
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
  r->threads_ = options.read_threads > 0
                    ? options.read_threads
                    : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
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

absl::StatusOr<const TensorInfo*> CheckpointReader::Check(const std::string& name, State state,
                                                          const Region& region, int64_t* rows,
                                                          int64_t* cols) {
  const TensorInfo* t = Find(name, state);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", path_, " has no tensor ", name, " (",
                                            StateName(state), ")"));
  }
  std::vector<int64_t> shape(t->global_shape().begin(), t->global_shape().end());
  MatrixDims(shape, rows, cols);
  if (!RegionInside(region, *rows, *cols)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", name, ": requested rows [", region.row_start, ", +", region.num_rows,
        ") cols [", region.col_start, ", +", region.num_cols, ") lie outside its global shape [",
        absl::StrJoin(shape, ", "), "] in checkpoint ", path_));
  }
  return t;
}

namespace {

// The slices of `t` that `region` touches, checked against the manifest.
template <typename Fn>
absl::Status ForEachTouchedSlice(const TensorInfo& t, const Manifest& manifest,
                                 const std::string& path, const Region& region, int64_t rows,
                                 int64_t cols, Fn fn) {
  for (const Slice& s : t.slices()) {
    const Region src = RegionOf(s);
    if (!RegionInside(src, rows, cols)) {
      return absl::DataLossError(absl::StrCat("manifest of ", path, ": a slice of tensor ",
                                              t.name(), " lies outside its global shape"));
    }
    // Skip files whose rectangles do not touch the request.
    if (src.row_start >= region.row_start + region.num_rows ||
        region.row_start >= src.row_start + src.num_rows ||
        src.col_start >= region.col_start + region.num_cols ||
        region.col_start >= src.col_start + src.num_cols || src.numel() == 0) {
      continue;
    }
    const ShardFile& f = manifest.files(s.file());
    if (s.offset() + static_cast<uint64_t>(src.numel()) * sizeof(float) > f.size_bytes()) {
      return absl::DataLossError(absl::StrCat("manifest of ", path, ": a slice of tensor ",
                                              t.name(), " runs past the end of ", f.name()));
    }
    LOOM_RETURN_IF_ERROR(fn(s, src));
  }
  return absl::OkStatus();
}

absl::Status CoverageError(const std::string& path, const std::string& name, State state,
                           int64_t copied, int64_t wanted) {
  return absl::DataLossError(absl::StrCat("checkpoint ", path, ": tensor ", name, " (",
                                          StateName(state), ") covers ", copied, " of the ",
                                          wanted, " requested elements"));
}

// When the elements both regions hold form one contiguous run in each (same
// rectangle, or both spanning whole rows), that run: [*src_at, +*n) of the
// slice's values goes to [*dst_at, +*n) of the request. False otherwise.
bool LinearOverlap(const Region& s, const Region& d, int64_t cols, int64_t* src_at,
                   int64_t* dst_at, int64_t* n) {
  int64_t s0, d0;  // the linear index of each region's flat element 0
  if (s.row_start == d.row_start && s.num_rows == d.num_rows && s.col_start == d.col_start &&
      s.num_cols == d.num_cols) {
    s0 = d0 = 0;
  } else if (s.col_start == 0 && d.col_start == 0 && s.num_cols == cols && d.num_cols == cols) {
    s0 = s.row_start * cols;
    d0 = d.row_start * cols;
  } else {
    return false;
  }
  const int64_t lo = std::max(s0 + s.flat_begin, d0 + d.flat_begin);
  const int64_t hi = std::min(s0 + s.flat_end, d0 + d.flat_end);
  *n = std::max<int64_t>(0, hi - lo);
  *src_at = lo - s0 - s.flat_begin;
  *dst_at = lo - d0 - d.flat_begin;
  return true;
}

constexpr size_t kChunk = 4 << 20;  // pread + CRC unit (stays in the L2/L3 cache)
constexpr uint64_t kItem = 32 << 20;  // the unit of work a thread takes

// One piece of a file pass: bytes [offset, +size) of the file go to dst.
struct Segment {
  uint64_t offset = 0, size = 0;
  char* dst = nullptr;
};

// Bytes [begin, end) of shard file `file`, read in file order: `segs` (sorted,
// inside the range) straight to their destinations, the rest only for the
// checksum. Filled in by the pass: the range's CRC32C, the file's first 8
// bytes (the range that starts at 0), the outcome.
struct FilePass {
  int file = 0;
  uint64_t begin = 0, end = 0;
  const Segment* segs = nullptr;
  size_t nsegs = 0;
  uint32_t crc = 0;
  char head[8] = {};
  absl::Status status;
};

// Reads bytes [begin, end) of `path` in file order: segments (sorted, not
// overlapping, inside [begin, end)) straight to their destinations, the gaps
// into `scratch`; returns the CRC32C of the bytes and copies the first
// min(8, ...) bytes of the file to `head` when begin == 0.
absl::Status PassRange(const std::string& path, uint64_t begin, uint64_t end,
                       const Segment* segs, size_t nsegs, std::vector<char>* scratch,
                       uint32_t* crc_out, char* head) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return ErrnoError("cannot open shard file", path);
  ::posix_fadvise(fd, static_cast<off_t>(begin), static_cast<off_t>(end - begin),
                  POSIX_FADV_SEQUENTIAL);
  uint32_t crc = 0;
  uint64_t at = begin;
  size_t next = 0;
  absl::Status status;
  while (at < end && status.ok()) {
    char* dst;
    uint64_t n;
    if (next < nsegs && segs[next].offset <= at) {
      const Segment& sg = segs[next];
      dst = sg.dst + (at - sg.offset);
      n = std::min<uint64_t>(sg.offset + sg.size - at, kChunk);
      if (at + n == sg.offset + sg.size) ++next;
    } else {
      const uint64_t stop = next < nsegs ? segs[next].offset : end;
      n = std::min<uint64_t>(stop - at, kChunk);
      if (scratch->size() < n) scratch->resize(kChunk);
      dst = scratch->data();
    }
    uint64_t done = 0;
    while (done < n) {
      const ssize_t r = ::pread(fd, dst + done, n - done, static_cast<off_t>(at + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        status = ErrnoError("cannot read shard file", path);
        break;
      }
      if (r == 0) {
        status = absl::DataLossError(
            absl::StrCat("shard file ", path, " is shorter than the manifest says"));
        break;
      }
      done += static_cast<uint64_t>(r);
    }
    if (!status.ok()) break;
    crc = Crc32cExtend(crc, dst, n);
    if (at < 8 && head != nullptr) std::memcpy(head + at, dst, std::min<uint64_t>(8 - at, n));
    at += n;
  }
  ::close(fd);
  *crc_out = crc;
  return status;
}

// Every file of `direct` (its segments sorted, not overlapping) as passes of
// at most kItem bytes, so that threads share a large file; a segment that
// crosses a boundary is split in two. The passes point into `direct`, which
// must not change while they are used.
std::vector<FilePass> SplitIntoPasses(const Manifest& manifest,
                                      std::map<int, std::vector<Segment>>& direct) {
  std::vector<FilePass> passes;
  for (auto& [file, segs] : direct) {
    const uint64_t size = manifest.files(file).size_bytes();
    const uint64_t parts = std::max<uint64_t>(1, (size + kItem - 1) / kItem);
    uint64_t begin = 0;
    size_t first = 0;
    for (uint64_t p = 0; p < parts; ++p) {
      const uint64_t end = p + 1 == parts ? size : (p + 1) * kItem;
      size_t last = first;
      while (last < segs.size() && segs[last].offset < end) ++last;
      if (last > first && segs[last - 1].offset + segs[last - 1].size > end) {
        const Segment sg = segs[last - 1];
        segs[last - 1].size = end - sg.offset;
        segs.insert(segs.begin() + last,
                    Segment{end, sg.offset + sg.size - end, sg.dst + (end - sg.offset)});
      }
      FilePass pass;
      pass.file = file;
      pass.begin = begin;
      pass.end = end;
      pass.nsegs = last - first;
      passes.push_back(std::move(pass));
      begin = end;
      first = last;
    }
  }
  // The segment vectors are final now: point the passes at them.
  size_t w = 0;
  for (auto& [file, segs] : direct) {
    size_t first = 0;
    for (; w < passes.size() && passes[w].file == file; ++w) {
      passes[w].segs = segs.data() + first;
      first += passes[w].nsegs;
    }
  }
  return passes;
}

// Runs the passes on up to `threads` threads (the calling one among them),
// each taking the next pass in turn (a thread the machine preempts just
// takes fewer).
void RunPasses(const std::string& dir, const Manifest& manifest, std::vector<FilePass>& passes,
               int threads) {
  std::atomic<size_t> next{0};
  auto worker = [&]() {
    std::vector<char> scratch;
    for (size_t w; (w = next.fetch_add(1)) < passes.size();) {
      FilePass& k = passes[w];
      const std::string path = JoinPath(dir, manifest.files(k.file).name());
      k.status = PassRange(path, k.begin, k.end, k.segs, k.nsegs, &scratch, &k.crc,
                           k.begin == 0 ? k.head : nullptr);
    }
  };
  const int n = std::min<int>(std::max(threads, 1), static_cast<int>(passes.size()));
  std::vector<std::thread> pool;
  for (int i = 1; i < n; ++i) pool.emplace_back(worker);
  worker();
  for (std::thread& th : pool) th.join();
}

// Each file's size, magic and CRC32C (combined over its passes), before
// anything read from it is trusted.
absl::Status VerifyPasses(const std::string& dir, const Manifest& manifest,
                          const std::vector<FilePass>& passes) {
  for (size_t w = 0; w < passes.size();) {
    const int file = passes[w].file;
    const ShardFile& f = manifest.files(file);
    const std::string path = JoinPath(dir, f.name());
    uint32_t crc = 0;
    const char* head = passes[w].head;
    for (; w < passes.size() && passes[w].file == file; ++w) {
      LOOM_RETURN_IF_ERROR(passes[w].status);
      crc = Crc32cCombine(crc, passes[w].crc, passes[w].end - passes[w].begin);
    }
    struct stat st;
    if (::stat(path.c_str(), &st) != 0 || static_cast<uint64_t>(st.st_size) != f.size_bytes() ||
        f.size_bytes() < static_cast<uint64_t>(kShardHeaderBytes)) {
      return absl::DataLossError(absl::StrCat("shard file ", path, " is truncated or resized: ",
                                              st.st_size, " bytes, the manifest says ",
                                              f.size_bytes()));
    }
    if (crc != f.crc32c() || std::memcmp(head, kShardMagic, 8) != 0) {
      return absl::DataLossError(absl::StrCat(
          "checksum mismatch in shard file ", path, ": CRC32C ", crc, ", the manifest says ",
          f.crc32c(), " (the file is damaged; restore it or load an earlier checkpoint)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

// How ReadMany gets the requests' elements: `direct` segments per file (read
// by the file passes), and copies from the verified mapping afterwards
// (`deferred`: resharded rectangles; `mapped_copies`: runs that overlap a
// direct one). `copied[i]`: elements of request i accounted for.
struct CheckpointReader::ReadPlan {
  struct Deferred {
    size_t request;
    const Slice* slice;
    Region src;
  };
  struct MappedCopy {
    int file;
    Segment seg;
  };
  std::map<int, std::vector<Segment>> direct;
  std::vector<Deferred> deferred;
  std::vector<MappedCopy> mapped_copies;
  std::vector<int64_t> copied;
};

absl::Status CheckpointReader::Read(const std::string& name, State state, const Region& region,
                                    float* out) {
  int64_t rows, cols;
  LOOM_ASSIGN_OR_RETURN(const TensorInfo* t, Check(name, state, region, &rows, &cols));
  int64_t copied = 0;
  LOOM_RETURN_IF_ERROR(ForEachTouchedSlice(
      *t, manifest_, path_, region, rows, cols, [&](const Slice& s, const Region& src) {
        LOOM_ASSIGN_OR_RETURN(const char* bytes, File(s.file()));
        copied +=
            CopyOverlap(src, reinterpret_cast<const float*>(bytes + s.offset()), region, out);
        return absl::OkStatus();
      }));
  if (copied != region.numel()) return CoverageError(path_, name, state, copied, region.numel());
  return absl::OkStatus();
}

absl::Status CheckpointReader::ReadMany(const std::vector<Request>& requests) {
  LOOM_ASSIGN_OR_RETURN(ReadPlan plan, Plan(requests));
  std::vector<FilePass> passes = SplitIntoPasses(manifest_, plan.direct);
  RunPasses(path_, manifest_, passes, threads_);
  LOOM_RETURN_IF_ERROR(VerifyPasses(path_, manifest_, passes));
  return CopyTheRest(requests, plan);
}

absl::StatusOr<CheckpointReader::ReadPlan> CheckpointReader::Plan(
    const std::vector<Request>& requests) {
  ReadPlan plan;
  plan.copied.assign(requests.size(), 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    const Request& q = requests[i];
    int64_t rows, cols;
    LOOM_ASSIGN_OR_RETURN(const TensorInfo* t, Check(q.name, q.state, q.region, &rows, &cols));
    LOOM_RETURN_IF_ERROR(ForEachTouchedSlice(
        *t, manifest_, path_, q.region, rows, cols, [&](const Slice& s, const Region& src) {
          int64_t src_at, dst_at, n;
          if (LinearOverlap(src, q.region, cols, &src_at, &dst_at, &n)) {
            if (n > 0) {
              plan.direct[s.file()].push_back(
                  Segment{s.offset() + static_cast<uint64_t>(src_at) * sizeof(float),
                          static_cast<uint64_t>(n) * sizeof(float),
                          reinterpret_cast<char*>(q.out + dst_at)});
              plan.copied[i] += n;
            }
          } else {
            plan.deferred.push_back(ReadPlan::Deferred{i, &s, src});
          }
          return absl::OkStatus();
        }));
  }
  // Overlapping runs (never written so by the writer): all but the first of
  // an overlap are copied from the verified mapping afterwards.
  for (auto& [file, segs] : plan.direct) {
    std::sort(segs.begin(), segs.end(),
              [](const Segment& a, const Segment& b) { return a.offset < b.offset; });
    std::vector<Segment> kept;
    uint64_t covered = 0;
    for (const Segment& sg : segs) {
      if (sg.offset < covered) {
        plan.mapped_copies.push_back(ReadPlan::MappedCopy{file, sg});
        continue;
      }
      kept.push_back(sg);
      covered = sg.offset + sg.size;
    }
    segs = std::move(kept);
  }
  return plan;
}

absl::Status CheckpointReader::CopyTheRest(const std::vector<Request>& requests,
                                           ReadPlan& plan) {
  for (const ReadPlan::MappedCopy& m : plan.mapped_copies) {
    LOOM_ASSIGN_OR_RETURN(const char* bytes, File(m.file));
    std::memcpy(m.seg.dst, bytes + m.seg.offset, m.seg.size);
  }
  for (const ReadPlan::Deferred& d : plan.deferred) {
    const Request& q = requests[d.request];
    LOOM_ASSIGN_OR_RETURN(const char* bytes, File(d.slice->file()));
    plan.copied[d.request] += CopyOverlap(
        d.src, reinterpret_cast<const float*>(bytes + d.slice->offset()), q.region, q.out);
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    if (plan.copied[i] != requests[i].region.numel()) {
      return CoverageError(path_, requests[i].name, requests[i].state, plan.copied[i],
                           requests[i].region.numel());
    }
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
