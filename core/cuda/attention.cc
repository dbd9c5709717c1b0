#include "core/cuda/attention.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/cpu/attention_checks.h"
#include "core/cpu/philox.h"
#include "core/cuda/blas.h"
#include "core/cuda/check.h"
#include "core/cuda/check_args.h"

namespace loom::core::cuda {
namespace {

using cpu::AttentionDims;
using cpu::AttentionSaved;

// Each kernel's own launch limits: the s x s kernel's row kernels run one
// block per probability row; the flash kernel holds a head in shared memory
// and puts the pairs on the grid's y dimension.
absl::Status CheckLaunchLimits(const char* op, AttentionSaved kind, const AttentionDims& g) {
  if (kind == AttentionSaved::kProbs) {
    return internal::CheckRows(op, "probability rows (b * heads * s)", g.b * g.heads * g.s);
  }
  if (g.d > kernels::kFlashMaxHeadDim || g.b * g.heads > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": head dim ", g.d, " and b * heads = ", g.b * g.heads, ": the CUDA flash kernel needs "
        "head dim <= ", kernels::kFlashMaxHeadDim, " and b * heads <= 65535"));
  }
  return absl::OkStatus();
}

// Every wrapper's checks, all before any CUDA call: dtypes (the activations
// f32 or bf16, one dtype; probs in that dtype, lse always f32), the shape
// contract of cpu/attention_checks.h, the launch limits, then placement.
absl::StatusOr<AttentionDims> CheckForward(const char* op, const Tensor& qkv, int64_t heads,
                                           Tensor* out, AttentionSaved kind, Tensor* saved,
                                           const cpu::AttentionDropout& dropout) {
  const bool probs = kind == AttentionSaved::kProbs;
  const char* saved_name = ops::SavedName(kind);
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(op, "qkv", qkv));
  LOOM_RETURN_IF_ERROR(internal::CheckFloatOut(op, "out", out));
  if (probs) LOOM_RETURN_IF_ERROR(internal::CheckFloatOut(op, saved_name, saved));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(op, "qkv", qkv, "out", *out));
  if (probs) LOOM_RETURN_IF_ERROR(internal::CheckSameDType(op, "qkv", qkv, saved_name, *saved));
  if (!probs) LOOM_RETURN_IF_ERROR(internal::CheckIs(op, saved_name, saved, DType::kF32));
  LOOM_ASSIGN_OR_RETURN(const AttentionDims g, ops::CheckAttentionForwardShapes(
                                                   op, qkv, heads, *out, kind, *saved, dropout));
  LOOM_RETURN_IF_ERROR(CheckLaunchLimits(op, kind, g));
  LOOM_RETURN_IF_ERROR(
      internal::CheckDevices(op, {{"qkv", &qkv}, {"out", out}, {saved_name, saved}}));
  return g;
}

// As CheckForward; `out` is the flash backward's input (null for the s x s kernel).
absl::StatusOr<AttentionDims> CheckBackward(const char* op, const Tensor& dout, const Tensor& qkv,
                                            const Tensor* out, AttentionSaved kind,
                                            const Tensor& saved, int64_t heads, Tensor* dqkv,
                                            const cpu::AttentionDropout& dropout) {
  const bool probs = kind == AttentionSaved::kProbs;
  const char* saved_name = ops::SavedName(kind);
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(op, "dout", dout));
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(op, "qkv", qkv));
  if (out != nullptr) LOOM_RETURN_IF_ERROR(internal::CheckFloat(op, "out", *out));
  if (probs) LOOM_RETURN_IF_ERROR(internal::CheckFloat(op, saved_name, saved));
  LOOM_RETURN_IF_ERROR(internal::CheckFloatOut(op, "dqkv", dqkv));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(op, "qkv", qkv, "dout", dout));
  if (out != nullptr) LOOM_RETURN_IF_ERROR(internal::CheckSameDType(op, "qkv", qkv, "out", *out));
  if (probs) LOOM_RETURN_IF_ERROR(internal::CheckSameDType(op, "qkv", qkv, saved_name, saved));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(op, "qkv", qkv, "dqkv", *dqkv));
  if (!probs) LOOM_RETURN_IF_ERROR(internal::CheckIs(op, saved_name, &saved, DType::kF32));
  LOOM_ASSIGN_OR_RETURN(const AttentionDims g,
                        ops::CheckAttentionBackwardShapes(op, dout, qkv, out, kind, saved, heads,
                                                          *dqkv, dropout));
  LOOM_RETURN_IF_ERROR(CheckLaunchLimits(op, kind, g));
  // A null `out` is skipped.
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(
      op, {{"dout", &dout}, {"qkv", &qkv}, {"out", out}, {saved_name, &saved}, {"dqkv", dqkv}}));
  return g;
}

