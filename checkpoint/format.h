#ifndef LOOM_CHECKPOINT_FORMAT_H_
#define LOOM_CHECKPOINT_FORMAT_H_

// The on-disk format of a checkpoint folder DIR:
//   DIR/latest                      "iter_0000100\n": the newest complete checkpoint
//   DIR/iter_0000100/manifest.pb    kManifestMagic, u32 crc32c, u32 0, u64 n, n bytes of
//                                   a serialized Manifest (checkpoint.proto)
//   DIR/iter_0000100/manifest.txt   the same in text format (for people; never read)
//   DIR/iter_0000100/shard_00003_of_00008.bin
//                                   kShardMagic (8 bytes), u32 format version, u32 global
//                                   rank, 48 zero bytes, then f32 slices at the offsets
//                                   the manifest gives; crc32c of the whole file in the
//                                   manifest
//   DIR/iter_0000100.tmp/           a save in progress (never read; removed by the next save)

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/checkpoint.pb.h"

namespace loom::checkpoint {

constexpr uint32_t kFormatVersion = 1;
constexpr char kManifestMagic[8] = {'L', 'O', 'O', 'M', 'M', 'A', 'N', 'I'};
constexpr char kShardMagic[8] = {'L', 'O', 'O', 'M', 'S', 'H', 'R', 'D'};
constexpr int64_t kShardHeaderBytes = 64;
constexpr char kManifestFile[] = "manifest.pb";
constexpr char kManifestTextFile[] = "manifest.txt";
constexpr char kLatestFile[] = "latest";

std::string IterDirName(int64_t iteration);  // "iter_0000100"
// The iteration of "iter_0000100" (nullopt for anything else, e.g. "iter_0000100.tmp").
std::optional<int64_t> ParseIterDirName(const std::string& name);
std::string ShardFileName(int global_rank, int world_size);  // "shard_00003_of_00008.bin"
std::string StateName(State state);                          // "param", "exp_avg", ...

// A piece of a global tensor viewed as a matrix [rows, cols] (1-D: [n, 1]):
// the rectangle rows [row_start, +num_rows) x cols [col_start, +num_cols),
// restricted to the row-major flat range [flat_begin, flat_end) inside it.
struct Region {
  int64_t row_start = 0, num_rows = 0, col_start = 0, num_cols = 0;
  int64_t flat_begin = 0, flat_end = 0;
  int64_t numel() const { return flat_end - flat_begin; }
  // The whole rectangle.
  static Region Rect(int64_t row_start, int64_t num_rows, int64_t col_start, int64_t num_cols) {
    return Region{row_start, num_rows, col_start, num_cols, 0, num_rows * num_cols};
  }
};
Region RegionOf(const Slice& s);
void SetRegion(const Region& r, Slice* s);
// rows/cols of the matrix view of a global shape.
void MatrixDims(const std::vector<int64_t>& global_shape, int64_t* rows, int64_t* cols);
// Checks that `r` is well formed and inside a [rows, cols] matrix.
bool RegionInside(const Region& r, int64_t rows, int64_t cols);

// Copies the elements both regions hold from src (stored contiguously for
// `src`) to dst (contiguous for `dst`). Returns how many were copied.
int64_t CopyOverlap(const Region& src, const float* src_data, const Region& dst, float* dst_data);

// Manifest file encoding (magic + crc + length + proto bytes) and decoding.
// Decode errors name `path`.
std::string EncodeManifest(const Manifest& m);
absl::StatusOr<Manifest> DecodeManifest(const std::string& bytes, const std::string& path);

}  // namespace loom::checkpoint

#endif  // LOOM_CHECKPOINT_FORMAT_H_
