#include "core/cuda/cross_entropy.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "core/ops/contracts/shape_checks.h"
#include "core/cuda/check.h"
#include "core/cuda/check_args.h"
#include "core/cuda/runtime.h"

namespace loom::core::cuda {
namespace {

// Returns the number of rows N (= numel / V) after the shape checks.
absl::StatusOr<int64_t> CheckShapes(const char* op, const Tensor& logits, const Tensor& targets) {
  LOOM_ASSIGN_OR_RETURN(const int64_t n, ops::CheckLogitsTargets(op, logits, targets));
  LOOM_RETURN_IF_ERROR(internal::CheckRows(op, "rows", n));
  return n;
}

}  // namespace

absl::StatusOr<double> CrossEntropyForward(const Tensor& logits, const Tensor& targets,
                                           Tensor* losses, Tensor* lse,
                                           const cpu::CrossEntropyOptions& opts) {
  constexpr const char* kOp = "CrossEntropyForward";
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "logits", logits));
  LOOM_RETURN_IF_ERROR(internal::CheckIds(kOp, "targets", targets));
  LOOM_RETURN_IF_ERROR(internal::CheckIs(kOp, "losses", losses, DType::kF32));
  LOOM_RETURN_IF_ERROR(internal::CheckIs(kOp, "lse", lse, DType::kF32));
  LOOM_ASSIGN_OR_RETURN(const int64_t n, CheckShapes(kOp, logits, targets));
  const int64_t v = logits.dim(logits.rank() - 1);
  LOOM_RETURN_IF_ERROR(ops::CheckNumel(kOp, "losses", *losses, n, "one per row"));
  LOOM_RETURN_IF_ERROR(ops::CheckNumel(kOp, "lse", *lse, n, "one per row"));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(
      kOp, {{"logits", &logits}, {"targets", &targets}, {"losses", losses}, {"lse", lse}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  // Device scratch: [count, first bad row] as u64 and the reduction's doubles.
  LOOM_ASSIGN_OR_RETURN(Tensor counters, internal::Scratch(Shape{2}, DType::kI64));
  LOOM_ASSIGN_OR_RETURN(Tensor sums, internal::Scratch(Shape{kernels::kReduceBlocks + 1},
                                                       DType::kF64));
  auto* dcount = reinterpret_cast<unsigned long long*>(counters.raw_data());
  const unsigned long long init[2] = {0, static_cast<unsigned long long>(n)};
  LOOM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dcount, init, sizeof(init), cudaMemcpyHostToDevice, stream));
  LOOM_CUDA_LAUNCH(kOp, kernels::CrossEntropyForward(
                            internal::ElemOf(logits.dtype()), logits.raw_data(),
                            internal::IndexOf(targets.dtype()), targets.raw_data(), n, v,
                            opts.ignore_index, losses->data<float>(), lse->data<float>(), dcount,
                            dcount + 1, stream));
  double* dsums = sums.data<double>();
  LOOM_CUDA_LAUNCH(kOp, kernels::ReduceToDouble(kernels::Elem::kF32, losses->raw_data(), n, false,
                                                dsums, dsums + kernels::kReduceBlocks, stream));
  unsigned long long host_counters[2] = {0, 0};
  double total = 0.0;
  LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_counters, dcount, sizeof(host_counters),
                                            cudaMemcpyDeviceToHost, stream));
  LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&total, dsums + kernels::kReduceBlocks, sizeof(double),
                                            cudaMemcpyDeviceToHost, stream));
  LOOM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  const unsigned long long count = host_counters[0], bad = host_counters[1];
  if (bad < static_cast<unsigned long long>(n)) {
    int64_t t = 0;
    const size_t es = DTypeSize(targets.dtype());
    int32_t t32 = 0;
    void* dst = targets.dtype() == DType::kI32 ? static_cast<void*>(&t32) : static_cast<void*>(&t);
    LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, static_cast<const char*>(targets.raw_data()) + bad * es,
                                         es, cudaMemcpyDeviceToHost));
    if (targets.dtype() == DType::kI32) t = t32;
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": targets[", bad, "] = ", t,
                                                   " is outside the vocab [0, ", v, ") of logits ",
                                                   logits.DebugString()));
  }
  return count == 0 ? 0.0 : total / static_cast<double>(count);
}

absl::Status CrossEntropyBackward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                  float dloss, Tensor* dlogits,
                                  const cpu::CrossEntropyOptions& opts) {
  constexpr const char* kOp = "CrossEntropyBackward";
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "logits", logits));
  LOOM_RETURN_IF_ERROR(internal::CheckIds(kOp, "targets", targets));
  LOOM_RETURN_IF_ERROR(CheckDTypeIs(kOp, "lse", lse, DType::kF32));
  LOOM_RETURN_IF_ERROR(internal::CheckFloatOut(kOp, "dlogits", dlogits));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "logits", logits, "dlogits", *dlogits));
  LOOM_RETURN_IF_ERROR(CheckSameShape(kOp, "logits", logits, "dlogits", *dlogits));
  LOOM_ASSIGN_OR_RETURN(const int64_t n, CheckShapes(kOp, logits, targets));
  const int64_t v = logits.dim(logits.rank() - 1);
  LOOM_RETURN_IF_ERROR(ops::CheckNumel(kOp, "lse", lse, n, "one per row"));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(
      kOp, {{"logits", &logits}, {"targets", &targets}, {"lse", &lse}, {"dlogits", dlogits}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_ASSIGN_OR_RETURN(Tensor counter, internal::Scratch(Shape{1}, DType::kI64));
  auto* dcount = reinterpret_cast<unsigned long long*>(counter.raw_data());
  LOOM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dcount, 0, sizeof(unsigned long long), stream));
  const kernels::Index it = internal::IndexOf(targets.dtype());
  LOOM_CUDA_LAUNCH(kOp, kernels::CountNotIgnored(it, targets.raw_data(), n, opts.ignore_index,
                                                 dcount, stream));
  LOOM_CUDA_LAUNCH(kOp, kernels::CrossEntropyBackward(
                            internal::ElemOf(logits.dtype()), logits.raw_data(), it,
                            targets.raw_data(), lse.data<float>(), n, v, opts.ignore_index, dloss,
                            dcount, dlogits->raw_data(), stream));
  return absl::OkStatus();
}

}  // namespace loom::core::cuda
