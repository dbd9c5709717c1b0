#ifndef LOOM_CORE_CUDA_CHECK_H_
#define LOOM_CORE_CUDA_CHECK_H_

// Every CUDA runtime call's status becomes an absl::Status that names the
// call and where it was made; nothing in Loom ignores a cudaError_t.

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace loom::core::cuda {

// OK for cudaSuccess; otherwise Internal (Unavailable for "no device" /
// "no driver") with "<expr> failed at file:line: <cuda error name>: <text>".
absl::Status CudaStatus(cudaError_t err, const char* expr, const char* file, int line);

}  // namespace loom::core::cuda

#define LOOM_CUDA_RETURN_IF_ERROR(expr)                                                   \
  do {                                                                                    \
    const cudaError_t loom_cuda_err_ = (expr);                                            \
    if (loom_cuda_err_ != cudaSuccess)                                                    \
      return ::loom::core::cuda::CudaStatus(loom_cuda_err_, #expr, __FILE__, __LINE__);   \
  } while (0)

#endif  // LOOM_CORE_CUDA_CHECK_H_
