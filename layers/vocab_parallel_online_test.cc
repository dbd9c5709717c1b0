// The cross-entropy's "online" kernel choice (core/ops/kernel_manifest):
// forced (LOOM_KERNEL_IMPL=cross_entropy=online), VocabParallelCrossEntropy
// reads the logits once for each shard's max and sums, rescales the sums to
// the all-reduced max and all-reduces them as the unfused path does. With TP
// ranks as threads: TP 1 gives the unfused loss, sums and dlogits bit for bit
// (nothing to rescale); TP 2 and 4 (padding columns, a rank holding only
// padding) give the same max and target logits exactly and the sums of
// exponentials within kSumTol (relative): the rescaling's rounding. The loss
// then differs by at most that (log), and dlogits by that (relative).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/ops/kernel_choice.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "layers/test_util.h"
#include "layers/vocab_parallel.h"

namespace loom::layers {
namespace {

using core::Shape;
using core::Tensor;

constexpr double kSumTol = 4e-6;  // core/cpu/vocab_parallel_ce_test's bound per shard

struct Out {
  double loss = 0;
  std::vector<float> max, sums, dlogits;  // rank-local
};

// Forward + backward of one rank's shard, under the kernel choice in force.
absl::StatusOr<Out> RunRank(int rank, comm::Communicator* comm,
                            const Tensor& full_logits, const Tensor& targets, int64_t vocab) {
  const TpGroup tp{comm, false};
  const int64_t padded = full_logits.dim(2), local = padded / tp.size();
  // This rank's columns [rank * local, (rank + 1) * local).
  LOOM_ASSIGN_OR_RETURN(Tensor logits, Tensor::Empty(Shape{full_logits.dim(0), full_logits.dim(1), local},
                                                     core::DType::kF32));
  const int64_t rows = full_logits.dim(0) * full_logits.dim(1);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(logits.data<float>() + r * local, full_logits.data<float>() + r * padded + rank * local,
                local * sizeof(float));
  }
  VocabParallelCrossEntropy ce(tp, vocab);
  VocabParallelCrossEntropy::Saved saved;
  LOOM_ASSIGN_OR_RETURN(const double loss, ce.Forward(logits, targets, &saved));
  LOOM_ASSIGN_OR_RETURN(Tensor d, ce.Backward(saved, 1.0f));
  return Out{loss, testing::ToVector(saved.max), testing::ToVector(saved.sums), testing::ToVector(d)};
}

// Every rank's result under `impl`.
std::vector<Out> RunAll(const std::string& impl, int tp, const Tensor& logits, const Tensor& targets,
                        int64_t vocab) {
  setenv("LOOM_KERNEL_IMPL", ("cross_entropy=" + impl).c_str(), 1);
  core::ops::ForgetKernelChoicesForTesting();
  auto choice = core::ops::ChooseKernel("cross_entropy", core::DeviceType::kCPU);
  EXPECT_TRUE(choice.ok() && choice->implementation == impl) << impl;
  std::vector<Out> outs(tp);
  absl::Status st = testing::RunRanks(tp, [&](int rank, comm::Communicator* c) -> absl::Status {
    LOOM_ASSIGN_OR_RETURN(outs[rank], RunRank(rank, c, logits, targets, vocab));
    return absl::OkStatus();
  });
  EXPECT_TRUE(st.ok()) << st;
  unsetenv("LOOM_KERNEL_IMPL");
  core::ops::ForgetKernelChoicesForTesting();
  return outs;
}

double WorstRelative(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double ref = std::abs(want[i]), diff = std::abs(static_cast<double>(got[i]) - want[i]);
    worst = std::max(worst, ref > 0 ? diff / ref : diff);
  }
  return worst;
}

void ExpectOnlineMatchesUnfused(int tp, int64_t vocab, int64_t padded, float spread) {
  constexpr int64_t s = 8, b = 3;
  const Tensor logits = testing::RandomTensor(Shape{s, b, padded}, 41, spread);
  const Tensor targets = testing::RandomIds(s, b, vocab, 43);
  const std::vector<Out> unfused = RunAll("unfused", tp, logits, targets, vocab);
  const std::vector<Out> online = RunAll("online", tp, logits, targets, vocab);
  ASSERT_EQ(unfused.size(), online.size());
  const int64_t n = s * b;
  double sum_gap = 0, d_gap = 0;
  for (int r = 0; r < tp; ++r) {
    const Out &u = unfused[r], &o = online[r];
    ASSERT_EQ(o.max, u.max) << "rank " << r << ": the all-reduced max is exact";
    ASSERT_EQ(o.sums.size(), u.sums.size());
    const std::vector<float> usum(u.sums.begin(), u.sums.begin() + n), osum(o.sums.begin(), o.sums.begin() + n);
    EXPECT_TRUE(std::equal(o.sums.begin() + n, o.sums.end(), u.sums.begin() + n))
        << "rank " << r << ": target logits are exact";
    sum_gap = std::max(sum_gap, WorstRelative(osum, usum));
    d_gap = std::max(d_gap, testing::MaxRelativeError(o.dlogits, u.dlogits));
    EXPECT_NEAR(o.loss, u.loss, kSumTol) << "rank " << r;
    EXPECT_EQ(o.loss, online[0].loss) << "every rank has the same loss";
    if (tp == 1) {
      EXPECT_EQ(o.sums, u.sums) << "TP 1 has nothing to rescale: bitwise";
      EXPECT_EQ(o.dlogits, u.dlogits);
      EXPECT_EQ(o.loss, u.loss);
    }
  }
  EXPECT_LE(sum_gap, kSumTol) << "TP " << tp;
  EXPECT_LE(d_gap, kSumTol) << "TP " << tp;
  std::printf("TP %d, vocab %lld padded to %lld, logits in +-%.0f: sums within %.2e, dlogits %.2e, "
              "loss %.9f vs %.9f\n",
              tp, static_cast<long long>(vocab), static_cast<long long>(padded), spread, sum_gap,
              d_gap, online[0].loss, unfused[0].loss);
}

TEST(VocabParallelOnlineTest, Tp1IsTheUnfusedPathBitwise) { ExpectOnlineMatchesUnfused(1, 50, 64, 4); }
TEST(VocabParallelOnlineTest, Tp2WithinTheRescalingBound) {
  ExpectOnlineMatchesUnfused(2, 50, 64, 4);      // rank 1 holds 18 real columns
  ExpectOnlineMatchesUnfused(2, 1000, 1024, 20);  // maxima apart
}
TEST(VocabParallelOnlineTest, Tp4WithARankOfPaddingOnly) {
  ExpectOnlineMatchesUnfused(4, 40, 64, 4);  // rank 3's 16 columns are all padding
}

}  // namespace
}  // namespace loom::layers
