// cuDNN attention against the CPU flash kernel (core/cpu/flash_attention.h,
// f32 on the same bf16-rounded inputs). The refusal cases run everywhere and
// use CPU tensors: they must be answered before any CUDA or cuDNN call. The
// comparisons skip (with the reason) without a GPU.
//
// Tolerance (bf16): out and dQ/dK/dV within 2e-2 of the largest reference
// magnitude (cpu::testing::RelError); lse within 1e-2 absolute (f32 output,
// differences only from bf16 rounding of O and summation order).
#include "core/cuda/cudnn/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/cpu/flash_attention.h"
#include "core/cpu/test_util.h"
#include "core/cuda/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cuda::cudnn {
namespace {

using ::loom::core::cpu::testing::Make;
using ::loom::core::cuda::testing::Download;
using ::loom::core::cuda::testing::Poisoned;
using ::loom::core::cuda::testing::Random;
using ::loom::core::cuda::testing::RelError;
using ::loom::core::cuda::testing::RoundedTo;
using ::loom::core::cuda::testing::ToCpuF32;
using ::loom::core::cuda::testing::ToGpu;

constexpr double kActTol = 2e-2;
constexpr double kLseTol = 1e-2;

bool Contains(const absl::Status& st, const std::string& needle) {
  return std::string(st.message()).find(needle) != std::string::npos;
}

// ---- Refusals before any device work (CPU tensors; no GPU needed) ---------

TEST(CudnnAttentionRefusalTest, F32IsUnimplemented) {
  const int64_t s = 8, b = 2, h = 2, d = 64;
  Tensor qkv = Make({s, b, h * 3 * d}), out = Make({s, b, h * d}), lse = Make({b, h, s});
  absl::Status st = FlashAttentionForward(qkv, h, &out, &lse);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
  EXPECT_TRUE(Contains(st, "bf16")) << st;
  Tensor dqkv = Make({s, b, h * 3 * d});
  st = FlashAttentionBackward(out, qkv, out, lse, h, &dqkv);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
}

TEST(CudnnAttentionRefusalTest, DropoutIsUnimplemented) {
  const int64_t s = 8, b = 2, h = 2, d = 64;
  Tensor qkv = Make({s, b, h * 3 * d}, DType::kBF16), out = Make({s, b, h * d}, DType::kBF16);
  Tensor lse = Make({b, h, s});
  cpu::AttentionDropout dropout;
  dropout.p = 0.1f;
  absl::Status st = FlashAttentionForward(qkv, h, &out, &lse, dropout);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
  EXPECT_TRUE(Contains(st, "dropout")) << st;
  Tensor q = Make({s, b, 4 * d}, DType::kBF16), kv = Make({s, b, 2 * d}, DType::kBF16);
  Tensor out4 = Make({s, b, 4 * d}, DType::kBF16), lse4 = Make({b, 4, s});
  st = GqaAttentionForward(q, kv, kv, 4, 2, &out4, &lse4, dropout);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
  EXPECT_TRUE(Contains(st, "dropout")) << st;
  dropout.p = 1.5f;
  st = FlashAttentionForward(qkv, h, &out, &lse, dropout);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
}

// Packed documents: refused before any work, so the plan runs the reference
// (which takes them) instead of attending across documents.
TEST(CudnnAttentionRefusalTest, PackedDocumentsAreUnimplemented) {
  const int64_t s = 8, b = 1, h = 2, d = 64;
  Tensor qkv = Make({s, b, h * 3 * d}, DType::kBF16), out = Make({s, b, h * d}, DType::kBF16);
  Tensor lse = Make({b, h, s});
  const int32_t starts[s] = {0, 0, 0, 3, 3, 5, 5, 5};
  cpu::AttentionDropout dropout;
  dropout.doc_start = starts;
  absl::Status st = SupportsDocuments(dropout);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
  EXPECT_TRUE(Contains(st, "--reset-attention-mask")) << st;
  st = FlashAttentionForward(qkv, h, &out, &lse, dropout);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
  dropout.doc_start = nullptr;
  EXPECT_TRUE(SupportsDocuments(dropout).ok());
}

TEST(CudnnAttentionRefusalTest, LargeOrOddHeadDimIsUnimplemented) {
  for (int64_t d : {256, 12}) {
    const int64_t s = 4, b = 1, h = 2;
    Tensor qkv = Make({s, b, h * 3 * d}, DType::kBF16), out = Make({s, b, h * d}, DType::kBF16);
    Tensor lse = Make({b, h, s});
    const absl::Status st = FlashAttentionForward(qkv, h, &out, &lse);
    EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
    EXPECT_TRUE(Contains(st, "head dim")) << st;
  }
}

TEST(CudnnAttentionRefusalTest, MismatchedShapesAreInvalidArgument) {
  const int64_t s = 8, b = 2, h = 2, d = 64;
  Tensor qkv = Make({s, b, h * 3 * d}, DType::kBF16), lse = Make({b, h, s});
  Tensor bad_out = Make({s, b, h * d + 8}, DType::kBF16);
  EXPECT_EQ(FlashAttentionForward(qkv, h, &bad_out, &lse).code(),
            absl::StatusCode::kInvalidArgument);
  Tensor out = Make({s, b, h * d}, DType::kBF16), bad_lse = Make({b, h, s + 1});
  EXPECT_EQ(FlashAttentionForward(qkv, h, &out, &bad_lse).code(),
            absl::StatusCode::kInvalidArgument);
  Tensor bf16_lse = Make({b, h, s}, DType::kBF16);
  EXPECT_EQ(FlashAttentionForward(qkv, h, &out, &bf16_lse).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FlashAttentionForward(qkv, 5, &out, &lse).code(),
            absl::StatusCode::kInvalidArgument);  // width not heads * 3 * d
  Tensor dqkv = Make({s, b, h * 3 * d - 3}, DType::kBF16);
  EXPECT_EQ(FlashAttentionBackward(out, qkv, out, lse, h, &dqkv).code(),
            absl::StatusCode::kInvalidArgument);
  // GQA: k narrower than groups * d, heads not a multiple of groups.
  Tensor q = Make({s, b, 4 * d}, DType::kBF16), k = Make({s, b, 2 * d}, DType::kBF16);
  Tensor narrow = Make({s, b, d}, DType::kBF16);
  Tensor out4 = Make({s, b, 4 * d}, DType::kBF16), lse4 = Make({b, 4, s});
  EXPECT_EQ(GqaAttentionForward(q, narrow, k, 4, 2, &out4, &lse4).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GqaAttentionForward(q, k, k, 4, 3, &out4, &lse4).code(),
            absl::StatusCode::kInvalidArgument);
  Tensor f32_v = Make({s, b, 2 * d});
  EXPECT_EQ(GqaAttentionForward(q, k, f32_v, 4, 2, &out4, &lse4).code(),
            absl::StatusCode::kInvalidArgument);  // mixed dtypes
}

// Supported in every respect but placement: refused as CPU tensors, still
// before any CUDA or cuDNN call.
TEST(CudnnAttentionRefusalTest, CpuTensorsAreInvalidArgument) {
  const int64_t s = 8, b = 2, h = 2, d = 64;
  Tensor qkv = Make({s, b, h * 3 * d}, DType::kBF16), out = Make({s, b, h * d}, DType::kBF16);
  Tensor lse = Make({b, h, s});
  const absl::Status st = FlashAttentionForward(qkv, h, &out, &lse);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(Contains(st, "CUDA device")) << st;
}

TEST(CudnnAttentionRefusalTest, LoadedVersionIsCudnn9OrFailedPrecondition) {
  const absl::StatusOr<int64_t> v = LoadedCudnnVersion();
  if (v.ok()) {
    EXPECT_GE(*v, 90000);
  } else {
    EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(Contains(v.status(), "libcudnn.so.9")) << v.status();
  }
}

// ---- GPU: against the CPU flash kernel ------------------------------------

#define REQUIRE_GPU_AND_CUDNN()                                                  \
  do {                                                                           \
    LOOM_REQUIRE_GPU();                                                          \
    const absl::StatusOr<int64_t> v_ = LoadedCudnnVersion();                     \
    if (!v_.ok()) GTEST_SKIP() << "needs libcudnn.so.9: " << v_.status();         \
  } while (0)

struct Dims {
  int64_t s, b, heads, groups, d;
};

std::vector<Dims> Shapes(bool gqa) {
  std::vector<Dims> out;
  for (int64_t s : {1, 7, 128, 1000, 2048}) {
    for (int64_t d : {64, 128}) {
      const int64_t b = s >= 1000 ? 1 : 2;
      out.push_back(gqa ? Dims{s, b, 8, 2, d} : Dims{s, b, 4, 4, d});
    }
  }
  return out;
}

std::string Name(const Dims& g) {
  return "s" + std::to_string(g.s) + " b" + std::to_string(g.b) + " h" +
         std::to_string(g.heads) + " g" + std::to_string(g.groups) + " d" + std::to_string(g.d);
}

// Each element within tol of the reference (absolute).
double MaxAbsDiff(const Tensor& got, const Tensor& want) {
  double m = 0;
  const float* a = got.data<float>();
  const float* b = want.data<float>();
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double diff = std::abs(static_cast<double>(a[i]) - b[i]);
    if (!(diff <= m)) m = diff;  // NaN propagates as NaN
  }
  return m;
}

