#include "checkpoint/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace loom::checkpoint {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // 0x1EDC6F41 reflected

std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}

const std::array<uint32_t, 256>& Table() {
  static const std::array<uint32_t, 256> table = MakeTable();
  return table;
}

// GF(2) polynomial arithmetic modulo the (reflected) CRC polynomial, as in
// zlib: a * b mod P, where bit 31 is x^0.
uint32_t MultModP(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// x^(2^k) mod P for k = 0..63 (no wrap-around: unlike CRC-32's, the order of
// x modulo the CRC-32C polynomial does not divide 2^32 - 1).
std::array<uint32_t, 64> MakeX2nTable() {
  std::array<uint32_t, 64> t{};
  uint32_t p = 1u << 30;  // x^1
  t[0] = p;
  for (int k = 1; k < 64; ++k) t[k] = p = MultModP(p, p);
  return t;
}

// x^(8 * n) mod P: the operator that appends n zero bytes to a CRC register.
uint32_t X8nModP(size_t n) {
  static const std::array<uint32_t, 64> x2n = MakeX2nTable();
  uint32_t p = 1u << 31;  // x^0
  int k = 3;
  while (n != 0) {
    if (n & 1) p = MultModP(x2n[k], p);
    n >>= 1;
    ++k;
  }
  return p;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint64_t Stream(uint64_t c, const unsigned char* p, size_t n) {
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  return c;
}

// Large buffers: three independent crc32 streams over the three thirds (the
// instruction has a latency of 3 and a throughput of 1 per cycle), merged
// with the zero-append operator.
constexpr size_t kThreeWayMin = 64 << 10;

__attribute__((target("sse4.2"))) uint32_t ExtendHardware(uint32_t crc, const void* data,
                                                           size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t c = ~crc;
  if (n < kThreeWayMin) return ~static_cast<uint32_t>(Stream(c, p, n));
  while ((reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  const size_t third = (n / 3) & ~size_t{7};
  const unsigned char* pa = p;
  const unsigned char* pb = p + third;
  const unsigned char* pc = p + 2 * third;
  uint64_t a = c, b = 0, d = 0;
  for (size_t i = 0; i < third; i += 8) {
    uint64_t wa, wb, wc;
    std::memcpy(&wa, pa + i, 8);
    std::memcpy(&wb, pb + i, 8);
    std::memcpy(&wc, pc + i, 8);
    a = _mm_crc32_u64(a, wa);
    b = _mm_crc32_u64(b, wb);
    d = _mm_crc32_u64(d, wc);
  }
  // The third stream also takes the tail past 3 * third.
  d = Stream(d, pc + third, n - 3 * third);
  const uint32_t shift = X8nModP(third);
  const uint32_t ab = MultModP(shift, static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b);
  const uint32_t abc =
      MultModP(X8nModP(n - 2 * third), ab) ^ static_cast<uint32_t>(d);
  return ~abc;
}

bool HasSse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n) {
  const auto& t = Table();
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; ++i) c = t[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return ~c;
}

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, size_t len_b) {
  return MultModP(X8nModP(len_b), crc_a) ^ crc_b;
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
#if defined(__x86_64__)
  if (HasSse42()) return ExtendHardware(crc, data, n);
#endif
  return Crc32cExtendPortable(crc, data, n);
}

}  // namespace loom::checkpoint
