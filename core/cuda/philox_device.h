#ifndef LOOM_CORE_CUDA_PHILOX_DEVICE_H_
#define LOOM_CORE_CUDA_PHILOX_DEVICE_H_

// The device twin of core/cpu/philox.h: Philox4x32-10 and Loom's dropout
// stream, compiled for both host and device so a plain C++ test can check it
// bit for bit against the CPU version (philox_device_test.cc) without a GPU.
// Any change here must keep DropoutBitsAtHD == cpu::DropoutBitsAt.

#include <cstdint>

#if defined(__CUDACC__)
#define LOOM_HD __host__ __device__ __forceinline__
#else
#define LOOM_HD inline
#endif

namespace loom::core::cuda {

struct Philox4 {
  uint32_t w[4];
};

LOOM_HD uint32_t MulHi32(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

LOOM_HD Philox4 Philox4x32_10HD(Philox4 c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = MulHi32(kM0, c.w[0]), lo0 = kM0 * c.w[0];
    const uint32_t hi1 = MulHi32(kM1, c.w[2]), lo1 = kM1 * c.w[2];
    c = Philox4{{hi1 ^ c.w[1] ^ k0, lo1, hi0 ^ c.w[3] ^ k1, lo0}};
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

// 16 random bits of element `index` of the (seed, offset) dropout stream;
// see cpu::DropoutBitsAt for the layout.
LOOM_HD uint32_t DropoutBitsAtHD(uint64_t seed, uint64_t offset, uint64_t index) {
  const uint64_t group = index >> 7;
  const uint32_t r = static_cast<uint32_t>(index & 127);
  const uint64_t block = 16 * group + (r & 15);
  const Philox4 out = Philox4x32_10HD(
      Philox4{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
               static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)}},
      static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const uint32_t word = out.w[(r >> 4) & 3];
  return r < 64 ? (word & 0xffffu) : (word >> 16);
}

// The dropout stream's Philox block `block` (of element group block / 16)
// serves the 8 elements 128 (block / 16) + block % 16 + 16 k, k < 8 (the
// layout of cpu::DropoutBitsAt); bits[k] are their 16-bit draws. One Philox
// evaluation per 8 elements instead of one per element (residual_norm.cu;
// dropout_block_bits_test checks it against cpu::DropoutBitsAt).
LOOM_HD void DropoutBlockBits(uint64_t seed, uint64_t offset, uint64_t block, uint32_t bits[8]) {
  const Philox4 out = Philox4x32_10HD(
      Philox4{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
               static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)}},
      static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  for (int k = 0; k < 4; ++k) {
    bits[k] = out.w[k] & 0xffffu;
    bits[k + 4] = out.w[k] >> 16;
  }
}

}  // namespace loom::core::cuda

#endif  // LOOM_CORE_CUDA_PHILOX_DEVICE_H_