TEST(CudnnAttentionGpuTest, InterleavedMatchesCpuFlash) {
  REQUIRE_GPU_AND_CUDNN();
  uint64_t seed = 1;
  for (const Dims& g : Shapes(false)) {
    SCOPED_TRACE(Name(g));
    const Tensor qkv = RoundedTo(Random({g.s, g.b, g.heads * 3 * g.d}, seed++), DType::kBF16);
    const Tensor dout = RoundedTo(Random({g.s, g.b, g.heads * g.d}, seed++), DType::kBF16);
    Tensor out_ref = Make({g.s, g.b, g.heads * g.d}), lse_ref = Make({g.b, g.heads, g.s});
    LOOM_ASSERT_OK(cpu::FlashAttentionForward(qkv, g.heads, &out_ref, &lse_ref));
    Tensor dqkv_ref = Make(qkv.shape());
    LOOM_ASSERT_OK(cpu::FlashAttentionBackward(dout, qkv, out_ref, lse_ref, g.heads, &dqkv_ref));

    const Tensor qkv_g = ToGpu(qkv, DType::kBF16), dout_g = ToGpu(dout, DType::kBF16);
    Tensor out = Poisoned(out_ref.shape(), DType::kBF16), lse = Poisoned(lse_ref.shape(), DType::kF32);
    LOOM_ASSERT_OK(FlashAttentionForward(qkv_g, g.heads, &out, &lse));
    EXPECT_LE(RelError(ToCpuF32(out), out_ref), kActTol);
    EXPECT_LE(MaxAbsDiff(ToCpuF32(lse), lse_ref), kLseTol);
    Tensor dqkv = Poisoned(qkv.shape(), DType::kBF16);
    LOOM_ASSERT_OK(FlashAttentionBackward(dout_g, qkv_g, out, lse, g.heads, &dqkv));
    EXPECT_LE(RelError(ToCpuF32(dqkv), dqkv_ref), kActTol);
  }
}

