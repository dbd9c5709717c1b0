#include "core/cuda/adamw.h"

#include <cstring>

#include "core/cpu/adamw.h"
#include "core/cpu/convert.h"
#include "core/cuda/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cuda::testing {
namespace {

TEST(CudaAdamWTest, StepsMatchCpu) {
  LOOM_REQUIRE_GPU();
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{65537}}) {
    cpu::AdamWOptions o;
    o.lr = 3e-3f;
    o.weight_decay = 0.1f;
    o.grad_scale = 0.5f;
    Tensor p = Random(Shape{n}, 1), m = *Tensor::Zeros(Shape{n}, DType::kF32);
    Tensor v = *Tensor::Zeros(Shape{n}, DType::kF32);
    Tensor gp = Upload(p), gm = Upload(m), gv = Upload(v);
    Tensor gp16 = Poisoned(Shape{n}, DType::kBF16);
    for (int64_t step = 1; step <= 3; ++step) {
      const Tensor grad = Random(Shape{n}, 10 + step);
      LOOM_ASSERT_OK(cpu::AdamWStep(&p, grad, &m, &v, step, o));
      if (step < 3) {
        LOOM_ASSERT_OK(cuda::AdamWStep(&gp, Upload(grad), &gm, &gv, step, o));
      } else {
        LOOM_ASSERT_OK(cuda::AdamWStep(&gp, Upload(grad), &gm, &gv, step, o, &gp16));
      }
    }
    // Same float formula; FMA contraction may differ between nvcc and GCC.
    EXPECT_LE(RelError(ToCpuF32(gp), p), 1e-6) << n;
    EXPECT_LE(RelError(ToCpuF32(gm), m), 1e-6) << n;
    EXPECT_LE(RelError(ToCpuF32(gv), v), 1e-5) << n;
    // The bf16 copy is the rounding of the GPU's own f32 params, bit for bit.
    Tensor gp_host = Download(gp);
    Tensor want16 = CpuEmpty(Shape{n}, DType::kBF16);
    LOOM_ASSERT_OK(cpu::Convert(gp_host, &want16));
    Tensor got16 = Download(gp16);
    EXPECT_EQ(0, std::memcmp(got16.raw_data(), want16.raw_data(), want16.nbytes()));
  }
}

TEST(CudaAdamWTest, RejectsBadArguments) {
  Tensor p = Random(Shape{4}, 1), g = Random(Shape{4}, 2), m = Random(Shape{4}, 3);
  Tensor v = Random(Shape{4}, 4);
  EXPECT_TRUE(IsInvalidArgument(cuda::AdamWStep(&p, g, &m, &v, 1, {}), {"AdamWStep", "cpu"}));
  EXPECT_TRUE(IsInvalidArgument(cuda::AdamWStep(&p, g, &m, &v, 0, {}), {"step is 0"}));
  Tensor g5 = Random(Shape{5}, 2);
  EXPECT_TRUE(IsInvalidArgument(cuda::AdamWStep(&p, g5, &m, &v, 1, {}), {"grad", "4 elements"}));
  Tensor g16 = CpuEmpty(Shape{4}, DType::kBF16);
  EXPECT_TRUE(IsInvalidArgument(cuda::AdamWStep(&p, g16, &m, &v, 1, {}), {"grad", "bf16"}));
  Tensor p16 = CpuEmpty(Shape{4}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(cuda::AdamWStep(&p, g, &m, &v, 1, {}, &p16), {"param_bf16", "f32"}));
  EXPECT_TRUE(IsInvalidArgument(cuda::AdamWStep(&p, g, &m, &v, 1, {}, nullptr), {"param_bf16", "null"}));
}

// The op list's AdamWStepWithCopy: the same f32 update as the CPU's (within
// FMA contraction) and a copy that is bf16(the GPU's own param) bit for bit,
// on ragged sizes, poisoned copies and a run inside a larger buffer (how
// Optimizer::Step narrows the flat buffers).
TEST(CudaAdamWTest, StepWithCopyMatchesCpu) {
  LOOM_REQUIRE_GPU();
  cpu::AdamWOptions o;
  o.lr = 3e-3f;
  o.weight_decay = 0.1f;
  o.grad_scale = 0.5f;
  for (int64_t n : {int64_t{1}, int64_t{31}, int64_t{65537}, int64_t{3} << 20}) {
    Tensor p = Random(Shape{n}, 1), m = *Tensor::Zeros(Shape{n}, DType::kF32);
    Tensor v = *Tensor::Zeros(Shape{n}, DType::kF32);
    Tensor copy = CpuEmpty(Shape{n}, DType::kBF16);
    Tensor gp = Upload(p), gm = Upload(m), gv = Upload(v);
    Tensor gbuf = Poisoned(Shape{n + 7}, DType::kBF16);
    Tensor gcopy = *gbuf.Narrow(3, n);
    for (int64_t step = 1; step <= 3; ++step) {
      const Tensor grad = Random(Shape{n}, 10 + step);
      LOOM_ASSERT_OK(cpu::AdamWStepWithCopy(&p, grad, &m, &v, step, o, &copy));
      LOOM_ASSERT_OK(cuda::AdamWStepWithCopy(&gp, Upload(grad), &gm, &gv, step, o, &gcopy));
    }
    EXPECT_LE(RelError(ToCpuF32(gp), p), 1e-6) << n;
    EXPECT_LE(RelError(ToCpuF32(gm), m), 1e-6) << n;
    EXPECT_LE(RelError(ToCpuF32(gv), v), 1e-5) << n;
    Tensor want16 = CpuEmpty(Shape{n}, DType::kBF16);
    LOOM_ASSERT_OK(cpu::Convert(Download(gp), &want16));
    EXPECT_EQ(0, std::memcmp(Download(gcopy).raw_data(), want16.raw_data(), want16.nbytes())) << n;
    // Nothing outside the run was written (still the 0xff poison).
    const Tensor all = Download(gbuf);
    const auto* bits = static_cast<const uint16_t*>(all.raw_data());
    for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{2}, n + 3, n + 6}) EXPECT_EQ(bits[i], 0xffff) << i;
  }
}

TEST(CudaAdamWTest, StepWithCopyRefusesWhatTheCpuRefuses) {
  Tensor p = Random(Shape{4}, 1), g = Random(Shape{4}, 2), m = Random(Shape{4}, 3);
  Tensor v = Random(Shape{4}, 4);
  Tensor f32 = CpuEmpty(Shape{4}, DType::kF32), short16 = CpuEmpty(Shape{3}, DType::kBF16);
  // The contract's checks (ops::CheckParamCopy) come before placement.
  EXPECT_TRUE(IsInvalidArgument(cuda::AdamWStepWithCopy(&p, g, &m, &v, 1, {}, nullptr),
                                {"AdamWStepWithCopy", "param_copy is null"}));
  EXPECT_TRUE(IsInvalidArgument(cuda::AdamWStepWithCopy(&p, g, &m, &v, 1, {}, &f32),
                                {"AdamWStepWithCopy", "param_copy", "expected bf16"}));
  EXPECT_TRUE(IsInvalidArgument(cuda::AdamWStepWithCopy(&p, g, &m, &v, 1, {}, &short16),
                                {"AdamWStepWithCopy", "param_copy", "expected 4 elements"}));
}

}  // namespace
}  // namespace loom::core::cuda::testing
