// Runs everywhere (no CUDA needed): the fused kernels' per-Philox-block draw
// (DropoutBlockBits, 8 elements per evaluation) against the per-element
// stream of core/cpu/philox.h, across group and 2^32-block boundaries.

#include <cstdint>

#include "core/cpu/philox.h"
#include "core/cuda/philox_device.h"
#include "gtest/gtest.h"

namespace loom::core::cuda {
namespace {

TEST(DropoutBlockBitsTest, EveryBlockServesItsEightElements) {
  const uint64_t seeds[] = {0, 1234, 0xdeadbeefcafef00dull};
  const uint64_t offsets[] = {0, 7, 0x100000003ull};
  const uint64_t blocks[] = {0, 1, 15, 16, 17, 12345, (uint64_t{1} << 32) - 1, uint64_t{1} << 32,
                             (uint64_t{1} << 36) + 5};
  for (uint64_t seed : seeds) {
    for (uint64_t offset : offsets) {
      for (uint64_t block : blocks) {
        uint32_t bits[8];
        DropoutBlockBits(seed, offset, block, bits);
        for (int k = 0; k < 8; ++k) {
          const uint64_t e = (block >> 4) * 128 + (block & 15) + 16 * k;
          ASSERT_EQ(bits[k], cpu::DropoutBitsAt(seed, offset, e))
              << "seed " << seed << " offset " << offset << " block " << block << " k " << k;
        }
      }
    }
  }
}

}  // namespace
}  // namespace loom::core::cuda
