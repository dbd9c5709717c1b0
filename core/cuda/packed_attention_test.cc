// Packed documents (AttentionDropout::doc_start) in the CUDA attention
// kernels, the s x s one and the flash one, forward and backward, against the
// CPU kernel of the same contract on the same rows: several documents per
// row, documents crossing the flash kernel's tiles (64 and 32 rows) and the
// s x s kernel's 256-row GEMM blocks, 1-token documents, a document starting
// at a tile's first row. Skips without a GPU.

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cpu/attention.h"
#include "core/cpu/attention_checks.h"
#include "core/cpu/flash_attention.h"
#include "core/cuda/attention.h"
#include "core/cuda/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cuda::testing {
namespace {

using cpu::AttentionSaved;

// As attention_test.cc: f32 3e-5 (another summation order, expf); bf16: the
// s x s kernel keeps scores and probabilities in bf16 (2e-2 out, 3e-2 dqkv),
// the flash kernel only rounds what it stores (1e-2).
constexpr double kF32Tol = 3e-5;
struct Kernel {
  AttentionSaved saved;
  float bf16_range;
  double bf16_out_tol, bf16_dqkv_tol;
};
constexpr Kernel kProbsKernel{AttentionSaved::kProbs, 1.0f, 2e-2, 3e-2};
constexpr Kernel kFlashKernel{AttentionSaved::kLse, 2.0f, 1e-2, 1e-2};

// doc_start [b, s] from each row's document lengths (they sum to s).
std::vector<int32_t> DocStarts(const std::vector<std::vector<int>>& rows) {
  std::vector<int32_t> starts;
  for (const std::vector<int>& lengths : rows) {
    int32_t first = 0;
    for (int n : lengths) {
      for (int k = 0; k < n; ++k) starts.push_back(first);
      first += n;
    }
  }
  return starts;
}

absl::Status Forward(AttentionSaved k, const Tensor& qkv, int64_t heads, Tensor* out,
                     Tensor* saved, const cpu::AttentionDropout& dr) {
  const bool gpu = qkv.device().type == DeviceType::kCUDA;
  if (k == AttentionSaved::kProbs) {
    return gpu ? cuda::AttentionForward(qkv, heads, out, saved, dr)
               : cpu::AttentionForward(qkv, heads, out, saved, dr);
  }
  return gpu ? cuda::FlashAttentionForward(qkv, heads, out, saved, dr)
             : cpu::FlashAttentionForward(qkv, heads, out, saved, dr);
}
absl::Status Backward(AttentionSaved k, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                      const Tensor& saved, int64_t heads, Tensor* dqkv,
                      const cpu::AttentionDropout& dr) {
  const bool gpu = qkv.device().type == DeviceType::kCUDA;
  if (k == AttentionSaved::kProbs) {
    return gpu ? cuda::AttentionBackward(dout, qkv, saved, heads, dqkv, dr)
               : cpu::AttentionBackward(dout, qkv, saved, heads, dqkv, dr);
  }
  return gpu ? cuda::FlashAttentionBackward(dout, qkv, out, saved, heads, dqkv, dr)
             : cpu::FlashAttentionBackward(dout, qkv, out, saved, heads, dqkv, dr);
}

struct Case {
  int64_t heads, d;
  std::vector<std::vector<int>> docs;  // per batch row, the document lengths
  float p = 0.0f;                      // attention dropout
};

// The GPU kernel against the CPU one with the same documents: forward, then
// backward from the CPU's forward (rounded to the GPU's dtypes) on both
// sides. The GPU gets the table on the host (copied per call) and, as the
// layers hand it, already on the device: the two must agree bit for bit.
void Check(const Kernel& k, const Case& c, DType dt, uint64_t seed) {
  const int64_t b = static_cast<int64_t>(c.docs.size());
  const std::vector<int32_t> starts = DocStarts(c.docs);
  const int64_t s = static_cast<int64_t>(starts.size()) / b;
  const Shape sq{s, b, c.heads * 3 * c.d}, so{s, b, c.heads * c.d};
  const Shape ss = ops::SavedShape(k.saved, {s, b, c.heads, c.d});
  const DType saved_dt = k.saved == AttentionSaved::kProbs ? dt : DType::kF32;
  const float r = dt == DType::kF32 ? 2.0f : k.bf16_range;
  const Tensor qkv = RoundedTo(Random(sq, seed, -r, r), dt);
  const Tensor dout = RoundedTo(Random(so, seed + 1), dt);
  cpu::AttentionDropout dr{c.p, 91, 3, 0, 0};
  dr.doc_start = starts.data();
  const std::string what =
      absl::StrCat(k.saved == AttentionSaved::kLse ? "flash " : "sxs ", DTypeName(dt), " s=", s,
                   " b=", b, " heads=", c.heads, " d=", c.d, " p=", c.p);

  Tensor want = CpuEmpty(so, DType::kF32), wsaved = CpuEmpty(ss, DType::kF32);
  LOOM_ASSERT_OK(Forward(k.saved, qkv, c.heads, &want, &wsaved, dr));
  const Tensor gqkv = ToGpu(qkv, dt);
  const Tensor gstarts =
      Upload(Ids(Shape{b * s}, DType::kI32, std::vector<int64_t>(starts.begin(), starts.end())));
  cpu::AttentionDropout on_device = dr;
  on_device.device_doc_start = gstarts.data<int32_t>();

  Tensor out = Poisoned(so, dt), saved = Poisoned(ss, saved_dt);
  LOOM_ASSERT_OK(Forward(k.saved, gqkv, c.heads, &out, &saved, dr));
  EXPECT_LE(RelError(ToCpuF32(out), want), Tol(dt, kF32Tol, k.bf16_out_tol)) << what;
  EXPECT_LE(RelError(ToCpuF32(saved), wsaved), Tol(saved_dt, kF32Tol, k.bf16_out_tol)) << what;
  Tensor out2 = Poisoned(so, dt), saved2 = Poisoned(ss, saved_dt);
  LOOM_ASSERT_OK(Forward(k.saved, gqkv, c.heads, &out2, &saved2, on_device));
  EXPECT_EQ(RelError(ToCpuF32(out2), ToCpuF32(out)), 0.0) << what << " (device table)";

  const Tensor o_in = RoundedTo(want, dt), s_in = RoundedTo(wsaved, saved_dt);
  Tensor wdqkv = CpuEmpty(sq, DType::kF32);
  LOOM_ASSERT_OK(Backward(k.saved, dout, qkv, o_in, s_in, c.heads, &wdqkv, dr));
  Tensor dqkv = Poisoned(sq, dt);
  LOOM_ASSERT_OK(Backward(k.saved, ToGpu(dout, dt), gqkv, ToGpu(o_in, dt), ToGpu(s_in, saved_dt),
                          c.heads, &dqkv, dr));
  EXPECT_LE(RelError(ToCpuF32(dqkv), wdqkv), Tol(dt, 2 * kF32Tol, k.bf16_dqkv_tol)) << what;
  Tensor dqkv2 = Poisoned(sq, dt);
  LOOM_ASSERT_OK(Backward(k.saved, ToGpu(dout, dt), gqkv, ToGpu(o_in, dt), ToGpu(s_in, saved_dt),
                          c.heads, &dqkv2, on_device));
  EXPECT_EQ(RelError(ToCpuF32(dqkv2), ToCpuF32(dqkv)), 0.0) << what << " (device table)";
}

void CheckAll(const Kernel& k, const std::vector<Case>& cases, uint64_t seed) {
  for (DType dt : FloatTypes()) {
    for (const Case& c : cases) Check(k, c, dt, seed += 2);
  }
}

// d 16: the flash kernel's tiles are 64 rows; d 96: 32 rows. Row 0 of the
// first case: a 1-token document, one crossing rows 63/64, another 1-token
// one, one starting at row 128 (a tile's first row), then the rest. Row 1:
// a document over three tiles and a 1-token one at the end.
std::vector<Case> TileCases(float p) {
  return {{2, 16, {{1, 70, 1, 56, 72}, {150, 49, 1}}, p},
          {1, 96, {{40, 1, 30, 1, 28}, {3, 97}}, p}};
}

// 300 rows: the s x s kernel's causal GEMM blocks are 256 rows; a document
// from 240 to 290 crosses that boundary.
std::vector<Case> GemmBlockCases() { return {{2, 16, {{1, 239, 50, 10}}, 0.0f}}; }

// Runs everywhere: on every case the CPU oracle's output with the documents
// is far from plain causal attention's, so the GPU comparisons below fail
// when a kernel ignores the documents.
TEST(CudaPackedAttentionTest, TheCasesMakeTheDocumentsMatter) {
  for (const Kernel& k : {kProbsKernel, kFlashKernel}) {
    for (const std::vector<Case>& cases :
         {TileCases(0.0f), TileCases(0.2f), GemmBlockCases()}) {
      uint64_t seed = 500;
      for (const Case& c : cases) {
        const int64_t b = static_cast<int64_t>(c.docs.size());
        const std::vector<int32_t> starts = DocStarts(c.docs);
        const int64_t s = static_cast<int64_t>(starts.size()) / b;
        const Shape sq{s, b, c.heads * 3 * c.d}, so{s, b, c.heads * c.d};
        const Shape ss = ops::SavedShape(k.saved, {s, b, c.heads, c.d});
        const Tensor qkv = Random(sq, seed += 2, -2.0f, 2.0f);
        cpu::AttentionDropout packed{c.p, 91, 3, 0, 0};
        packed.doc_start = starts.data();
        const cpu::AttentionDropout causal{c.p, 91, 3, 0, 0};
        Tensor with = CpuEmpty(so, DType::kF32), plain = CpuEmpty(so, DType::kF32);
        Tensor saved = CpuEmpty(ss, DType::kF32);
        LOOM_ASSERT_OK(Forward(k.saved, qkv, c.heads, &with, &saved, packed));
        LOOM_ASSERT_OK(Forward(k.saved, qkv, c.heads, &plain, &saved, causal));
        EXPECT_GT(RelError(plain, with), 0.05) << "s=" << s << " d=" << c.d << " p=" << c.p;
      }
    }
  }
}

TEST(CudaPackedAttentionTest, SxsMatchesCpuAcrossDocumentsAndTiles) {
  LOOM_REQUIRE_GPU();
  CheckAll(kProbsKernel, TileCases(0.0f), 1);
}

TEST(CudaPackedAttentionTest, FlashMatchesCpuAcrossDocumentsAndTiles) {
  LOOM_REQUIRE_GPU();
  CheckAll(kFlashKernel, TileCases(0.0f), 21);
}

TEST(CudaPackedAttentionTest, BothMatchCpuWithDropoutAtGlobalIndices) {
  LOOM_REQUIRE_GPU();
  CheckAll(kProbsKernel, TileCases(0.2f), 41);
  CheckAll(kFlashKernel, TileCases(0.2f), 61);
}

TEST(CudaPackedAttentionTest, DocumentCrossingTheSxsGemmBlock) {
  LOOM_REQUIRE_GPU();
  CheckAll(kProbsKernel, GemmBlockCases(), 81);
  CheckAll(kFlashKernel, GemmBlockCases(), 91);
}

}  // namespace
}  // namespace loom::core::cuda::testing
