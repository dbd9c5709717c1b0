#include "checkpoint/format.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/crc32c.h"

namespace loom::checkpoint {

std::string IterDirName(int64_t iteration) { return absl::StrFormat("iter_%07d", iteration); }

std::optional<int64_t> ParseIterDirName(const std::string& name) {
  if (name.size() < 6 || name.compare(0, 5, "iter_") != 0) return std::nullopt;
  const std::string digits = name.substr(5);
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  int64_t v = 0;
  if (!absl::SimpleAtoi(digits, &v)) return std::nullopt;
  return v;
}

std::string ShardFileName(int global_rank, int world_size) {
  return absl::StrFormat("shard_%05d_of_%05d.bin", global_rank, world_size);
}

std::string StateName(State state) {
  switch (state) {
    case PARAM:
      return "param";
    case EXP_AVG:
      return "exp_avg";
    case EXP_AVG_SQ:
      return "exp_avg_sq";
    default:
      return "unknown";
  }
}

Region RegionOf(const Slice& s) {
  return Region{s.row_start(), s.num_rows(), s.col_start(), s.num_cols(), s.flat_begin(),
                s.flat_end()};
}

void SetRegion(const Region& r, Slice* s) {
  s->set_row_start(r.row_start);
  s->set_num_rows(r.num_rows);
  s->set_col_start(r.col_start);
  s->set_num_cols(r.num_cols);
  s->set_flat_begin(r.flat_begin);
  s->set_flat_end(r.flat_end);
}

void MatrixDims(const std::vector<int64_t>& shape, int64_t* rows, int64_t* cols) {
  *rows = shape.empty() ? 1 : shape[0];
  *cols = 1;
  for (size_t i = 1; i < shape.size(); ++i) *cols *= shape[i];
}

bool RegionInside(const Region& r, int64_t rows, int64_t cols) {
  // An empty region may start past the end: under TP a rank of a small
  // vocabulary can hold only padding rows, and reads nothing.
  return r.row_start >= 0 && r.num_rows >= 0 && r.col_start >= 0 && r.num_cols >= 0 &&
         (r.num_rows == 0 || r.row_start + r.num_rows <= rows) &&
         (r.num_cols == 0 || r.col_start + r.num_cols <= cols) &&
         r.flat_begin >= 0 && r.flat_begin <= r.flat_end &&
         r.flat_end <= r.num_rows * r.num_cols;
}

int64_t CopyOverlap(const Region& s, const float* src, const Region& d, float* dst) {
  if (s.numel() <= 0 || d.numel() <= 0 || s.num_cols <= 0 || d.num_cols <= 0) return 0;
  // Rows each region's flat range touches.
  const int64_t s_r0 = s.row_start + s.flat_begin / s.num_cols;
  const int64_t s_r1 = s.row_start + (s.flat_end + s.num_cols - 1) / s.num_cols;
  const int64_t d_r0 = d.row_start + d.flat_begin / d.num_cols;
  const int64_t d_r1 = d.row_start + (d.flat_end + d.num_cols - 1) / d.num_cols;
  const int64_t r0 = std::max(s_r0, d_r0), r1 = std::min(s_r1, d_r1);
  int64_t copied = 0;
  for (int64_t r = r0; r < r1; ++r) {
    // Columns of row r inside each rectangle and each flat range.
    const int64_t s_base = (r - s.row_start) * s.num_cols;  // flat index of (r, col_start)
    const int64_t d_base = (r - d.row_start) * d.num_cols;
    int64_t c0 = std::max(s.col_start, d.col_start);
    int64_t c1 = std::min(s.col_start + s.num_cols, d.col_start + d.num_cols);
    c0 = std::max(c0, s.col_start + (s.flat_begin - s_base));
    c1 = std::min(c1, s.col_start + (s.flat_end - s_base));
    c0 = std::max(c0, d.col_start + (d.flat_begin - d_base));
    c1 = std::min(c1, d.col_start + (d.flat_end - d_base));
    if (c0 >= c1) continue;
    const int64_t s_flat = s_base + (c0 - s.col_start) - s.flat_begin;
    const int64_t d_flat = d_base + (c0 - d.col_start) - d.flat_begin;
    std::memcpy(dst + d_flat, src + s_flat, static_cast<size_t>(c1 - c0) * sizeof(float));
    copied += c1 - c0;
  }
  return copied;
}

std::string EncodeManifest(const Manifest& m) {
  const std::string payload = m.SerializeAsString();
  const uint32_t crc = Crc32c(payload.data(), payload.size());
  const uint32_t zero = 0;
  const uint64_t n = payload.size();
  std::string out(kManifestMagic, 8);
  out.append(reinterpret_cast<const char*>(&crc), 4);
  out.append(reinterpret_cast<const char*>(&zero), 4);
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += payload;
  return out;
}

absl::StatusOr<Manifest> DecodeManifest(const std::string& bytes, const std::string& path) {
  if (bytes.size() < 24 || std::memcmp(bytes.data(), kManifestMagic, 8) != 0) {
    return absl::DataLossError(absl::StrCat(
        "manifest ", path, " is not a Loom checkpoint manifest (bad magic or truncated: ",
        bytes.size(), " bytes)"));
  }
  uint32_t crc;
  uint64_t n;
  std::memcpy(&crc, bytes.data() + 8, 4);
  std::memcpy(&n, bytes.data() + 16, 8);
  if (bytes.size() - 24 != n) {
    return absl::DataLossError(absl::StrCat("manifest ", path, " is truncated: ",
                                            bytes.size() - 24, " payload bytes, header says ", n));
  }
  if (Crc32c(bytes.data() + 24, n) != crc) {
    return absl::DataLossError(absl::StrCat("checksum mismatch in manifest ", path,
                                            " (the file is damaged)"));
  }
  Manifest m;
  if (!m.ParseFromArray(bytes.data() + 24, static_cast<int>(n))) {
    return absl::DataLossError(absl::StrCat("manifest ", path, " does not parse"));
  }
  if (m.format_version() != kFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "manifest ", path, " has format version ", m.format_version(),
        ", this build reads version ", kFormatVersion,
        " (written by a newer or older Loom? convert it with a matching //checkpoint:convert)"));
  }
  return m;
}

}  // namespace loom::checkpoint
