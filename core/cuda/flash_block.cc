#include "core/cuda/flash_block.h"

#include "absl/strings/str_cat.h"
#include "core/cpu/philox.h"
#include "core/cuda/check_args.h"
#include "core/cuda/kernels.h"
#include "core/ops/contracts/attention_checks.h"
#include "core/status_macros.h"

namespace loom::core::cuda {
namespace {

using ops::FlashBlockDims;
using ops::AttentionDropout;
using ops::FlashBlockOptions;

// The flash kernels' launch limits: a head in shared memory, pairs on the grid's y.
absl::Status CheckLimits(const char* op, const FlashBlockDims& g) {
  if (g.d > kernels::kFlashMaxHeadDim || g.b * g.heads > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": head dim ", g.d, " and b * heads = ", g.b * g.heads, ": the CUDA flash kernels "
        "need head dim <= ", kernels::kFlashMaxHeadDim, " and b * heads <= 65535"));
  }
  return internal::CheckRows(op, "rows", g.rows + g.kv_rows);
}

// The ring's blocks do not take packed documents on the GPU yet (the model
// refuses context parallelism off the CPU): refused, never ignored.
absl::Status CheckNoDocuments(const char* op, const FlashBlockOptions& o) {
  if (o.dropout.doc_start == nullptr && o.dropout.device_doc_start == nullptr) {
    return absl::OkStatus();
  }
  return absl::UnimplementedError(absl::StrCat(
      op, ": packed documents (doc_start) in the CUDA ring blocks are not supported yet"));
}

absl::Status CheckState(const char* op, const Tensor* acc, const Tensor* max, const Tensor* sum) {
  LOOM_RETURN_IF_ERROR(internal::CheckIs(op, "acc", acc, DType::kF32));
  LOOM_RETURN_IF_ERROR(internal::CheckIs(op, "max", max, DType::kF32));
  return internal::CheckIs(op, "sum", sum, DType::kF32);
}

using internal::ElementAt;


// Every query precedes every key: the block adds nothing.
bool Skipped(const FlashBlockOptions& o) {
  return o.q_len == 0 || o.k_len == 0 || (o.causal && o.k_start > o.q_start + o.q_len - 1);
}

kernels::FlashBlockArgs Args(const FlashBlockDims& g, const FlashBlockOptions& o,
                             const Tensor& qkv, const Tensor& kv) {
  kernels::FlashBlockArgs a;
  a.q = ElementAt(qkv, o.q_row * g.b * g.heads * 3 * g.d);
  a.kv = ElementAt(kv, o.k_row * g.b * g.heads * 2 * g.d);
  a.b = g.b;
  a.d = g.d;
  a.q_len = o.q_len;
  a.k_len = o.k_len;
  a.st_rows = g.rows;
  a.q_start = o.q_start;
  a.k_start = o.k_start;
  a.seq_len = o.seq_len;
  a.causal = o.causal;
  return a;
}

}  // namespace

absl::Status FlashBlockInit(Tensor* acc, Tensor* max, Tensor* sum) {
  constexpr char kOp[] = "FlashBlockInit";
  LOOM_RETURN_IF_ERROR(CheckState(kOp, acc, max, sum));
  LOOM_ASSIGN_OR_RETURN(const FlashBlockDims g, ops::CheckFlashStateAlone(kOp, *acc, *max, *sum));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(kOp, {{"acc", acc}, {"max", max}, {"sum", sum}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_CUDA_LAUNCH(kOp, kernels::FlashBlockInit(acc->data<float>(), max->data<float>(),
                                                sum->data<float>(), g.b * g.heads * g.rows, g.d,
                                                stream));
  return absl::OkStatus();
}

absl::Status FlashBlockForward(const Tensor& qkv, const Tensor& kv, const FlashBlockOptions& o,
                               Tensor* acc, Tensor* max, Tensor* sum) {
  constexpr char kOp[] = "FlashBlockForward";
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "qkv", qkv));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "qkv", qkv, "kv", kv));
  LOOM_RETURN_IF_ERROR(CheckState(kOp, acc, max, sum));
  LOOM_ASSIGN_OR_RETURN(const FlashBlockDims g, ops::CheckFlashBlock(kOp, qkv, kv, o));
  LOOM_RETURN_IF_ERROR(ops::CheckFlashState(kOp, g, *acc, *max, *sum));
  LOOM_RETURN_IF_ERROR(CheckLimits(kOp, g));
  LOOM_RETURN_IF_ERROR(CheckNoDocuments(kOp, o));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(
      kOp, {{"qkv", &qkv}, {"kv", &kv}, {"acc", acc}, {"max", max}, {"sum", sum}}));
  if (Skipped(o) || g.b == 0) return absl::OkStatus();
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  const int64_t first = o.q_row;  // the state's rows start at the block's first query
  LOOM_CUDA_LAUNCH(kOp, kernels::FlashBlockForward(
                            internal::ElemOf(qkv.dtype()), Args(g, o, qkv, kv),
                            acc->data<float>() + first * g.d, max->data<float>() + first,
                            sum->data<float>() + first, internal::AttentionMaskOf(o.dropout, g.heads), stream));
  return absl::OkStatus();
}

