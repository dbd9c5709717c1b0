#include "checkpoint/crc32c.h"

#include <cstdlib>
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

TEST(Crc32cTest, ThreeWayPathMatchesTable) {
  std::mt19937 rng(11);
  std::vector<unsigned char> buf((1 << 20) + 64);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (size_t start : {0, 1, 3, 8}) {
    for (size_t n : {size_t{64 << 10}, size_t{(64 << 10) + 5}, size_t{200001}, size_t{1 << 20}}) {
      ASSERT_EQ(Crc32cExtend(0x1234567u, buf.data() + start, n),
                Crc32cExtendPortable(0x1234567u, buf.data() + start, n))
          << "start " << start << " n " << n;
    }
  }
}

TEST(Crc32cTest, CombineEqualsWhole) {
  std::mt19937 rng(3);
  std::vector<unsigned char> buf(100000);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  const uint32_t whole = Crc32c(buf.data(), buf.size());
  for (size_t cut : {size_t{0}, size_t{1}, size_t{4096}, size_t{77777}, buf.size()}) {
    EXPECT_EQ(Crc32cCombine(Crc32c(buf.data(), cut), Crc32c(buf.data() + cut, buf.size() - cut),
                            buf.size() - cut),
              whole)
        << "cut " << cut;
  }
}

// Combining across more than 2^29 bytes (8 * n needs more than 32 bits):
// checked against checksumming the bytes themselves (calloc'ed zero pages,
// which cost no memory).
TEST(Crc32cTest, CombineHugeLengths) {
  const size_t n = (size_t{1} << 29) + 12345;
  void* zeros = std::calloc(n, 1);
  ASSERT_NE(zeros, nullptr);
  const uint32_t a = Crc32c("loom", 4);
  EXPECT_EQ(Crc32cCombine(a, Crc32c(zeros, n), n), Crc32cExtend(a, zeros, n));
  std::free(zeros);
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