// GQA through separate q / k / v. Reference: K/V expanded to every query head
// in an interleaved qkv, the CPU flash kernel, dK/dV summed over each group.
TEST(CudnnAttentionGpuTest, GqaMatchesCpuFlash) {
  REQUIRE_GPU_AND_CUDNN();
  uint64_t seed = 100;
  for (const Dims& g : Shapes(true)) {
    SCOPED_TRACE(Name(g));
    const int64_t rep = g.heads / g.groups, d = g.d, rows = g.s * g.b;
    const Tensor q = RoundedTo(Random({g.s, g.b, g.heads * d}, seed++), DType::kBF16);
    const Tensor k = RoundedTo(Random({g.s, g.b, g.groups * d}, seed++), DType::kBF16);
    const Tensor v = RoundedTo(Random({g.s, g.b, g.groups * d}, seed++), DType::kBF16);
    const Tensor dout = RoundedTo(Random({g.s, g.b, g.heads * d}, seed++), DType::kBF16);
    Tensor qkv = Make({g.s, g.b, g.heads * 3 * d});
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t h = 0; h < g.heads; ++h) {
        float* dst = qkv.data<float>() + (r * g.heads + h) * 3 * d;
        const int64_t grp = h / rep;
        for (int64_t e = 0; e < d; ++e) {
          dst[e] = q.data<float>()[(r * g.heads + h) * d + e];
          dst[d + e] = k.data<float>()[(r * g.groups + grp) * d + e];
          dst[2 * d + e] = v.data<float>()[(r * g.groups + grp) * d + e];
        }
      }
    }
    Tensor out_ref = Make({g.s, g.b, g.heads * d}), lse_ref = Make({g.b, g.heads, g.s});
    LOOM_ASSERT_OK(cpu::FlashAttentionForward(qkv, g.heads, &out_ref, &lse_ref));
    Tensor dqkv = Make(qkv.shape());
    LOOM_ASSERT_OK(cpu::FlashAttentionBackward(dout, qkv, out_ref, lse_ref, g.heads, &dqkv));
    Tensor dq_ref = Make(q.shape()), dk_ref = Make(k.shape()), dv_ref = Make(v.shape());
    std::fill(dk_ref.data<float>(), dk_ref.data<float>() + dk_ref.numel(), 0.0f);
    std::fill(dv_ref.data<float>(), dv_ref.data<float>() + dv_ref.numel(), 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t h = 0; h < g.heads; ++h) {
        const float* src = dqkv.data<float>() + (r * g.heads + h) * 3 * d;
        const int64_t grp = h / rep;
        for (int64_t e = 0; e < d; ++e) {
          dq_ref.data<float>()[(r * g.heads + h) * d + e] = src[e];
          dk_ref.data<float>()[(r * g.groups + grp) * d + e] += src[d + e];
          dv_ref.data<float>()[(r * g.groups + grp) * d + e] += src[2 * d + e];
        }
      }
    }

    const Tensor qg = ToGpu(q, DType::kBF16), kg = ToGpu(k, DType::kBF16);
    const Tensor vg = ToGpu(v, DType::kBF16), doutg = ToGpu(dout, DType::kBF16);
    Tensor out = Poisoned(out_ref.shape(), DType::kBF16), lse = Poisoned(lse_ref.shape(), DType::kF32);
    LOOM_ASSERT_OK(GqaAttentionForward(qg, kg, vg, g.heads, g.groups, &out, &lse));
    EXPECT_LE(RelError(ToCpuF32(out), out_ref), kActTol);
    EXPECT_LE(MaxAbsDiff(ToCpuF32(lse), lse_ref), kLseTol);
    Tensor dq = Poisoned(q.shape(), DType::kBF16), dk = Poisoned(k.shape(), DType::kBF16);
    Tensor dv = Poisoned(v.shape(), DType::kBF16);
    LOOM_ASSERT_OK(GqaAttentionBackward(doutg, qg, kg, vg, out, lse, g.heads, g.groups, &dq, &dk, &dv));
    EXPECT_LE(RelError(ToCpuF32(dq), dq_ref), kActTol);
    EXPECT_LE(RelError(ToCpuF32(dk), dk_ref), kActTol);
    EXPECT_LE(RelError(ToCpuF32(dv), dv_ref), kActTol);
  }
}

