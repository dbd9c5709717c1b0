// libFuzzer target over the TCP store's frame parser (frame.h): what rank 0's
// store does with the bytes of an authenticated connection. Built with clang
// (-fsanitize=fuzzer,address,undefined) as //comm:store_frame_fuzzer and run
// for a bounded time by //comm:store_frame_fuzz_test; //comm:store_frame_test
// calls the same entry point on seeded random frames with gcc.
//
// Input: byte 0 picks the frame limit (so small limits are reached), the rest
// is the stream. Each parsed frame must re-encode to exactly the bytes it
// consumed, stay within the limit, and a stream cut one byte short of a frame
// must be kIncomplete. A violation aborts.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "comm/store/frame.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using loom::comm::kStoreFrameOverhead;
  using loom::comm::StoreFrame;
  using loom::comm::StoreParse;
  if (size == 0) return 0;
  // Limits from 9 bytes (empty strings only) up to the real one.
  static const size_t kLimits[] = {kStoreFrameOverhead, 10, 16, 64, 300, 4096,
                                   loom::comm::kStoreMaxFrameBytes};
  const size_t limit = kLimits[data[0] % (sizeof(kLimits) / sizeof(kLimits[0]))];
  const char* p = reinterpret_cast<const char*>(data + 1);
  size_t n = size - 1;
  while (n > 0) {
    StoreFrame f;
    size_t used = 0;
    const StoreParse r = loom::comm::ParseStoreFrame(p, n, limit, &f, &used);
    if (r != StoreParse::kFrame) break;  // kIncomplete or kTooLong: the reader stops here
    Check(used >= kStoreFrameOverhead && used <= n && used <= limit);
    Check(used == kStoreFrameOverhead + f.a.size() + f.b.size());
    const std::string again = loom::comm::EncodeStoreFrame(f.head, f.a, f.b);
    Check(again.size() == used && std::memcmp(again.data(), p, used) == 0);
    StoreFrame g;
    size_t unused = 0;
    Check(loom::comm::ParseStoreFrame(p, used - 1, limit, &g, &unused) == StoreParse::kIncomplete);
    p += used;
    n -= used;
  }
  return 0;
}
