// The fused residual + norm kernels against the CPU's (the unfused kernels
// composed): random data, f32 and bf16, ragged widths (not multiples of the
// 16-byte vector: scalar tails, rows that alternate alignment), global-index
// dropout at offsets, outputs poisoned. resid (and in f32 dbranch's mask)
// must match exactly where the math is the same; the norm outputs and dx to
// the row sums' rounding. Skips without a GPU; the refusals run everywhere.

#include "core/cuda/residual_norm.h"

#include <string>

#include "core/cpu/residual_norm.h"
#include "core/cuda/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cuda::testing {
namespace {

using ops::ResidualNormOptions;

struct Case {
  Shape shape;
  bool rms;
  float p;
  ops::GlobalIndex where;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  const Shape shapes[] = {Shape{1, 1},     Shape{3, 7},      Shape{4, 2, 33}, Shape{5, 100},
                          Shape{8, 2, 768}, Shape{2, 3, 1029}, Shape{3, 5000}, Shape{2, 12289}};
  for (const Shape& s : shapes) {
    const int64_t c = s.dim(s.rank() - 1);
    for (bool rms : {false, true}) {
      for (float p : {0.0f, 0.1f}) {
        cases.push_back({s, rms, p, {}});
        if (p > 0.0f) cases.push_back({s, rms, p, {17 * c + 3, 3 * c + 1}});
      }
    }
  }
  return cases;
}

ResidualNormOptions Options(const Case& k) {
  ResidualNormOptions o;
  o.rms = k.rms;
  o.eps = 1e-5f;
  o.dropout.p = k.p;
  o.dropout.seed = 42;
  o.dropout.offset = 5;
  o.where = k.where;
  return o;
}

std::string What(const Case& k, DType dt) {
  return k.shape.ToString() + (k.rms ? " rms " : " ln ") + "p=" + std::to_string(k.p) +
         " first=" + std::to_string(k.where.first_index) + (dt == DType::kBF16 ? " bf16" : " f32");
}

TEST(CudaResidualNormTest, ForwardMatchesCpu) {
  LOOM_REQUIRE_GPU();
  uint64_t seed = 1;
  for (DType dt : FloatTypes()) {
    for (const Case& k : Cases()) {
      const ResidualNormOptions o = Options(k);
      const int64_t c = k.shape.dim(k.shape.rank() - 1), rows = k.shape.numel() / c;
      const Tensor x = RoundedTo(Random(k.shape, ++seed, -2.0f, 2.0f), dt);
      const Tensor br = RoundedTo(Random(k.shape, ++seed), dt);
      const Tensor g = RoundedTo(Random(Shape{c}, ++seed, 0.5f, 1.5f), dt);
      const Tensor b = RoundedTo(Random(Shape{c}, ++seed), dt);
      Tensor wres = CpuEmpty(k.shape, DType::kF32), wout = CpuEmpty(k.shape, DType::kF32);
      Tensor wm = CpuEmpty(Shape{rows}, DType::kF32), wr = CpuEmpty(Shape{rows}, DType::kF32);
      LOOM_ASSERT_OK(cpu::ResidualNormForward(x, br, g, k.rms ? Tensor() : b, o, &wres, &wout,
                                              k.rms ? nullptr : &wm, &wr));
      Tensor res = Poisoned(k.shape, dt), out = Poisoned(k.shape, dt);
      Tensor m = Poisoned(Shape{rows}, DType::kF32), r = Poisoned(Shape{rows}, DType::kF32);
      LOOM_ASSERT_OK(ResidualNormForward(ToGpu(x, dt), ToGpu(br, dt), ToGpu(g, dt),
                                         k.rms ? Tensor() : ToGpu(b, dt), o, &res, &out,
                                         k.rms ? nullptr : &m, &r));
      const std::string what = What(k, dt);
      // f32: the same dropout, scale and add: exact. bf16: the CPU adds in f32
      // without the device's two roundings to bf16.
      EXPECT_LE(RelError(ToCpuF32(res), wres), dt == DType::kF32 ? 0.0 : Tol(dt)) << what;
      EXPECT_LE(RelError(ToCpuF32(out), wout), Tol(dt, 2e-5, 3e-2)) << what;
      EXPECT_LE(RelError(ToCpuF32(r), wr), Tol(dt, 1e-5, 2e-2)) << what;
      if (!k.rms) {
        EXPECT_LE(RelError(ToCpuF32(m), wm), Tol(dt, 1e-5, 2e-2)) << what;
      }
      // In place in the branch's storage, as the block calls it.
      Tensor in_branch = ToGpu(br, dt), out2 = Poisoned(k.shape, dt);
      LOOM_ASSERT_OK(ResidualNormForward(ToGpu(x, dt), in_branch, ToGpu(g, dt),
                                         k.rms ? Tensor() : ToGpu(b, dt), o, &in_branch, &out2,
                                         k.rms ? nullptr : &m, &r));
      EXPECT_LE(RelError(ToCpuF32(in_branch), ToCpuF32(res)), 0.0) << what;
      EXPECT_LE(RelError(ToCpuF32(out2), ToCpuF32(out)), 0.0) << what;
    }
  }
}

TEST(CudaResidualNormTest, BackwardMatchesCpu) {
  LOOM_REQUIRE_GPU();
  uint64_t seed = 500;
  for (DType dt : FloatTypes()) {
    for (const Case& k : Cases()) {
      const ResidualNormOptions o = Options(k);
      const int64_t c = k.shape.dim(k.shape.rank() - 1), rows = k.shape.numel() / c;
      const Tensor x = RoundedTo(Random(k.shape, ++seed, -2.0f, 2.0f), dt);
      const Tensor br = RoundedTo(Random(k.shape, ++seed), dt);
      const Tensor g = RoundedTo(Random(Shape{c}, ++seed, 0.5f, 1.5f), dt);
      const Tensor b = RoundedTo(Random(Shape{c}, ++seed), dt);
      Tensor res = CpuEmpty(k.shape, DType::kF32), out = CpuEmpty(k.shape, DType::kF32);
      Tensor m = CpuEmpty(Shape{rows}, DType::kF32), r = CpuEmpty(Shape{rows}, DType::kF32);
      LOOM_ASSERT_OK(cpu::ResidualNormForward(x, br, g, k.rms ? Tensor() : b, o, &res, &out,
                                              k.rms ? nullptr : &m, &r));
      const Tensor resid = RoundedTo(res, dt);  // what the device holds
      const Tensor dout = RoundedTo(Random(k.shape, ++seed), dt);
      const Tensor dres = RoundedTo(Random(k.shape, ++seed), dt);
      const Tensor dg0 = Random(Shape{c}, ++seed), db0 = Random(Shape{c}, ++seed);
      Tensor wdx = CpuEmpty(k.shape, DType::kF32), wdb = CpuEmpty(k.shape, DType::kF32);
      Tensor wdg = RoundedTo(dg0, DType::kF32), wdbeta = RoundedTo(db0, DType::kF32);
      LOOM_ASSERT_OK(cpu::ResidualNormBackward(dout, dres, resid, g, k.rms ? Tensor() : m, r, o,
                                               &wdx, &wdb, &wdg, k.rms ? nullptr : &wdbeta));
      Tensor dx = Poisoned(k.shape, dt), dbr = Poisoned(k.shape, dt);
      Tensor dg = ToGpu(dg0, DType::kF32), dbeta = ToGpu(db0, DType::kF32);
      const Tensor gm = k.rms ? Tensor() : Upload(m), gr = Upload(r);
      LOOM_ASSERT_OK(ResidualNormBackward(ToGpu(dout, dt), ToGpu(dres, dt), ToGpu(resid, dt),
                                          ToGpu(g, dt), gm, gr, o, &dx, &dbr, &dg,
                                          k.rms ? nullptr : &dbeta));
      const std::string what = What(k, dt);
      EXPECT_LE(RelError(ToCpuF32(dx), wdx), Tol(dt, 5e-5, 3e-2)) << what;
      EXPECT_LE(RelError(ToCpuF32(dbr), wdb), Tol(dt, 5e-5, 3e-2)) << what;
      EXPECT_LE(RelError(ToCpuF32(dg), wdg), Tol(dt, 2e-5)) << what;
      if (!k.rms) {
        EXPECT_LE(RelError(ToCpuF32(dbeta), wdbeta), Tol(dt, 2e-5)) << what;
      }
      // The mask: dbranch is zero exactly where the CPU's is.
      const Tensor got_b = ToCpuF32(dbr);
      int64_t mismatched = 0;
      for (int64_t i = 0; i < got_b.numel(); ++i) {
        mismatched += (got_b.data<float>()[i] == 0.0f) != (wdb.data<float>()[i] == 0.0f);
      }
      EXPECT_EQ(mismatched, 0) << what;
      // No branch gradient, dx in dout's storage (the block's ln1).
      Tensor in_dout = ToGpu(dout, dt), dg2 = ToGpu(dg0, DType::kF32),
             db2 = ToGpu(db0, DType::kF32);
      LOOM_ASSERT_OK(ResidualNormBackward(in_dout, ToGpu(dres, dt), ToGpu(resid, dt),
                                          ToGpu(g, dt), gm, gr, o, &in_dout, nullptr, &dg2,
                                          k.rms ? nullptr : &db2));
      EXPECT_LE(RelError(ToCpuF32(in_dout), ToCpuF32(dx)), 0.0) << what;
    }
  }
}

TEST(CudaResidualNormTest, RefusesBadArguments) {
  const Tensor x = Random(Shape{4, 3}, 1), b = Random(Shape{4, 3}, 2);
  const Tensor g = Random(Shape{3}, 3), beta = Random(Shape{3}, 4);
  Tensor res = CpuEmpty(Shape{4, 3}, DType::kF32), out = CpuEmpty(Shape{4, 3}, DType::kF32);
  Tensor m = CpuEmpty(Shape{4}, DType::kF32), r = CpuEmpty(Shape{4}, DType::kF32);
  ResidualNormOptions o;
  // CPU tensors: refused before any CUDA call.
  EXPECT_TRUE(IsInvalidArgument(ResidualNormForward(x, b, g, beta, o, &res, &out, &m, &r),
                                {"ResidualNormForward", "cpu", "CUDA"}));
  // The shared contract's errors, as on the CPU.
  EXPECT_TRUE(IsInvalidArgument(
      ResidualNormForward(x, Random(Shape{4, 4}, 5), g, beta, o, &res, &out, &m, &r),
      {"ResidualNormForward", "branch"}));
  EXPECT_TRUE(IsInvalidArgument(ResidualNormForward(x, b, g, Tensor(), o, &res, &out, &m, &r),
                                {"ResidualNormForward", "LayerNorm needs beta"}));
  ResidualNormOptions bad = o;
  bad.dropout.p = 1.5f;
  EXPECT_TRUE(IsInvalidArgument(ResidualNormForward(x, b, g, beta, bad, &res, &out, &m, &r),
                                {"ResidualNormForward", "p = 1.5"}));
  Tensor dx = CpuEmpty(Shape{4, 3}, DType::kF32), dg = CpuEmpty(Shape{3}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(
      ResidualNormBackward(x, x, b, g, m, r, o, &dx, nullptr, &dg, nullptr),
      {"ResidualNormBackward", "dbeta"}));
}

}  // namespace
}  // namespace loom::core::cuda::testing