// The deterministic backward: two runs give the same bits.
TEST(CudnnAttentionGpuTest, BackwardIsDeterministic) {
  REQUIRE_GPU_AND_CUDNN();
  const int64_t s = 1000, b = 2, h = 4, d = 64;
  const Tensor qkv = ToGpu(Random({s, b, h * 3 * d}, 7), DType::kBF16);
  const Tensor dout = ToGpu(Random({s, b, h * d}, 8), DType::kBF16);
  Tensor out = Poisoned({s, b, h * d}, DType::kBF16), lse = Poisoned({b, h, s}, DType::kF32);
  LOOM_ASSERT_OK(FlashAttentionForward(qkv, h, &out, &lse));
  Tensor d1 = Poisoned(qkv.shape(), DType::kBF16), d2 = Poisoned(qkv.shape(), DType::kBF16);
  LOOM_ASSERT_OK(FlashAttentionBackward(dout, qkv, out, lse, h, &d1));
  LOOM_ASSERT_OK(FlashAttentionBackward(dout, qkv, out, lse, h, &d2));
  const Tensor a = Download(d1), c = Download(d2);
  EXPECT_EQ(std::memcmp(a.raw_data(), c.raw_data(), a.nbytes()), 0);
}

}  // namespace
}  // namespace loom::core::cuda::cudnn
