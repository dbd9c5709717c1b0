#ifndef LOOM_COMM_STORE_FRAME_H_
#define LOOM_COMM_STORE_FRAME_H_

// The TCP store's wire format and its parser, apart from any socket so that a
// fuzzer can drive it (//comm:store_frame_fuzz_test, //comm:store_frame_test).
// Standard library only: the libFuzzer build compiles these two files with
// clang directly.
//
// After the handshake (auth.h) every request and every reply is one frame:
//
//   head   1 byte            request: command (kSet 1, kGet 2, kAdd 3)
//                            reply:   kOk 0, kTimeout 1, kError 2
//   len_a  4 bytes, little-endian
//   a      len_a bytes       request: key;   reply: value or error text
//   len_b  4 bytes, little-endian
//   b      len_b bytes       request: value, Get's timeout in ms, Add's delta
//
// A frame whose announced size (9 + len_a + len_b) is over the limit is
// refused as soon as its lengths are read: nothing of that size is allocated.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom::comm {

// Bytes of a frame besides its two strings (head and the two lengths).
inline constexpr size_t kStoreFrameOverhead = 9;
// The largest frame rank 0's store reads or a client sends (4 MiB): a
// rendezvous value is an address (UCX worker addresses are a few KiB, NCCL's
// unique id 128 bytes). A longer frame drops the connection.
inline constexpr size_t kStoreMaxFrameBytes = size_t{4} << 20;

struct StoreFrame {
  uint8_t head = 0;
  std::string a;
  std::string b;
};

enum class StoreParse {
  kIncomplete,  // more bytes are needed; nothing was consumed
  kFrame,       // *frame holds the first frame; *consumed its length in bytes
  kTooLong,     // the first frame announces more than max_frame_bytes: drop the peer
};

// Parses the frame at the start of data[0, n). Never reads past n, never
// allocates more than the frame's (bounded) strings.
StoreParse ParseStoreFrame(const char* data, size_t n, size_t max_frame_bytes,
                           StoreFrame* frame, size_t* consumed);

// The bytes of one frame (the caller keeps it within kStoreMaxFrameBytes).
std::string EncodeStoreFrame(uint8_t head, std::string_view a, std::string_view b);

}  // namespace loom::comm

#endif  // LOOM_COMM_STORE_FRAME_H_
