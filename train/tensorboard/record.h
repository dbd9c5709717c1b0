#ifndef LOOM_TRAIN_TENSORBOARD_RECORD_H_
#define LOOM_TRAIN_TENSORBOARD_RECORD_H_

// TFRecord framing, the container of TensorBoard's event files:
//   uint64 length (little endian), uint32 masked CRC-32C of those 8 bytes,
//   length bytes of data, uint32 masked CRC-32C of the data.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::tensorboard {

// TFRecord's mask: a CRC stored next to data that itself holds CRCs would
// otherwise be weak ((crc >> 15 | crc << 17) + 0xa282ead8).
uint32_t MaskedCrc32c(std::string_view data);

// One framed record, ready to append to a file.
std::string FrameRecord(std::string_view data);

// The records of `bytes` (named `path` in errors), every CRC checked: a
// wrong CRC or a truncated record is DataLoss naming the path, the record
// and its byte offset.
absl::StatusOr<std::vector<std::string>> ParseRecords(std::string_view bytes,
                                                      const std::string& path);
absl::StatusOr<std::vector<std::string>> ReadRecords(const std::string& path);

}  // namespace loom::tensorboard

#endif  // LOOM_TRAIN_TENSORBOARD_RECORD_H_