absl::Status FlashBlockFinish(const Tensor& acc, const Tensor& max, const Tensor& sum,
                              Tensor* out, Tensor* lse) {
  constexpr char kOp[] = "FlashBlockFinish";
  LOOM_RETURN_IF_ERROR(CheckState(kOp, &acc, &max, &sum));
  LOOM_RETURN_IF_ERROR(internal::CheckFloatOut(kOp, "out", out));
  LOOM_RETURN_IF_ERROR(internal::CheckIs(kOp, "lse", lse, DType::kF32));
  LOOM_ASSIGN_OR_RETURN(const FlashBlockDims g, ops::CheckFlashStateAlone(kOp, acc, max, sum));
  LOOM_RETURN_IF_ERROR(ops::CheckShape(kOp, "out", *out, Shape{g.rows, g.b, g.heads * g.d}));
  LOOM_RETURN_IF_ERROR(ops::CheckShape(kOp, "lse", *lse, Shape{g.b, g.heads, g.rows}));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(
      kOp, {{"acc", &acc}, {"max", &max}, {"sum", &sum}, {"out", out}, {"lse", lse}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_CUDA_LAUNCH(kOp, kernels::FlashBlockFinish(internal::ElemOf(out->dtype()), acc.data<float>(),
                                                  max.data<float>(), sum.data<float>(),
                                                  out->raw_data(), lse->data<float>(), g.rows,
                                                  g.b * g.heads, g.d, stream));
  return absl::OkStatus();
}

absl::Status FlashBlockDelta(const Tensor& dout, const Tensor& out, int64_t heads, Tensor* delta) {
  constexpr char kOp[] = "FlashBlockDelta";
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "out", out));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "out", out, "dout", dout));
  LOOM_RETURN_IF_ERROR(internal::CheckIs(kOp, "delta", delta, DType::kF32));
  LOOM_RETURN_IF_ERROR(CheckRank(kOp, "out", out, 3));
  if (heads <= 0 || out.dim(2) == 0 || out.dim(2) % heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": out ", out.DebugString(),
                                                   " with heads=", heads,
                                                   ": last dim must be heads * head_dim"));
  }
  const int64_t rows = out.dim(0), b = out.dim(1), d = out.dim(2) / heads;
  LOOM_RETURN_IF_ERROR(ops::CheckShape(kOp, "dout", dout, out.shape()));
  LOOM_RETURN_IF_ERROR(ops::CheckShape(kOp, "delta", *delta, Shape{b, heads, rows}));
  LOOM_RETURN_IF_ERROR(
      internal::CheckDevices(kOp, {{"dout", &dout}, {"out", &out}, {"delta", delta}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_CUDA_LAUNCH(kOp, kernels::FlashBlockDelta(internal::ElemOf(out.dtype()), dout.raw_data(),
                                                 out.raw_data(), rows, b, heads, d,
                                                 delta->data<float>(), stream));
  return absl::OkStatus();
}

absl::Status FlashBlockBackward(const Tensor& dout, const Tensor& qkv, const Tensor& kv,
                                const Tensor& lse, const Tensor& delta,
                                const FlashBlockOptions& o, Tensor* dqkv, Tensor* dkv) {
  constexpr char kOp[] = "FlashBlockBackward";
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "qkv", qkv));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "qkv", qkv, "kv", kv));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "qkv", qkv, "dout", dout));
  LOOM_RETURN_IF_ERROR(internal::CheckIs(kOp, "lse", &lse, DType::kF32));
  LOOM_RETURN_IF_ERROR(internal::CheckIs(kOp, "delta", &delta, DType::kF32));
  LOOM_RETURN_IF_ERROR(internal::CheckIs(kOp, "dqkv", dqkv, DType::kF32));
  LOOM_RETURN_IF_ERROR(internal::CheckIs(kOp, "dkv", dkv, DType::kF32));
  LOOM_ASSIGN_OR_RETURN(const FlashBlockDims g, ops::CheckFlashBlock(kOp, qkv, kv, o));
  LOOM_RETURN_IF_ERROR(ops::CheckShape(kOp, "dout", dout, Shape{g.rows, g.b, g.heads * g.d}));
  LOOM_RETURN_IF_ERROR(ops::CheckShape(kOp, "lse", lse, Shape{g.b, g.heads, g.rows}));
  LOOM_RETURN_IF_ERROR(ops::CheckShape(kOp, "delta", delta, Shape{g.b, g.heads, g.rows}));
  LOOM_RETURN_IF_ERROR(ops::CheckShape(kOp, "dqkv", *dqkv, qkv.shape()));
  LOOM_RETURN_IF_ERROR(ops::CheckShape(kOp, "dkv", *dkv, kv.shape()));
  LOOM_RETURN_IF_ERROR(CheckLimits(kOp, g));
  LOOM_RETURN_IF_ERROR(CheckNoDocuments(kOp, o));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(kOp, {{"dout", &dout},
                                                    {"qkv", &qkv},
                                                    {"kv", &kv},
                                                    {"lse", &lse},
                                                    {"delta", &delta},
                                                    {"dqkv", dqkv},
                                                    {"dkv", dkv}}));
  if (Skipped(o) || g.b == 0) return absl::OkStatus();
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  const int64_t pairs = g.b * g.heads;
  LOOM_CUDA_LAUNCH(
      kOp, kernels::FlashBlockBackward(
               internal::ElemOf(qkv.dtype()), Args(g, o, qkv, kv),
               ElementAt(dout, o.q_row * pairs * g.d), lse.data<float>() + o.q_row,
               delta.data<float>() + o.q_row, dqkv->data<float>() + o.q_row * pairs * 3 * g.d,
               dkv->data<float>() + o.k_row * pairs * 2 * g.d, internal::AttentionMaskOf(o.dropout, g.heads), stream));
  return absl::OkStatus();
}

