// The device Philox (philox_device.h) compiled for the host must equal the
// CPU dropout stream bit for bit; runs without a GPU.

#include "core/cuda/philox_device.h"

#include <cstdint>

#include "core/cpu/philox.h"
#include "gtest/gtest.h"

namespace loom::core::cuda {
namespace {

TEST(PhiloxDeviceTest, KnownAnswerVectors) {
  // Salmon et al.'s Philox4x32-10 known answers (also in core/cpu/dropout_test.cc).
  Philox4 z = Philox4x32_10HD(Philox4{{0, 0, 0, 0}}, 0, 0);
  EXPECT_EQ(z.w[0], 0x6627e8d5u);
  EXPECT_EQ(z.w[1], 0xe169c58du);
  EXPECT_EQ(z.w[2], 0xbc57ac4cu);
  EXPECT_EQ(z.w[3], 0x9b00dbd8u);
  Philox4 f = Philox4x32_10HD(Philox4{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
                              0xffffffffu, 0xffffffffu);
  EXPECT_EQ(f.w[0], 0x408f276du);
  EXPECT_EQ(f.w[1], 0x41c83b0eu);
  EXPECT_EQ(f.w[2], 0xa20bc7c6u);
  EXPECT_EQ(f.w[3], 0x6d5451fdu);
  Philox4 p = Philox4x32_10HD(Philox4{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
                              0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(p.w[0], 0xd16cfe09u);
  EXPECT_EQ(p.w[1], 0x94fdccebu);
  EXPECT_EQ(p.w[2], 0x5001e420u);
  EXPECT_EQ(p.w[3], 0x24126ea1u);
}

TEST(PhiloxDeviceTest, DropoutBitsMatchCpu) {
  const uint64_t seeds[] = {0, 1, 0x299f31d0a4093822ull, ~0ull};
  const uint64_t offsets[] = {0, 7, 0x0370734413198a2eull};
  for (uint64_t seed : seeds) {
    for (uint64_t offset : offsets) {
      for (uint64_t i = 0; i < 4096; ++i) {
        ASSERT_EQ(DropoutBitsAtHD(seed, offset, i), cpu::DropoutBitsAt(seed, offset, i))
            << "seed " << seed << " offset " << offset << " index " << i;
      }
      // Indices past 2^32 (block counters with a high word).
      for (uint64_t i = (uint64_t{1} << 36) - 300; i < (uint64_t{1} << 36) + 300; ++i) {
        ASSERT_EQ(DropoutBitsAtHD(seed, offset, i), cpu::DropoutBitsAt(seed, offset, i)) << i;
      }
    }
  }
}

}  // namespace
}  // namespace loom::core::cuda
