#include "config/lr_schedule.h"

#include "gtest/gtest.h"

namespace loom::train {
namespace {

TEST(LrScheduleTest, WarmupThenCosineToMin) {
  LrSchedule s{1.0f, 0.1f, LrDecayStyle::kCosine, 10, 110};
  ASSERT_TRUE(s.Validate().ok());
  EXPECT_FLOAT_EQ(s.At(0), 0.1f);   // step 1 of 10
  EXPECT_FLOAT_EQ(s.At(9), 1.0f);   // end of warm-up
  EXPECT_NEAR(s.At(59), 0.55f, 1e-6);  // half-way: min + (lr - min) / 2
  EXPECT_FLOAT_EQ(s.At(109), 0.1f);
  EXPECT_FLOAT_EQ(s.At(500), 0.1f);
  for (int i = 10; i < 110; ++i) EXPECT_LE(s.At(i), s.At(i - 1) + 1e-7f);
}

TEST(LrScheduleTest, LinearAndConstant) {
  LrSchedule lin{2.0f, 0.0f, LrDecayStyle::kLinear, 0, 100};
  EXPECT_NEAR(lin.At(49), 1.0f, 1e-6);
  LrSchedule c{2.0f, 0.0f, LrDecayStyle::kConstant, 5, 100};
  EXPECT_FLOAT_EQ(c.At(4), 2.0f);
  EXPECT_FLOAT_EQ(c.At(99), 2.0f);
}

TEST(LrScheduleTest, BadFlagsAreNamed) {
  LrSchedule m{1.0f, 2.0f, LrDecayStyle::kCosine, 0, 10};
  EXPECT_NE(m.Validate().message().find("--min-lr"), std::string::npos);
  LrSchedule w{1.0f, 0.0f, LrDecayStyle::kCosine, 20, 10};
  EXPECT_NE(w.Validate().message().find("--lr-warmup-iters (20)"), std::string::npos);
}

}  // namespace
}  // namespace loom::train
