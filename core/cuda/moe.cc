#include "core/cuda/moe.h"

#include "core/cuda/check_args.h"
#include "core/ops/contracts/moe_checks.h"

namespace loom::core::cuda {
namespace {

using internal::CheckIs;

const int32_t* I32(const Tensor& t) { return static_cast<const int32_t*>(t.raw_data()); }
const float* F32(const Tensor& t) { return static_cast<const float*>(t.raw_data()); }

}  // namespace

absl::Status MoeRouteTopK(const Tensor& logits, const ops::MoeRouteOptions& o, Tensor* expert,
                          Tensor* prob, Tensor* stats) {
  constexpr const char* kOp = "MoeRouteTopK";
  LOOM_ASSIGN_OR_RETURN(const ops::MoeDims d,
                        ops::CheckMoeRouteTopK(kOp, logits, o, expert, prob, stats));
  LOOM_RETURN_IF_ERROR(CheckIs(kOp, "logits", &logits, DType::kF32));
  LOOM_RETURN_IF_ERROR(CheckIs(kOp, "expert", expert, DType::kI32));
  LOOM_RETURN_IF_ERROR(CheckIs(kOp, "prob", prob, DType::kF32));
  LOOM_RETURN_IF_ERROR(CheckIs(kOp, "stats", stats, DType::kF64));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(
      kOp, {{"logits", &logits}, {"expert", expert}, {"prob", prob}, {"stats", stats}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_ASSIGN_OR_RETURN(Tensor scratch,
                        internal::Scratch(Shape{d.tokens, 2 * d.experts + 1}, DType::kF64));
  LOOM_CUDA_LAUNCH(kOp, kernels::MoeRouteTopK(F32(logits), d.tokens, d.experts, d.topk,
                                              expert->data<int32_t>(), prob->data<float>(),
                                              scratch.data<double>(), stats->data<double>(),
                                              stream));
  return absl::OkStatus();
}

absl::Status MoeRouteLayout(const Tensor& expert, const Tensor& prob,
                            const ops::MoeRouteOptions& o, Tensor* row, Tensor* row_token) {
  constexpr const char* kOp = "MoeRouteLayout";
  LOOM_ASSIGN_OR_RETURN(const ops::MoeDims d,
                        ops::CheckMoeRouteLayout(kOp, expert, prob, o, row, row_token));
  LOOM_RETURN_IF_ERROR(CheckIs(kOp, "expert", &expert, DType::kI32));
  LOOM_RETURN_IF_ERROR(CheckIs(kOp, "prob", &prob, DType::kF32));
  LOOM_RETURN_IF_ERROR(CheckIs(kOp, "row", row, DType::kI32));
  LOOM_RETURN_IF_ERROR(CheckIs(kOp, "row_token", row_token, DType::kI32));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(
      kOp, {{"expert", &expert}, {"prob", &prob}, {"row", row}, {"row_token", row_token}}));
  LOOM_RETURN_IF_ERROR(internal::CheckRows(kOp, "assignments (T * K)", d.tokens * d.topk));
  LOOM_RETURN_IF_ERROR(internal::CheckRows(kOp, "experts", d.experts));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_ASSIGN_OR_RETURN(Tensor scratch, internal::Scratch(
                                            Shape{2 * d.tokens * d.topk + d.experts}, DType::kI32));
  LOOM_CUDA_LAUNCH(kOp, kernels::MoeRouteLayout(I32(expert), F32(prob), d.tokens, d.experts,
                                                d.topk, o.capacity, o.pad_to_capacity,
                                                scratch.data<int32_t>(), row->data<int32_t>(),
                                                row_token->data<int32_t>(), d.rows, stream));
  return absl::OkStatus();
}

absl::Status MoePermute(const Tensor& x, const Tensor& row_token, Tensor* out) {
  constexpr const char* kOp = "MoePermute";
  LOOM_ASSIGN_OR_RETURN(const ops::MoeDims d, ops::CheckMoePermute(kOp, x, row_token, out));
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "x", x));
  LOOM_RETURN_IF_ERROR(CheckIs(kOp, "row_token", &row_token, DType::kI32));
  LOOM_RETURN_IF_ERROR(internal::CheckFloatOut(kOp, "out", out));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "x", x, "out", *out));
  LOOM_RETURN_IF_ERROR(
      internal::CheckDevices(kOp, {{"x", &x}, {"row_token", &row_token}, {"out", out}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  // The embedding gather: row_token -1 (padding) is out of range, a zero row.
  LOOM_CUDA_LAUNCH(kOp, kernels::EmbeddingForward(internal::ElemOf(x.dtype()),
                                                  kernels::Index::kI32, row_token.raw_data(),
                                                  x.raw_data(), d.rows, d.tokens, d.hidden, 0,
                                                  /*zero_out_of_range=*/true, out->raw_data(),
                                                  stream));
  return absl::OkStatus();
}

absl::Status MoePermuteBackward(const Tensor& drows, const Tensor& row, Tensor* dx) {
  constexpr const char* kOp = "MoePermuteBackward";
  LOOM_ASSIGN_OR_RETURN(const ops::MoeDims d, ops::CheckMoePermuteBackward(kOp, drows, row, dx));
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "drows", drows));
  LOOM_RETURN_IF_ERROR(CheckIs(kOp, "row", &row, DType::kI32));
  LOOM_RETURN_IF_ERROR(internal::CheckFloatOut(kOp, "dx", dx));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "drows", drows, "dx", *dx));
  LOOM_RETURN_IF_ERROR(
      internal::CheckDevices(kOp, {{"drows", &drows}, {"row", &row}, {"dx", dx}}));
  LOOM_RETURN_IF_ERROR(internal::CheckRows(kOp, "tokens", d.tokens));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_CUDA_LAUNCH(kOp, kernels::MoePermuteBackward(internal::ElemOf(drows.dtype()),
                                                    drows.raw_data(), I32(row), d.tokens, d.topk,
                                                    d.hidden, dx->raw_data(), stream));
  return absl::OkStatus();
}

