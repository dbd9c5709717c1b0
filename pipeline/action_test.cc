#include "pipeline/action.h"

#include "gtest/gtest.h"

namespace loom::pipeline {
namespace {

TEST(ActionTest, ShortAndLongStrings) {
  EXPECT_EQ(ToShortString(Forward(3, 1)), "F3.1");
  EXPECT_EQ(ToShortString(Backward(0, 0)), "B0.0");
  EXPECT_EQ(ToShortString({ActionKind::kSendActivation, 2, 0, 3}), "SA2.0>3");
  EXPECT_EQ(ToShortString({ActionKind::kRecvGrad, 2, 1, 0}), "RG2.1<0");
  EXPECT_EQ(ToString({ActionKind::kRecvGrad, 3, 1, 2}),
            "RecvGrad(micro-batch 3, chunk 1) from stage 2");
  EXPECT_EQ(ToString(Forward(1, 0)), "Forward(micro-batch 1, chunk 0)");
  EXPECT_EQ(ToShortString(BackwardInput(4, 1)), "I4.1");
  EXPECT_EQ(ToShortString(BackwardWeight(2, 0)), "W2.0");
  EXPECT_EQ(ToString(BackwardInput(4, 1)), "BackwardInput(micro-batch 4, chunk 1)");
  EXPECT_EQ(ToString(BackwardWeight(2, 0)), "BackwardWeight(micro-batch 2, chunk 0)");
}

TEST(ActionTest, Predicates) {
  EXPECT_TRUE(IsCompute(ActionKind::kBackward));
  EXPECT_TRUE(IsSend(ActionKind::kSendGrad));
  EXPECT_TRUE(IsRecv(ActionKind::kRecvActivation));
  EXPECT_FALSE(IsSend(ActionKind::kRecvGrad));
  EXPECT_EQ(Forward(1, 2), Forward(1, 2));
  EXPECT_NE(Forward(1, 2), Backward(1, 2));
  EXPECT_TRUE(IsCompute(ActionKind::kBackwardInput));
  EXPECT_TRUE(IsCompute(ActionKind::kBackwardWeight));
  EXPECT_FALSE(IsSend(ActionKind::kBackwardWeight));
  EXPECT_FALSE(IsRecv(ActionKind::kBackwardInput));
  EXPECT_TRUE(IsBackward(ActionKind::kBackwardWeight));
  EXPECT_FALSE(IsBackward(ActionKind::kForward));
  EXPECT_NE(BackwardInput(1, 2), Backward(1, 2));
  EXPECT_NE(BackwardInput(1, 2), BackwardWeight(1, 2));
}

}  // namespace
}  // namespace loom::pipeline