using internal::ElementAt;

// The kernels' mask with packed documents' starts on the device: the
// caller's copy (AttentionDropout::device_doc_start, made once per
// micro-batch), else doc_start (host) copied into *copy on the stream.
absl::StatusOr<kernels::AttentionMask> DeviceMask(const cpu::AttentionDropout& dropout,
                                                  const AttentionDims& g, cudaStream_t stream,
                                                  Tensor* copy) {
  kernels::AttentionMask mask = internal::AttentionMaskOf(dropout, g.heads);
  if (dropout.device_doc_start != nullptr) {
    mask.doc_start = dropout.device_doc_start;
  } else if (dropout.doc_start != nullptr) {
    LOOM_ASSIGN_OR_RETURN(*copy, internal::Scratch(Shape{g.b * g.s}, DType::kI32));
    // Pageable host memory: staged before the call returns, so the caller
    // may free its table at once.
    LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(copy->raw_data(), dropout.doc_start,
                                              g.b * g.s * sizeof(int32_t),
                                              cudaMemcpyHostToDevice, stream));
    mask.doc_start = copy->data<int32_t>();
  }
  return mask;
}


// One GEMM per (batch, head) pair; pair p = bi * heads + h, whose q/k/v rows
// start at element 3 d p of qkv (row stride b heads 3 d), its out rows at d p
// (row stride b heads d), its probabilities at s s p.
internal::GemmArgs PairGemm(const AttentionDims& g, DType dtype) {
  internal::GemmArgs a;
  a.batch = g.b * g.heads;
  a.ab = dtype;
  a.c_dtype = dtype;
  return a;
}

// Causal attention only needs the lower triangle of the s x s matrices: the
// GEMMs run block by block (kCausalBlock queries, or keys, at a time), each
// over the part the block can see — about half the work of full s x s
// products at long sequences. The row kernels read only columns <= row and
// write zeros above the diagonal, so what the block GEMMs leave unwritten
// above a diagonal block is never read.
constexpr int64_t kCausalBlock = 256;

