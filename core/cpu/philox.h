#ifndef LOOM_CORE_CPU_PHILOX_H_
#define LOOM_CORE_CPU_PHILOX_H_

// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11): a counter-based RNG. The same (counter, key) always gives the same
// four 32-bit words, so any thread, rank or device can draw the random
// numbers of any element without drawing the ones before it.

#include <array>
#include <cmath>
#include <cstdint>

namespace loom::core::cpu {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

inline PhiloxCounter Philox4x32_10(PhiloxCounter ctr, PhiloxKey key) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * ctr[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * ctr[2];
    ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0], static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1], static_cast<uint32_t>(p0)};
    key[0] += kW0;
    key[1] += kW1;
  }
  return ctr;
}

// Loom's dropout stream. For a given (seed, offset) every element index i of
// a logical (unsharded) tensor gets 16 random bits. Elements come in groups of
// 128 that share 16 Philox blocks, laid out so SIMD code needs no shuffles:
//   i = 128 g + r:  block 16 g + (r % 16), word (r / 16) % 4,
//                   bits 0-15 of the word for r < 64, bits 16-31 for r >= 64,
// with counter = {lo(block), hi(block), lo(offset), hi(offset)} and
// key = {lo(seed), hi(seed)}. `offset` separates the streams of different
// uses (layer, micro-batch, step) under one seed.
inline uint32_t DropoutBitsAt(uint64_t seed, uint64_t offset, uint64_t index) {
  const uint64_t group = index >> 7;
  const uint32_t r = static_cast<uint32_t>(index & 127);
  const uint64_t block = 16 * group + (r & 15);
  const PhiloxCounter out =
      Philox4x32_10({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                     static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)},
                    {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  const uint32_t word = out[(r >> 4) & 3];
  return r < 64 ? (word & 0xffffu) : (word >> 16);
}

// An element is kept when its 16 bits are >= DropoutThreshold(p) =
// ceil(p * 65536); the keep probability is 1 - threshold / 65536 (within
// 2^-16 of 1 - p).
inline uint32_t DropoutThreshold(float p) {
  const double t = std::ceil(static_cast<double>(p) * 65536.0);
  return t <= 0.0 ? 0u : t >= 65536.0 ? 65536u : static_cast<uint32_t>(t);
}

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_PHILOX_H_
