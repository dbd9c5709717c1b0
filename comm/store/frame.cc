#include "comm/store/frame.h"

namespace loom::comm {
namespace {

uint32_t LoadLe32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint32_t>(u[0]) | static_cast<uint32_t>(u[1]) << 8 |
         static_cast<uint32_t>(u[2]) << 16 | static_cast<uint32_t>(u[3]) << 24;
}

void AppendLe32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

StoreParse ParseStoreFrame(const char* data, size_t n, size_t max_frame_bytes,
                           StoreFrame* frame, size_t* consumed) {
  // head, len_a: 5 bytes.
  if (n < 5) return StoreParse::kIncomplete;
  const uint64_t len_a = LoadLe32(data + 1);
  // 64-bit sums: two 4 GiB lengths cannot wrap.
  if (kStoreFrameOverhead + len_a > max_frame_bytes) return StoreParse::kTooLong;
  if (n < 5 + len_a + 4) return StoreParse::kIncomplete;
  const uint64_t len_b = LoadLe32(data + 5 + len_a);
  const uint64_t total = kStoreFrameOverhead + len_a + len_b;
  if (total > max_frame_bytes) return StoreParse::kTooLong;
  if (n < total) return StoreParse::kIncomplete;
  frame->head = static_cast<uint8_t>(data[0]);
  frame->a.assign(data + 5, len_a);
  frame->b.assign(data + 9 + len_a, len_b);
  *consumed = static_cast<size_t>(total);
  return StoreParse::kFrame;
}

std::string EncodeStoreFrame(uint8_t head, std::string_view a, std::string_view b) {
  std::string out;
  out.reserve(kStoreFrameOverhead + a.size() + b.size());
  out.push_back(static_cast<char>(head));
  AppendLe32(&out, static_cast<uint32_t>(a.size()));
  out.append(a);
  AppendLe32(&out, static_cast<uint32_t>(b.size()));
  out.append(b);
  return out;
}

}  // namespace loom::comm