absl::Status MoeCombineForward(const Tensor& rows, const Tensor& prob, const Tensor& row,
                               Tensor* y) {
  constexpr const char* kOp = "MoeCombineForward";
  LOOM_ASSIGN_OR_RETURN(const ops::MoeDims d, ops::CheckMoeCombine(kOp, rows, prob, row, "y", y));
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "rows", rows));
  LOOM_RETURN_IF_ERROR(CheckIs(kOp, "prob", &prob, DType::kF32));
  LOOM_RETURN_IF_ERROR(CheckIs(kOp, "row", &row, DType::kI32));
  LOOM_RETURN_IF_ERROR(internal::CheckFloatOut(kOp, "y", y));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "rows", rows, "y", *y));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(
      kOp, {{"rows", &rows}, {"prob", &prob}, {"row", &row}, {"y", y}}));
  LOOM_RETURN_IF_ERROR(internal::CheckRows(kOp, "tokens", d.tokens));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_CUDA_LAUNCH(kOp, kernels::MoeCombineForward(internal::ElemOf(rows.dtype()), rows.raw_data(),
                                                   F32(prob), I32(row), d.tokens, d.topk, d.hidden,
                                                   y->raw_data(), stream));
  return absl::OkStatus();
}

absl::Status MoeCombineBackward(const Tensor& dy, const Tensor& rows, const Tensor& prob,
                                const Tensor& row, Tensor* drows, Tensor* dprob) {
  constexpr const char* kOp = "MoeCombineBackward";
  LOOM_ASSIGN_OR_RETURN(const ops::MoeDims d,
                        ops::CheckMoeCombineBackward(kOp, dy, rows, prob, row, drows, dprob));
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "dy", dy));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "dy", dy, "rows", rows));
  LOOM_RETURN_IF_ERROR(CheckIs(kOp, "prob", &prob, DType::kF32));
  LOOM_RETURN_IF_ERROR(CheckIs(kOp, "row", &row, DType::kI32));
  LOOM_RETURN_IF_ERROR(internal::CheckFloatOut(kOp, "drows", drows));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "dy", dy, "drows", *drows));
  LOOM_RETURN_IF_ERROR(CheckIs(kOp, "dprob", dprob, DType::kF32));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(kOp, {{"dy", &dy},
                                                    {"rows", &rows},
                                                    {"prob", &prob},
                                                    {"row", &row},
                                                    {"drows", drows},
                                                    {"dprob", dprob}}));
  LOOM_RETURN_IF_ERROR(internal::CheckRows(kOp, "tokens", d.tokens));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_CUDA_LAUNCH(kOp, kernels::MoeCombineBackward(
                            internal::ElemOf(dy.dtype()), dy.raw_data(), rows.raw_data(),
                            F32(prob), I32(row), d.tokens, d.topk, d.hidden, d.rows,
                            drows->raw_data(), dprob->data<float>(), stream));
  return absl::OkStatus();
}

absl::Status MoeRouterBackward(const Tensor& logits, const Tensor& expert, const Tensor& prob,
                               const Tensor& dprob, const Tensor& aux_grad,
                               const ops::MoeRouterBackwardOptions& o, Tensor* dlogits) {
  constexpr const char* kOp = "MoeRouterBackward";
  LOOM_ASSIGN_OR_RETURN(const ops::MoeDims d, ops::CheckMoeRouterBackward(
                                                  kOp, logits, expert, prob, dprob, aux_grad, o,
                                                  dlogits));
  LOOM_RETURN_IF_ERROR(CheckIs(kOp, "logits", &logits, DType::kF32));
  LOOM_RETURN_IF_ERROR(CheckIs(kOp, "expert", &expert, DType::kI32));
  LOOM_RETURN_IF_ERROR(CheckIs(kOp, "prob", &prob, DType::kF32));
  LOOM_RETURN_IF_ERROR(CheckIs(kOp, "dprob", &dprob, DType::kF32));
  LOOM_RETURN_IF_ERROR(CheckIs(kOp, "dlogits", dlogits, DType::kF32));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(kOp, {{"logits", &logits},
                                                    {"expert", &expert},
                                                    {"prob", &prob},
                                                    {"dprob", &dprob},
                                                    {"dlogits", dlogits}}));
  if (o.aux_loss) {
    LOOM_RETURN_IF_ERROR(CheckIs(kOp, "aux_grad", &aux_grad, DType::kF64));
    LOOM_RETURN_IF_ERROR(
        internal::CheckDevices(kOp, {{"logits", &logits}, {"aux_grad", &aux_grad}}));
  }
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_CUDA_LAUNCH(kOp, kernels::MoeRouterBackward(
                            F32(logits), I32(expert), F32(prob), F32(dprob),
                            o.aux_loss ? static_cast<const double*>(aux_grad.raw_data()) : nullptr,
                            o.z_loss, o.z_scale, d.tokens, d.experts, d.topk,
                            dlogits->data<float>(), stream));
  return absl::OkStatus();
}

}  // namespace loom::core::cuda
