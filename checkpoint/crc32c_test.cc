#include "checkpoint/crc32c.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace loom::checkpoint {
namespace {

// Known answers from RFC 3720 (B.4) and the common "123456789" check value.
TEST(Crc32cTest, KnownAnswers) {
  const char* check = "123456789";
  EXPECT_EQ(Crc32c(check, 9), 0xE3069283u);
  EXPECT_EQ(Crc32cExtendPortable(0, check, 9), 0xE3069283u);
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xFF), inc(32), dec(32);
  for (int i = 0; i < 32; ++i) {
    inc[i] = static_cast<unsigned char>(i);
    dec[i] = static_cast<unsigned char>(31 - i);
  }
  EXPECT_EQ(Crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(inc.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(dec.data(), 32), 0x113FDB5Cu);
  EXPECT_EQ(Crc32c(nullptr, 0), 0u);
}

TEST(Crc32cTest, FastPathMatchesTableOnEveryLengthAndAlignment) {
  std::mt19937 rng(7);
  std::vector<unsigned char> buf(300);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (size_t start = 0; start < 9; ++start) {
    for (size_t n = 0; n + start <= buf.size(); n += 7) {
      ASSERT_EQ(Crc32c(buf.data() + start, n), Crc32cExtendPortable(0, buf.data() + start, n))
          << "start " << start << " n " << n;
    }
  }
}

TEST(Crc32cTest, ExtendEqualsWhole) {
  const std::string a = "The quick brown fox ", b = "jumps over the lazy dog";
  const std::string ab = a + b;
  EXPECT_EQ(Crc32cExtend(Crc32c(a.data(), a.size()), b.data(), b.size()),
            Crc32c(ab.data(), ab.size()));
}

TEST(Crc32cTest, DetectsEverySingleBitFlip) {
  std::vector<unsigned char> buf(64, 0x5A);
  const uint32_t good = Crc32c(buf.data(), buf.size());
  for (size_t bit = 0; bit < buf.size() * 8; ++bit) {
    buf[bit / 8] ^= 1u << (bit % 8);
    EXPECT_NE(Crc32c(buf.data(), buf.size()), good) << "bit " << bit;
    buf[bit / 8] ^= 1u << (bit % 8);
  }
}

}  // namespace
}  // namespace loom::checkpoint
