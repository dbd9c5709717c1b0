#include "core/cuda/reduce.h"

#include <cmath>

#include "core/cuda/check.h"
#include "core/cuda/check_args.h"

namespace loom::core::cuda {
namespace {

absl::StatusOr<double> Reduce(const char* op, const Tensor& x, bool squares) {
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(op, "x", x));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(op, {{"x", &x}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_ASSIGN_OR_RETURN(Tensor sums,
                        internal::Scratch(Shape{kernels::kReduceBlocks + 1}, DType::kF64));
  double* d = sums.data<double>();
  LOOM_CUDA_LAUNCH(op, kernels::ReduceToDouble(internal::ElemOf(x.dtype()), x.raw_data(),
                                               x.numel(), squares, d, d + kernels::kReduceBlocks,
                                               stream));
  double result = 0.0;
  LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&result, d + kernels::kReduceBlocks, sizeof(double),
                                            cudaMemcpyDeviceToHost, stream));
  LOOM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return result;
}

}  // namespace

absl::StatusOr<double> Sum(const Tensor& x) { return Reduce("Sum", x, false); }

absl::Status SumSquaresInto(const Tensor& x, Tensor* acc) {
  constexpr const char* kOp = "SumSquaresInto";
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "x", x));
  LOOM_RETURN_IF_ERROR(ops::CheckDoubleAccumulator(kOp, acc));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(kOp, {{"x", &x}, {"acc", acc}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_ASSIGN_OR_RETURN(Tensor partials,
                        internal::Scratch(Shape{kernels::kReduceBlocks}, DType::kF64));
  LOOM_CUDA_LAUNCH(kOp, kernels::ReduceToDouble(internal::ElemOf(x.dtype()), x.raw_data(),
                                                x.numel(), /*squares=*/true,
                                                partials.data<double>(), acc->data<double>(),
                                                stream, /*accumulate=*/true));
  return absl::OkStatus();
}
absl::StatusOr<double> SumSquares(const Tensor& x) { return Reduce("SumSquares", x, true); }
absl::StatusOr<double> L2Norm(const Tensor& x) {
  absl::StatusOr<double> ss = Reduce("L2Norm", x, true);
  if (!ss.ok()) return ss.status();
  return std::sqrt(*ss);
}

}  // namespace loom::core::cuda
