// --bf16 on the CPU: the Linear layers' GEMMs take bf16 operands (the
// weight's compute copy, activations rounded per call) with f32 sums, and
// everything else stays f32. Forward and backward against the f32 layers.

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cpu/cpu_features.h"
#include "core/ops/ops.h"
#include "gtest/gtest.h"
#include "layers/linear.h"
#include "layers/params.h"
#include "layers/test_util.h"

namespace loom::layers {
namespace {

using core::DType;
using core::Shape;
using core::Tensor;
using testing::MaxRelativeError;
using testing::RandomTensor;
using testing::ToVector;

// bf16 keeps 8 significant bits (rounding error u = 2^-8 per operand); the
// worst case of a K-term sum relative to its largest output grows like
// sqrt(K) (see core/cpu/matmul_test.cc's Bf16Tol).
double Bf16Tol(int64_t k) { return 2.0 * std::ldexp(1.0, -8) * std::max(1.0, std::sqrt(k / 16.0)); }

constexpr int64_t kS = 8, kB = 4, kIn = 96, kOut = 160;

std::vector<ParamSpec> Specs() {
  ParamSpec cw{"col.weight", Shape{kOut, kIn}, TpSplit::kRows};
  ParamSpec cb{"col.bias", Shape{kOut}, TpSplit::kRows, Init::kNormal};
  ParamSpec rw{"row.weight", Shape{kIn, kOut}, TpSplit::kCols};
  ParamSpec rb{"row.bias", Shape{kIn}, TpSplit::kReplicated, Init::kNormal};
  cw.std = rw.std = 0.2f;
  return {cw, cb, rw, rb};
}

struct Result {
  std::vector<float> y, dx, dcw, dcb, drw, drb;
};

// Column(x) -> Row -> y; backward from dy. Both layers, all gradients.
Result RunLayers(DType compute) {
  absl::StatusOr<ParamBuffer> buf =
      ParamBuffer::Create(Specs(), 0, 1, /*seed=*/5, 1, core::Device::CPU(), compute);
  EXPECT_TRUE(buf.ok()) << buf.status();
  ColumnParallelLinear col(&buf->at("col.weight"), &buf->at("col.bias"), TpGroup{});
  RowParallelLinear row(&buf->at("row.weight"), &buf->at("row.bias"), TpGroup{});
  const Tensor x = RandomTensor(Shape{kS, kB, kIn}, 1);
  const Tensor dy = RandomTensor(Shape{kS, kB, kIn}, 2);
  ColumnParallelLinear::Saved cs;
  RowParallelLinear::Saved rs;
  absl::StatusOr<Tensor> h = col.Forward(x, &cs);
  EXPECT_TRUE(h.ok()) << h.status();
  absl::StatusOr<Tensor> y = row.Forward(*h, &rs);
  EXPECT_TRUE(y.ok()) << y.status();
  absl::StatusOr<Tensor> dh = row.Backward(dy, rs);
  EXPECT_TRUE(dh.ok()) << dh.status();
  absl::StatusOr<Tensor> dx = col.Backward(*dh, cs);
  EXPECT_TRUE(dx.ok()) << dx.status();
  EXPECT_EQ(y->dtype(), DType::kF32);
  EXPECT_EQ(dx->dtype(), DType::kF32);
  return {ToVector(*y),
          ToVector(*dx),
          ToVector(buf->at("col.weight").grad),
          ToVector(buf->at("col.bias").grad),
          ToVector(buf->at("row.weight").grad),
          ToVector(buf->at("row.bias").grad)};
}

bool HasBf16() { return core::cpu::CheckBf16GemmSupport("test").ok(); }

TEST(LinearBf16Test, CpuParamsKeepF32ValuesAndABf16GemmCopy) {
  absl::StatusOr<ParamBuffer> buf =
      ParamBuffer::Create(Specs(), 0, 1, 5, 1, core::Device::CPU(), DType::kBF16);
  ASSERT_TRUE(buf.ok()) << buf.status();
  Param& w = buf->at("col.weight");
  EXPECT_EQ(w.value.dtype(), DType::kF32);
  EXPECT_EQ(w.value.raw_data(), w.master.raw_data());
  ASSERT_TRUE(w.gemm_value.defined());
  EXPECT_EQ(w.gemm_value.dtype(), DType::kBF16);
  EXPECT_EQ(w.gemm_value.shape(), w.master.shape());
  // An optimizer step writes the master; SyncComputeCopy refreshes the GEMM copy.
  w.master.data<float>()[0] = 3.0f;
  ASSERT_TRUE(buf->SyncComputeCopy().ok());
  EXPECT_EQ(static_cast<const uint16_t*>(w.gemm_value.raw_data())[0], 0x4040);  // bf16(3)
  // In f32 there is no GEMM copy.
  absl::StatusOr<ParamBuffer> f32 = ParamBuffer::Create(Specs(), 0, 1, 5);
  ASSERT_TRUE(f32.ok());
  EXPECT_FALSE(f32->at("col.weight").gemm_value.defined());
}

TEST(LinearBf16Test, ForwardAndBackwardMatchF32) {
  if (!HasBf16()) GTEST_SKIP() << core::cpu::CheckBf16GemmSupport("--bf16 on --device=cpu");
  const Result f = RunLayers(DType::kF32);
  const Result h = RunLayers(DType::kBF16);
  // Two GEMMs chained (K = in, then K = out); gradients chain up to three.
  const double tol = 3 * Bf16Tol(kOut);
  EXPECT_LE(MaxRelativeError(h.y, f.y), tol);
  EXPECT_LE(MaxRelativeError(h.dx, f.dx), tol);
  EXPECT_LE(MaxRelativeError(h.dcw, f.dcw), tol);
  EXPECT_LE(MaxRelativeError(h.drw, f.drw), tol);
  EXPECT_LE(MaxRelativeError(h.dcb, f.dcb), tol);
  // The row bias's gradient is Σ dY: no GEMM in it, so it is exact.
  EXPECT_EQ(h.drb, f.drb);
  // And bf16 really is used: the results are not the f32 ones.
  EXPECT_NE(h.y, f.y);
}

}  // namespace
}  // namespace loom::layers
