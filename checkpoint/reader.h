#ifndef LOOM_CHECKPOINT_READER_H_
#define LOOM_CHECKPOINT_READER_H_

// Reading a checkpoint into any layout: a caller asks for a Region of a
// global tensor and gets it assembled from whichever shard files hold it.
// Every shard file is checked (size, header, CRC32C of the whole file) the
// first time it is touched; errors name the file.

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "checkpoint/checkpoint.pb.h"
#include "checkpoint/format.h"

namespace loom::checkpoint {

struct ReaderOptions {
  // Threads that read shard files in ReadMany; 0: one per hardware thread of
  // this machine (std::thread::hardware_concurrency). Never more than there
  // are 32 MiB ranges of files to read.
  int read_threads = 0;
};

class CheckpointReader {
 public:
  // Opens DIR/iter_N (a folder holding manifest.pb). Checks the manifest's
  // checksum and version and every shard file's presence and size.
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(
      const std::string& iter_dir, const ReaderOptions& options = {});
  ~CheckpointReader();

  const Manifest& manifest() const { return manifest_; }
  const std::string& path() const { return path_; }
  const TensorInfo* Find(const std::string& name, State state) const;

  // Copies `region` of tensor (name, state) into out (region.numel() floats).
  // Errors: unknown tensor, region outside the global shape, a damaged file,
  // elements no shard holds.
  absl::Status Read(const std::string& name, State state, const Region& region, float* out);
  // One Read() of a batch.
  struct Request {
    std::string name;
    State state = PARAM;
    Region region;
    float* out = nullptr;
  };
  // The same as Read() on each request, but fast: every shard file a request
  // maps onto linearly (same layout, or whole rows) is read once with pread
  // straight into the destinations, in chunks whose CRC32C is computed while
  // they are cache-hot, by ReaderOptions::read_threads threads taking 32 MiB
  // ranges in turn; the file's checksum is checked before this returns OK
  // (on an error the destinations hold unverified bytes and must not be
  // used). Other requests are copied from the verified files afterwards.
  absl::Status ReadMany(const std::vector<Request>& requests);
  // The whole global tensor, row-major.
  absl::StatusOr<std::vector<float>> ReadGlobal(const std::string& name, State state);
  // Checks every shard file's checksum and that every tensor is fully covered.
  absl::Status VerifyAll();

 private:
  struct Mapped {
    const char* data = nullptr;
    size_t size = 0;
  };
  struct ReadPlan;  // reader.cc
  CheckpointReader() = default;
  // Checks a request against the manifest (tensor known, region inside).
  absl::StatusOr<const TensorInfo*> Check(const std::string& name, State state,
                                          const Region& region, int64_t* rows, int64_t* cols);
  // Maps and verifies file `index` (once).
  absl::StatusOr<const char*> File(int index);
  // ReadMany's steps: which bytes go where (checked against the manifest),
  // then (after the file passes) the copies from the verified mapping.
  absl::StatusOr<ReadPlan> Plan(const std::vector<Request>& requests);
  absl::Status CopyTheRest(const std::vector<Request>& requests, ReadPlan& plan);

  std::string path_;
  int threads_ = 1;
  Manifest manifest_;
  std::map<std::pair<std::string, int>, int> index_;  // (name, state) -> tensor
  absl::Mutex mu_;
  std::map<int, Mapped> mapped_;
};

// The checkpoint folder `dir` resolves to: DIR/iter_N for `iteration`, else
// the one `latest` names. Errors: DIR missing, no `latest`, a `latest`
// naming a folder that does not exist.
absl::StatusOr<std::string> ResolveCheckpoint(const std::string& dir,
                                              std::optional<int64_t> iteration);

// The newest fully verified checkpoint in `dir` older than `before`, if any
// ("" if none): named in errors about a damaged `latest`.
std::string NewestCompleteBefore(const std::string& dir, int64_t before);

// Adds to a load error about checkpoint `iteration` in `dir` which earlier
// complete checkpoint exists (or that none does).
absl::Status WithEarlierCheckpointHint(const absl::Status& error, const std::string& dir,
                                       int64_t iteration);

}  // namespace loom::checkpoint

#endif  // LOOM_CHECKPOINT_READER_H_
