#include "train/tensorboard/record.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/file_util.h"
#include "core/status_macros.h"

namespace loom::tensorboard {
namespace {

// TFRecord's integers are little endian; so is every machine Loom builds for.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "TFRecord framing assumes little endian");

template <typename T>
void Append(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

template <typename T>
T Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

}  // namespace

uint32_t MaskedCrc32c(std::string_view data) {
  const uint32_t crc = checkpoint::Crc32c(data.data(), data.size());
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string FrameRecord(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  Append<uint64_t>(&out, data.size());
  Append<uint32_t>(&out, MaskedCrc32c(out));
  out.append(data);
  Append<uint32_t>(&out, MaskedCrc32c(data));
  return out;
}

absl::StatusOr<std::vector<std::string>> ParseRecords(std::string_view bytes,
                                                      const std::string& path) {
  std::vector<std::string> records;
  size_t at = 0;
  while (at < bytes.size()) {
    const auto bad = [&](const std::string& what) {
      return absl::DataLossError(
          absl::StrCat(path, ": record ", records.size(), " at byte ", at, ": ", what));
    };
    if (bytes.size() - at < 12) return bad("truncated length header");
    const uint64_t n = Load<uint64_t>(bytes.data() + at);
    if (Load<uint32_t>(bytes.data() + at + 8) != MaskedCrc32c(bytes.substr(at, 8))) {
      return bad("length CRC mismatch");
    }
    if (n > bytes.size() - at - 12 || bytes.size() - at - 12 - n < 4) {
      return bad(absl::StrCat("truncated (", n, " data bytes announced)"));
    }
    const std::string_view data = bytes.substr(at + 12, n);
    if (Load<uint32_t>(bytes.data() + at + 12 + n) != MaskedCrc32c(data)) {
      return bad("data CRC mismatch");
    }
    records.emplace_back(data);
    at += 16 + n;
  }
  return records;
}

absl::StatusOr<std::vector<std::string>> ReadRecords(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(std::string bytes, checkpoint::ReadFile(path));
  return ParseRecords(bytes, path);
}

}  // namespace loom::tensorboard
