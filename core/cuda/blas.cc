#include "core/cuda/blas.h"

#include <cuda_runtime_api.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "core/cuda/check.h"
#include "core/cuda/runtime.h"

namespace loom::core::cuda::internal {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // what cuBLAS recommends for Hopper

struct ThreadHandle {
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;
  cudaStream_t stream = nullptr;
  bool stream_set = false;
};

absl::Status BlasStatus(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, " failed: ", CublasStatusName(st)));
}

cudaDataType_t CudaType(DType t) {
  switch (t) {
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

}  // namespace

const char* CublasStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "unknown cuBLAS status";
  }
}

absl::StatusOr<cublasHandle_t> BlasHandle() {
  // Handles and workspaces live as long as the thread's streams (runtime.cc):
  // not destroyed at thread exit, when the driver may be shutting down.
  thread_local std::map<int, ThreadHandle> handles;
  absl::StatusOr<cudaStream_t> stream = CurrentStream();
  if (!stream.ok()) return stream.status();
  ThreadHandle& h = handles[CurrentDevice()];
  if (h.handle == nullptr) {
    LOOM_CUDA_RETURN_IF_ERROR(cudaSetDevice(CurrentDevice()));
    cublasHandle_t handle = nullptr;
    if (absl::Status s = BlasStatus(cublasCreate(&handle), "cublasCreate"); !s.ok()) return s;
    // Default math: f32 GEMMs stay f32 (TF32 only with CUBLAS_TF32_TENSOR_OP_MATH).
    if (absl::Status s = BlasStatus(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH),
                                    "cublasSetMathMode");
        !s.ok()) {
      return s;
    }
    void* ws = nullptr;
    LOOM_CUDA_RETURN_IF_ERROR(cudaMalloc(&ws, kWorkspaceBytes));
    h.handle = handle;
    h.workspace = ws;
  }
  if (!h.stream_set || h.stream != *stream) {
    // cublasSetStream resets the workspace to cuBLAS's own pool: set ours again.
    if (absl::Status s = BlasStatus(cublasSetStream(h.handle, *stream), "cublasSetStream");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = BlasStatus(cublasSetWorkspace(h.handle, h.workspace, kWorkspaceBytes),
                                    "cublasSetWorkspace");
        !s.ok()) {
      return s;
    }
    h.stream = *stream;
    h.stream_set = true;
  }
  return h.handle;
}

absl::Status Gemm(const char* op, const GemmArgs& g) {
  constexpr int64_t kIntMax = (int64_t{1} << 31) - 1;
  for (int64_t v : {g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.batch}) {
    if (v > kIntMax) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": GEMM M=", g.m, " N=", g.n, " K=", g.k, " batch=", g.batch,
                       " (lda=", g.lda, ", ldb=", g.ldb, ", ldc=", g.ldc,
                       ") exceeds cuBLAS's 32-bit sizes"));
    }
  }
  if (g.m == 0 || g.n == 0 || g.batch == 0) return absl::OkStatus();
  absl::StatusOr<cublasHandle_t> handle = BlasHandle();
  if (!handle.ok()) return handle.status();
  // Row-major C = op(A) op(B) is column-major Cᵀ = op(B)ᵀ op(A)ᵀ: swap the
  // operands and M/N; each keeps its own transpose flag and leading dim.
  const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cudaDataType_t tab = CudaType(g.ab), tc = CudaType(g.c_dtype);
  cublasStatus_t st;
  if (g.batch == 1) {
    st = cublasGemmEx(*handle, op_b, op_a, static_cast<int>(g.n), static_cast<int>(g.m),
                      static_cast<int>(g.k), &g.alpha, g.b, tab, static_cast<int>(g.ldb), g.a, tab,
                      static_cast<int>(g.lda), &g.beta, g.c, tc, static_cast<int>(g.ldc),
                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  } else {
    st = cublasGemmStridedBatchedEx(
        *handle, op_b, op_a, static_cast<int>(g.n), static_cast<int>(g.m), static_cast<int>(g.k),
        &g.alpha, g.b, tab, static_cast<int>(g.ldb), g.stride_b, g.a, tab,
        static_cast<int>(g.lda), g.stride_a, &g.beta, g.c, tc, static_cast<int>(g.ldc),
        g.stride_c, static_cast<int>(g.batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  }
  if (st != CUBLAS_STATUS_SUCCESS) {
    return absl::InternalError(absl::StrCat(
        op, ": cuBLAS GEMM failed: ", CublasStatusName(st), " (M=", g.m, " N=", g.n, " K=", g.k,
        " batch=", g.batch, " trans_a=", g.trans_a, " trans_b=", g.trans_b, " lda=", g.lda,
        " ldb=", g.ldb, " ldc=", g.ldc, " ", DTypeName(g.ab), " -> ", DTypeName(g.c_dtype), ")"));
  }
  return absl::OkStatus();
}

}  // namespace loom::core::cuda::internal
