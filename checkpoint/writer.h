#ifndef LOOM_CHECKPOINT_WRITER_H_
#define LOOM_CHECKPOINT_WRITER_H_

// Writing a checkpoint, in three steps any driver (the collective
// Checkpointer, the offline converter) composes:
//   1. BeginCheckpoint: a fresh DIR/iter_N.tmp/ folder (once, before any rank writes);
//   2. WriteShardFile: each rank's slices into one file, fsynced, with its CRC32C;
//   3. CommitCheckpoint: the merged manifest, fsync, rename to DIR/iter_N, then
//      `latest` (atomically), then --keep-last pruning. A crash before the
//      rename of `latest` leaves the previous checkpoint current and intact.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/checkpoint.pb.h"
#include "checkpoint/format.h"

namespace loom::checkpoint {

// One slice of a global f32 tensor, as held in memory by the writer.
struct Piece {
  std::string name;                   // global: "layers.3.attention.qkv.weight"
  State state = PARAM;
  std::vector<int64_t> global_shape;  // unpadded
  Region region;
  const float* data = nullptr;        // region.numel() contiguous values
};

std::string TmpDirFor(const std::string& dir, int64_t iteration);    // DIR/iter_N.tmp
std::string FinalDirFor(const std::string& dir, int64_t iteration);  // DIR/iter_N

// Creates DIR (if needed) and an empty DIR/iter_N.tmp (removing a stale one
// left by a crash).
absl::Status BeginCheckpoint(const std::string& dir, int64_t iteration);

// Writes `pieces` to `path` (header, then the slices in order), fsyncs it and
// reports its size, CRC32C and slices (file index 0).
absl::StatusOr<ShardReport> WriteShardFile(const std::string& path, int global_rank,
                                           const std::vector<Piece>& pieces);

// Test only (train/fault_injection.h, LOOM_FAULT kind=save): when set,
// WriteShardFile calls `hook` once per shard file after its first half of
// pieces (or, with none, its header) is written to the file, before the
// rest, the fsync and the commit,
// so a fault injected there leaves a half-written shard in DIR/iter_N.tmp.
// nullptr (the default): no call. Process-wide.
using ShardWriteHook = void (*)(const std::string& path, int global_rank);
void SetShardWriteHookForTesting(ShardWriteHook hook);

// Fills manifest->files/tensors from every rank's report (in rank order).
// Errors on a tensor whose pieces disagree about its global shape.
absl::Status MergeReports(const std::vector<ShardReport>& reports, Manifest* manifest);

// Writes the manifest into DIR/iter_N.tmp, makes it durable, renames it to
// DIR/iter_N, points `latest` at it, then deletes all but the newest
// `keep_last` complete checkpoints (0: keep all) and stale .tmp folders.
absl::Status CommitCheckpoint(const std::string& dir, const Manifest& manifest, int keep_last);

}  // namespace loom::checkpoint

#endif  // LOOM_CHECKPOINT_WRITER_H_
