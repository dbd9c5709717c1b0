// The TCP store's frame parser: known cases, then seeded random streams
// through the fuzz target's oracle (frame_fuzz.cc), so every `bazel test`
// fuzzes it a little even where clang's libFuzzer is not installed.
#include "comm/store/frame.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace loom::comm {
namespace {

std::string Le32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

TEST(StoreFrame, RoundTripAndPieces) {
  const std::string f = EncodeStoreFrame(2, "key", std::string("v\0w", 3));
  ASSERT_EQ(f.size(), kStoreFrameOverhead + 3 + 3);
  EXPECT_EQ(f.substr(1, 4), Le32(3));  // little-endian on every host
  StoreFrame out;
  size_t used = 0;
  for (size_t n = 0; n < f.size(); ++n) {
    EXPECT_EQ(ParseStoreFrame(f.data(), n, kStoreMaxFrameBytes, &out, &used),
              StoreParse::kIncomplete)
        << n;
  }
  const std::string two = f + EncodeStoreFrame(1, "", "");
  ASSERT_EQ(ParseStoreFrame(two.data(), two.size(), kStoreMaxFrameBytes, &out, &used),
            StoreParse::kFrame);
  EXPECT_EQ(used, f.size());
  EXPECT_EQ(out.head, 2);
  EXPECT_EQ(out.a, "key");
  EXPECT_EQ(out.b, std::string("v\0w", 3));
}

TEST(StoreFrame, LongFramesAreRefusedFromTheirLengthsAlone) {
  // 5 bytes announcing a 4 GiB key: refused before anything is allocated.
  const std::string huge = std::string(1, '\1') + Le32(0xffffffffu);
  StoreFrame out;
  size_t used = 0;
  EXPECT_EQ(ParseStoreFrame(huge.data(), huge.size(), kStoreMaxFrameBytes, &out, &used),
            StoreParse::kTooLong);
  // Both lengths within the limit, their sum not (and no 32-bit wrap).
  const std::string a(100, 'a');
  const std::string sum = std::string(1, '\1') + Le32(100) + a + Le32(0xffffff9cu);
  EXPECT_EQ(ParseStoreFrame(sum.data(), sum.size(), kStoreMaxFrameBytes, &out, &used),
            StoreParse::kTooLong);
  // Exactly at the limit is a frame; one byte over is not.
  const std::string at = EncodeStoreFrame(1, a, "b");
  EXPECT_EQ(ParseStoreFrame(at.data(), at.size(), at.size(), &out, &used), StoreParse::kFrame);
  EXPECT_EQ(ParseStoreFrame(at.data(), at.size(), at.size() - 1, &out, &used),
            StoreParse::kTooLong);
}

// Seeded: the same streams on every run. Valid frames, random bytes, and
// valid frames with a few bytes flipped (lengths included).
TEST(StoreFrame, SeededRandomStreams) {
  std::mt19937_64 rng(17);
  auto byte = [&] { return static_cast<char>(rng() & 0xff); };
  for (int iter = 0; iter < 20000; ++iter) {
    std::string in(1, byte());  // the limit selector
    const int kind = iter % 3;
    if (kind == 1) {
      const size_t n = rng() % 64;
      for (size_t i = 0; i < n; ++i) in.push_back(byte());
    } else {
      const int frames = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < frames; ++k) {
        std::string a(rng() % 40, '\0'), b(rng() % 300, '\0');
        for (auto& c : a) c = byte();
        for (auto& c : b) c = byte();
        in += EncodeStoreFrame(static_cast<uint8_t>(rng() % 5), a, b);
      }
      if (kind == 2) {
        const int flips = 1 + static_cast<int>(rng() % 3);
        for (int k = 0; k < flips; ++k) in[1 + rng() % (in.size() - 1)] = byte();
      }
      if (rng() % 4 == 0) in.resize(1 + rng() % in.size());  // cut anywhere
    }
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(in.data()), in.size());
  }
}

}  // namespace
}  // namespace loom::comm