namespace {

// Copies the 2d elements of each (row, pair) between qkv's k, v slots and kv.
absl::Status CopyKv(const char* op, const char* qkv_name, const Tensor& qkv, int64_t heads,
                    const char* kv_name, const Tensor& kv, bool to_kv) {
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(op, qkv_name, qkv));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(op, qkv_name, qkv, kv_name, kv));
  LOOM_ASSIGN_OR_RETURN(const FlashBlockDims g,
                        ops::CheckFlashKv(op, qkv_name, qkv, heads, kv_name, kv));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(op, {{qkv_name, &qkv}, {kv_name, &kv}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  const int64_t n = g.rows * g.b * g.heads, w = 2 * g.d;
  void* q = const_cast<void*>(qkv.raw_data());
  void* k = const_cast<void*>(kv.raw_data());
  LOOM_CUDA_LAUNCH(op, to_kv ? kernels::CopyRuns(internal::ElemOf(qkv.dtype()), q, 3 * g.d, g.d,
                                                 k, w, 0, n, w, stream)
                             : kernels::CopyRuns(internal::ElemOf(qkv.dtype()), k, w, 0, q,
                                                 3 * g.d, g.d, n, w, stream));
  return absl::OkStatus();
}

}  // namespace

absl::Status FlashKvPack(const Tensor& qkv, int64_t heads, Tensor* kv) {
  LOOM_RETURN_IF_ERROR(internal::CheckFloatOut("FlashKvPack", "kv", kv));
  return CopyKv("FlashKvPack", "qkv", qkv, heads, "kv", *kv, /*to_kv=*/true);
}

absl::Status FlashKvUnpack(const Tensor& dkv, int64_t heads, Tensor* dqkv) {
  LOOM_RETURN_IF_ERROR(internal::CheckFloatOut("FlashKvUnpack", "dqkv", dqkv));
  return CopyKv("FlashKvUnpack", "dqkv", *dqkv, heads, "dkv", dkv, /*to_kv=*/false);
}

}  // namespace loom::core::cuda
