// The cuBLASLt epilogues (core/cuda/linear.h) against the CPU ops
// (core/cpu/linear.h, the unfused kernels' composition) on random data, f32
// and bf16, ragged and model shapes, poisoned outputs. Shapes whose GELU
// leading dim is not a multiple of 8 take the unfused fallback: both paths
// are compared.
//
// Tolerances (relative to the largest |want|): f32 2e-5 (cuBLAS sums K
// products in another order than oneDNN; the epilogue adds the bias and
// applies GELU to the f32 accumulator, as the unfused kernels do on the
// stored f32); bf16 1e-2 (the fused GEMM rounds once where the unfused path
// rounds the GEMM output, then the bias/GELU result). Bias gradients are
// sums over N rows: 1e-4 in f32, 2e-2 in bf16 (cuBLASLt writes the
// DGELU_BGRAD bias gradient in bf16 before it is added to the f32 dbias).

#include "core/cuda/linear.h"

#include "core/cpu/linear.h"
#include "core/cuda/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cuda::testing {
namespace {

using cpu::testing::Copy;

constexpr double kF32Tol = 2e-5, kBiasF32Tol = 1e-4, kBiasBf16Tol = 2e-2;

struct Dims {
  int64_t n, k, m;  // x [n, k], w [m, k], y [n, m]
};
// Ragged (fallback where m or k % 8 != 0), aligned, and a GPT-2-medium MLP slice.
const Dims kDims[] = {{1, 8, 8},     {37, 19, 23},   {37, 24, 40},
                      {300, 64, 72}, {512, 1024, 4096}, {512, 4096, 1024}};

TEST(CudaLinearTest, ForwardMatchesCpu) {
  LOOM_REQUIRE_GPU();
  uint64_t seed = 1;
  for (DType dt : FloatTypes()) {
    for (const Dims& d : kDims) {
      for (bool gelu : {false, true}) {
        const Tensor x = RoundedTo(Random(Shape{d.n, d.k}, seed++), dt);
        const Tensor w = RoundedTo(Random(Shape{d.m, d.k}, seed++, -0.1f, 0.1f), dt);
        const Tensor bias = RoundedTo(Random(Shape{d.m}, seed++), dt);
        Tensor want_y = cpu::testing::Make(Shape{d.n, d.m});
        Tensor want_pre = cpu::testing::Make(Shape{d.n, d.m});
        LOOM_ASSERT_OK(cpu::LinearForward(x, w, bias, &want_y, gelu ? &want_pre : nullptr,
                                          ops::LinearOptions{gelu, false}));
        Tensor y = Poisoned(Shape{d.n, d.m}, dt), pre = Poisoned(Shape{d.n, d.m}, dt);
        LOOM_ASSERT_OK(LinearForward(ToGpu(x, dt), ToGpu(w, dt), ToGpu(bias, dt), &y,
                                     gelu ? &pre : nullptr, ops::LinearOptions{gelu, false}));
        EXPECT_LE(RelError(ToCpuF32(y), want_y), Tol(dt, kF32Tol))
            << DTypeName(dt) << " " << d.n << "x" << d.k << "x" << d.m << " gelu=" << gelu;
        if (gelu) {
          EXPECT_LE(RelError(ToCpuF32(pre), want_pre), Tol(dt, kF32Tol))
              << "pre " << DTypeName(dt) << " " << d.n << "x" << d.k << "x" << d.m;
        }
      }
    }
  }
}

TEST(CudaLinearTest, BackwardDataThroughGeluMatchesCpu) {
  LOOM_REQUIRE_GPU();
  uint64_t seed = 100;
  for (DType dt : FloatTypes()) {
    for (const Dims& d : kDims) {
      for (bool with_bias : {false, true}) {
        const Tensor dy = RoundedTo(Random(Shape{d.n, d.m}, seed++), dt);
        const Tensor w = RoundedTo(Random(Shape{d.m, d.k}, seed++, -0.1f, 0.1f), dt);
        const Tensor pre = RoundedTo(Random(Shape{d.n, d.k}, seed++, -3.0f, 3.0f), dt);
        const Tensor db0 = Random(Shape{d.k}, seed++);  // f32, as Loom's gradients
        Tensor want_dx = cpu::testing::Make(Shape{d.n, d.k}), want_db = Copy(db0);
        const ops::LinearOptions o{true, false};
        LOOM_ASSERT_OK(cpu::LinearBackwardData(dy, w, pre, &want_dx, with_bias ? &want_db : nullptr, o));
        Tensor dx = Poisoned(Shape{d.n, d.k}, dt), db = ToGpu(db0, DType::kF32);
        LOOM_ASSERT_OK(LinearBackwardData(ToGpu(dy, dt), ToGpu(w, dt), ToGpu(pre, dt), &dx,
                                          with_bias ? &db : nullptr, o));
        EXPECT_LE(RelError(ToCpuF32(dx), want_dx), Tol(dt, kF32Tol))
            << DTypeName(dt) << " " << d.n << "x" << d.k << "x" << d.m;
        if (with_bias) {
          EXPECT_LE(RelError(ToCpuF32(db), want_db), Tol(dt, kBiasF32Tol, kBiasBf16Tol))
              << "dbias " << DTypeName(dt) << " " << d.n << "x" << d.k << "x" << d.m;
        }
      }
    }
  }
}

TEST(CudaLinearTest, BackwardWeightAccumulatesMatchesCpu) {
  LOOM_REQUIRE_GPU();
  uint64_t seed = 200;
  for (DType dt : FloatTypes()) {
    for (const Dims& d : kDims) {
      const Tensor dy = RoundedTo(Random(Shape{d.n, d.m}, seed++), dt);
      const Tensor x = RoundedTo(Random(Shape{d.n, d.k}, seed++), dt);
      const Tensor dw0 = Random(Shape{d.m, d.k}, seed++), db0 = Random(Shape{d.m}, seed++);
      Tensor want_dw = Copy(dw0), want_db = Copy(db0);
      LOOM_ASSERT_OK(cpu::LinearBackwardWeight(dy, x, &want_dw, &want_db, {}));
      // Loom keeps parameter gradients in f32 (bf16 operands, f32 dW and dbias).
      Tensor dw = ToGpu(dw0, DType::kF32), db = ToGpu(db0, DType::kF32);
      LOOM_ASSERT_OK(LinearBackwardWeight(ToGpu(dy, dt), ToGpu(x, dt), &dw, &db, {}));
      EXPECT_LE(RelError(ToCpuF32(dw), want_dw), Tol(dt, kF32Tol))
          << DTypeName(dt) << " " << d.n << "x" << d.k << "x" << d.m;
      EXPECT_LE(RelError(ToCpuF32(db), want_db), Tol(dt, kBiasF32Tol))
          << "dbias " << DTypeName(dt) << " " << d.n << "x" << d.k << "x" << d.m;
    }
  }
}

// The fallback (unfused) sequences have the same contract.
TEST(CudaLinearTest, UnfusedMatchesCpu) {
  LOOM_REQUIRE_GPU();
  const Dims d{64, 48, 40};
  const Tensor x = Random(Shape{d.n, d.k}, 1), w = Random(Shape{d.m, d.k}, 2);
  const Tensor bias = Random(Shape{d.m}, 3);
  Tensor want_y = cpu::testing::Make(Shape{d.n, d.m}), want_pre = cpu::testing::Make(Shape{d.n, d.m});
  const ops::LinearOptions o{true, false};
  LOOM_ASSERT_OK(cpu::LinearForward(x, w, bias, &want_y, &want_pre, o));
  Tensor y = Poisoned(Shape{d.n, d.m}, DType::kF32), pre = Poisoned(Shape{d.n, d.m}, DType::kF32);
  LOOM_ASSERT_OK(LinearForwardUnfused(ToGpu(x, DType::kF32), ToGpu(w, DType::kF32),
                                      ToGpu(bias, DType::kF32), &y, &pre, o));
  EXPECT_LE(RelError(ToCpuF32(y), want_y), kF32Tol);
  EXPECT_LE(RelError(ToCpuF32(pre), want_pre), kF32Tol);
}

// Argument errors come before any CUDA call: these run without a GPU, and the
// shape errors are the shared contract's (the CPU's words).
TEST(CudaLinearTest, RejectsBadArguments) {
  const Tensor x = Random(Shape{4, 3}, 1), w = Random(Shape{5, 3}, 2), b = Random(Shape{5}, 3);
  Tensor y = CpuEmpty(Shape{4, 5}, DType::kF32), bad_y = CpuEmpty(Shape{4, 6}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(LinearForward(x, w, b, &bad_y, nullptr, {}),
                                {"LinearForward", "y", "[4, 5]"}));
  EXPECT_TRUE(IsInvalidArgument(LinearForward(x, w, b, &y, nullptr, {}),
                                {"LinearForward", "cpu", "CUDA"}));
  Tensor pre = CpuEmpty(Shape{4, 5}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(LinearForward(x, w, b, &y, &pre, {}),
                                {"LinearForward", "pre", "only with gelu"}));
  const Tensor dy = Random(Shape{4, 5}, 4);
  Tensor dx = CpuEmpty(Shape{4, 3}, DType::kF32), db = CpuEmpty(Shape{3}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(LinearBackwardData(dy, w, Tensor(), &dx, &db, {}),
                                {"LinearBackwardData", "dbias", "needs gelu"}));
  Tensor dw = CpuEmpty(Shape{5, 3}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(LinearBackwardWeight(dy, x, &dw, nullptr, {true, false}),
                                {"LinearBackwardWeight", "gelu"}));
  Tensor x16_gpu_shape = CpuEmpty(Shape{4, 3}, DType::kBF16);
  EXPECT_TRUE(IsInvalidArgument(LinearForward(x16_gpu_shape, w, b, &y, nullptr, {}),
                                {"LinearForward", "w", "same dtype"}));
}

}  // namespace
}  // namespace loom::core::cuda::testing