template <typename F>
absl::Status ForCausalBlocks(int64_t s, F f) {
  for (int64_t r0 = 0; r0 < s; r0 += kCausalBlock) {
    LOOM_RETURN_IF_ERROR(f(r0, std::min(kCausalBlock, s - r0)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AttentionForward(const Tensor& qkv, int64_t heads, Tensor* out, Tensor* probs,
                              const cpu::AttentionDropout& dropout) {
  constexpr const char* kOp = "AttentionForward";
  LOOM_ASSIGN_OR_RETURN(
      const AttentionDims g,
      CheckForward(kOp, qkv, heads, out, AttentionSaved::kProbs, probs, dropout));
  if (g.s == 0 || g.b == 0) return absl::OkStatus();
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  const DType dt = qkv.dtype();
  const int64_t ld_qkv = g.b * g.heads * 3 * g.d, ld_out = g.b * g.heads * g.d;
  const int64_t pairs = g.b * g.heads, ss = g.s * g.s;
  Tensor doc_copy;
  LOOM_ASSIGN_OR_RETURN(const kernels::AttentionMask mask,
                        DeviceMask(dropout, g, stream, &doc_copy));

  // probs = scale * Q Kᵀ (the raw scores; the row kernel turns them into probabilities).
  // Query rows [r0, r0 + rows) against keys [0, r0 + rows).
  LOOM_RETURN_IF_ERROR(ForCausalBlocks(g.s, [&](int64_t r0, int64_t rows) {
    internal::GemmArgs qk = PairGemm(g, dt);
    qk.trans_b = true;
    qk.m = rows, qk.n = r0 + rows, qk.k = g.d;
    qk.alpha = 1.0f / std::sqrt(static_cast<float>(g.d));
    qk.a = ElementAt(qkv, r0 * ld_qkv), qk.lda = ld_qkv, qk.stride_a = 3 * g.d;
    qk.b = ElementAt(qkv, g.d), qk.ldb = ld_qkv, qk.stride_b = 3 * g.d;
    qk.c = ElementAt(probs, r0 * g.s), qk.ldc = g.s, qk.stride_c = ss;
    return internal::Gemm(kOp, qk);
  }));

  Tensor dropped;
  if (mask.dropout) {
    LOOM_ASSIGN_OR_RETURN(dropped, internal::Scratch(probs->shape(), dt));
  }
  LOOM_CUDA_LAUNCH(kOp, kernels::CausalSoftmaxForward(internal::ElemOf(dt), probs->raw_data(),
                                                      mask.dropout ? dropped.raw_data() : nullptr,
                                                      pairs, g.s, mask, stream));

  // out = P V, P after dropout.
  const Tensor& p = mask.dropout ? dropped : *probs;
  return ForCausalBlocks(g.s, [&](int64_t r0, int64_t rows) {
    internal::GemmArgs pv = PairGemm(g, dt);
    pv.m = rows, pv.n = g.d, pv.k = r0 + rows;
    pv.a = ElementAt(p, r0 * g.s), pv.lda = g.s, pv.stride_a = ss;
    pv.b = ElementAt(qkv, 2 * g.d), pv.ldb = ld_qkv, pv.stride_b = 3 * g.d;
    pv.c = ElementAt(out, r0 * ld_out), pv.ldc = ld_out, pv.stride_c = g.d;
    return internal::Gemm(kOp, pv);
  });
}

absl::Status AttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& probs,
                               int64_t heads, Tensor* dqkv, const cpu::AttentionDropout& dropout) {
  constexpr const char* kOp = "AttentionBackward";
  LOOM_ASSIGN_OR_RETURN(const AttentionDims g,
                        CheckBackward(kOp, dout, qkv, /*out=*/nullptr, AttentionSaved::kProbs,
                                      probs, heads, dqkv, dropout));
  if (g.s == 0 || g.b == 0) return absl::OkStatus();
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  const DType dt = qkv.dtype();
  const int64_t ld_qkv = g.b * g.heads * 3 * g.d, ld_out = g.b * g.heads * g.d;
  const int64_t pairs = g.b * g.heads, ss = g.s * g.s;
  Tensor doc_copy;
  LOOM_ASSIGN_OR_RETURN(const kernels::AttentionMask mask,
                        DeviceMask(dropout, g, stream, &doc_copy));
  const float scale = 1.0f / std::sqrt(static_cast<float>(g.d));

  LOOM_ASSIGN_OR_RETURN(Tensor ds, internal::Scratch(probs.shape(), dt));
  Tensor dropped;
  if (mask.dropout) {
    LOOM_ASSIGN_OR_RETURN(dropped, internal::Scratch(probs.shape(), dt));
  }
  // ds = dP = dO Vᵀ (the gradient of the dropped probabilities).
  LOOM_RETURN_IF_ERROR(ForCausalBlocks(g.s, [&](int64_t r0, int64_t rows) {
    internal::GemmArgs dp = PairGemm(g, dt);
    dp.trans_b = true;
    dp.m = rows, dp.n = r0 + rows, dp.k = g.d;
    dp.a = ElementAt(dout, r0 * ld_out), dp.lda = ld_out, dp.stride_a = g.d;
    dp.b = ElementAt(qkv, 2 * g.d), dp.ldb = ld_qkv, dp.stride_b = 3 * g.d;
    dp.c = ElementAt(&ds, r0 * g.s), dp.ldc = g.s, dp.stride_c = ss;
    return internal::Gemm(kOp, dp);
  }));
  // ds = dS = scale P (dP' - rowsum(P dP')), dropped = P keep / (1 - p).
  LOOM_CUDA_LAUNCH(kOp, kernels::CausalSoftmaxBackward(
                            internal::ElemOf(dt), probs.raw_data(), ds.raw_data(),
                            mask.dropout ? dropped.raw_data() : nullptr, pairs, g.s, scale, mask,
                            stream));
  // dQ = dS K
  LOOM_RETURN_IF_ERROR(ForCausalBlocks(g.s, [&](int64_t r0, int64_t rows) {
    internal::GemmArgs dq = PairGemm(g, dt);
    dq.m = rows, dq.n = g.d, dq.k = r0 + rows;
    dq.a = ElementAt(ds, r0 * g.s), dq.lda = g.s, dq.stride_a = ss;
    dq.b = ElementAt(qkv, g.d), dq.ldb = ld_qkv, dq.stride_b = 3 * g.d;
    dq.c = ElementAt(dqkv, r0 * ld_qkv), dq.ldc = ld_qkv, dq.stride_c = 3 * g.d;
    return internal::Gemm(kOp, dq);
  }));
  // dK = dSᵀ Q
  // Key columns [c0, c0 + cols) are seen only by queries c0..s-1.
  LOOM_RETURN_IF_ERROR(ForCausalBlocks(g.s, [&](int64_t c0, int64_t cols) {
    internal::GemmArgs dk = PairGemm(g, dt);
    dk.trans_a = true;
    dk.m = cols, dk.n = g.d, dk.k = g.s - c0;
    dk.a = ElementAt(ds, c0 * g.s + c0), dk.lda = g.s, dk.stride_a = ss;
    dk.b = ElementAt(qkv, c0 * ld_qkv), dk.ldb = ld_qkv, dk.stride_b = 3 * g.d;
    dk.c = ElementAt(dqkv, c0 * ld_qkv + g.d), dk.ldc = ld_qkv, dk.stride_c = 3 * g.d;
    return internal::Gemm(kOp, dk);
  }));
  // dV = Pᵀ dO, P after dropout.
  const Tensor& p = mask.dropout ? dropped : probs;
  return ForCausalBlocks(g.s, [&](int64_t c0, int64_t cols) {
    internal::GemmArgs dv = PairGemm(g, dt);
    dv.trans_a = true;
    dv.m = cols, dv.n = g.d, dv.k = g.s - c0;
    dv.a = ElementAt(p, c0 * g.s + c0), dv.lda = g.s, dv.stride_a = ss;
    dv.b = ElementAt(dout, c0 * ld_out), dv.ldb = ld_out, dv.stride_b = g.d;
    dv.c = ElementAt(dqkv, c0 * ld_qkv + 2 * g.d), dv.ldc = ld_qkv, dv.stride_c = 3 * g.d;
    return internal::Gemm(kOp, dv);
  });
}

absl::Status FlashAttentionForward(const Tensor& qkv, int64_t heads, Tensor* out, Tensor* lse,
                                   const cpu::AttentionDropout& dropout) {
  constexpr const char* kOp = "FlashAttentionForward";
  LOOM_ASSIGN_OR_RETURN(const AttentionDims g,
                        CheckForward(kOp, qkv, heads, out, AttentionSaved::kLse, lse, dropout));
  if (g.s == 0 || g.b == 0) return absl::OkStatus();
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  Tensor doc_copy;
  LOOM_ASSIGN_OR_RETURN(const kernels::AttentionMask mask,
                        DeviceMask(dropout, g, stream, &doc_copy));
  LOOM_CUDA_LAUNCH(kOp, kernels::FlashAttentionForward(internal::ElemOf(qkv.dtype()), qkv.raw_data(),
                                                       out->raw_data(), lse->data<float>(), g.s,
                                                       g.b, g.d, mask, stream));
  return absl::OkStatus();
}

absl::Status FlashAttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                    const Tensor& lse, int64_t heads, Tensor* dqkv,
                                    const cpu::AttentionDropout& dropout) {
  constexpr const char* kOp = "FlashAttentionBackward";
  LOOM_ASSIGN_OR_RETURN(
      const AttentionDims g,
      CheckBackward(kOp, dout, qkv, &out, AttentionSaved::kLse, lse, heads, dqkv, dropout));
  if (g.s == 0 || g.b == 0) return absl::OkStatus();
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_ASSIGN_OR_RETURN(Tensor delta, internal::Scratch(Shape{g.b, g.heads, g.s}, DType::kF32));
  Tensor doc_copy;
  LOOM_ASSIGN_OR_RETURN(const kernels::AttentionMask mask,
                        DeviceMask(dropout, g, stream, &doc_copy));
  LOOM_CUDA_LAUNCH(kOp, kernels::FlashAttentionBackward(
                            internal::ElemOf(qkv.dtype()), dout.raw_data(), qkv.raw_data(),
                            out.raw_data(), lse.data<float>(), delta.data<float>(),
                            dqkv->raw_data(), g.s, g.b, g.d, mask, stream));
  return absl::OkStatus();
}

}  // namespace loom::core::cuda
