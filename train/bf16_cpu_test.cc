// --bf16 on --device=cpu (AVX512_BF16 or AMX-BF16): the Linear GEMMs take
// bf16 operands with f32 sums, the optimizer keeps f32 master weights, and
// the loss curve follows the f32 one within the bound the GPU's bf16 path is
// held to (tools/device_check.sh: 3 % relative per step). Without the
// instructions the flag is refused before anything starts (config_test).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "core/cpu/cpu_features.h"
#include "gtest/gtest.h"
#include "train/test_util.h"

namespace loom::train {
namespace {

// tools/device_check.sh's bound for GPU bf16 against CPU f32.
constexpr double kBf16Tolerance = 0.03;
constexpr int kIters = 40;

using testing::Layout;

std::vector<double> Train(const Layout& l, bool llama, bool bf16) {
  train::TrainConfig c =
      llama ? testing::TinyLlamaConfig(l, kIters) : testing::TinyConfig(l, kIters);
  c.bf16 = bf16;
  testing::RunResult r = testing::Run(c, l);
  EXPECT_TRUE(r.status.ok()) << l.Describe() << (bf16 ? " bf16: " : " f32: ") << r.status;
  return r.losses;
}

void ExpectBf16FollowsF32(bool llama) {
  if (!core::cpu::CheckBf16GemmSupport("--bf16").ok()) {
    GTEST_SKIP() << core::cpu::CheckBf16GemmSupport("--bf16 on --device=cpu");
  }
  const std::vector<double> ref = Train({1, 1, 1}, llama, false);
  ASSERT_EQ(ref.size(), static_cast<size_t>(kIters));
  EXPECT_LT(ref.back(), ref.front() - 0.5) << "the reference run must learn";
  // One rank, and TP + SP + PP (the pipeline's boundary activations stay f32).
  for (const Layout& l : {Layout{1, 1, 1}, Layout{2, 2, 1, 0, true}}) {
    const std::vector<double> got = Train(l, llama, true);
    testing::ExpectSameCurve(got, ref, 0, kBf16Tolerance,
                             std::string(llama ? "Llama-style " : "") + "bf16 " + l.Describe());
    // bf16 really changes the arithmetic (not silently f32).
    EXPECT_NE(got, ref);
    double gap = 0;
    for (size_t i = 0; i < got.size() && i < ref.size(); ++i) {
      gap = std::max(gap, std::abs(got[i] - ref[i]) / std::abs(ref[i]));
    }
    std::printf("%s%s: max relative loss gap %.4f over %zu steps (bound %.2f); final %.4f vs %.4f\n",
                llama ? "Llama-style " : "", l.Describe().c_str(), gap, got.size(),
                kBf16Tolerance, got.empty() ? 0.0 : got.back(), ref.back());
  }
}

TEST(Bf16CpuTest, LossCurveFollowsF32) { ExpectBf16FollowsF32(false); }
TEST(Bf16CpuTest, LlamaLossCurveFollowsF32) { ExpectBf16FollowsF32(true); }

}  // namespace
}  // namespace loom::train
