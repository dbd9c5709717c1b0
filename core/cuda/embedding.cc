#include "core/cuda/embedding.h"

#include "absl/strings/str_cat.h"
#include "core/cuda/check_args.h"

namespace loom::core::cuda {
namespace {

absl::Status CheckShapes(const char* op, const Tensor& ids, const Tensor& table,
                         const char* rows, const Tensor& activ, const char* activ_name) {
  LOOM_RETURN_IF_ERROR(CheckRank(op, rows, table, 2));
  const int64_t n = ids.numel(), c = table.dim(1);
  if (activ.rank() < 1 || activ.dim(activ.rank() - 1) != c || activ.numel() != n * c) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", activ_name, " is ", activ.DebugString(), ", expected ", n, " rows of ", c,
        " (ids ", ids.DebugString(), ", ", rows, " ", table.DebugString(), ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status EmbeddingForward(const Tensor& ids, const Tensor& table, Tensor* out,
                              const cpu::EmbeddingOptions& opts) {
  constexpr const char* kOp = "EmbeddingForward";
  LOOM_RETURN_IF_ERROR(internal::CheckIds(kOp, "ids", ids));
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "table", table));
  LOOM_RETURN_IF_ERROR(internal::CheckFloatOut(kOp, "out", out));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "table", table, "out", *out));
  LOOM_RETURN_IF_ERROR(CheckShapes(kOp, ids, table, "table", *out, "out"));
  LOOM_RETURN_IF_ERROR(
      internal::CheckDevices(kOp, {{"ids", &ids}, {"table", &table}, {"out", out}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_CUDA_LAUNCH(kOp, kernels::EmbeddingForward(
                            internal::ElemOf(table.dtype()), internal::IndexOf(ids.dtype()),
                            ids.raw_data(), table.raw_data(), ids.numel(), table.dim(0),
                            table.dim(1), opts.vocab_start, opts.zero_out_of_range,
                            out->raw_data(), stream));
  return absl::OkStatus();
}

absl::Status EmbeddingBackward(const Tensor& ids, const Tensor& dout, Tensor* dtable,
                               const cpu::EmbeddingOptions& opts) {
  constexpr const char* kOp = "EmbeddingBackward";
  LOOM_RETURN_IF_ERROR(internal::CheckIds(kOp, "ids", ids));
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "dout", dout));
  LOOM_RETURN_IF_ERROR(internal::CheckIs(kOp, "dtable", dtable, DType::kF32));
  LOOM_RETURN_IF_ERROR(CheckShapes(kOp, ids, *dtable, "dtable", dout, "dout"));
  LOOM_RETURN_IF_ERROR(
      internal::CheckDevices(kOp, {{"ids", &ids}, {"dout", &dout}, {"dtable", dtable}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_CUDA_LAUNCH(kOp, kernels::EmbeddingBackward(
                            internal::ElemOf(dout.dtype()), internal::IndexOf(ids.dtype()),
                            ids.raw_data(), dout.raw_data(), ids.numel(), dtable->dim(0),
                            dtable->dim(1), opts.vocab_start, dtable->data<float>(), stream));
  return absl::OkStatus();
}

}  // namespace loom::core::cuda
