#include "core/cuda/blaslt.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "core/cuda/blas.h"
#include "core/cuda/check.h"
#include "core/cuda/runtime.h"

namespace loom::core::cuda::internal {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // as blas.cc: cuBLAS's Hopper advice

struct LtThread {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

// Per device of the calling thread; like blas.cc's handles, kept for the
// process (not destroyed at thread exit, when the driver may be going away).
absl::StatusOr<LtThread> LtFor() {
  thread_local std::map<int, LtThread> handles;
  LtThread& h = handles[CurrentDevice()];
  if (h.handle == nullptr) {
    LOOM_CUDA_RETURN_IF_ERROR(cudaSetDevice(CurrentDevice()));
    cublasLtHandle_t handle = nullptr;
    const cublasStatus_t st = cublasLtCreate(&handle);
    if (st != CUBLAS_STATUS_SUCCESS) {
      return absl::InternalError(absl::StrCat("cublasLtCreate failed: ", CublasStatusName(st)));
    }
    void* ws = nullptr;
    LOOM_CUDA_RETURN_IF_ERROR(cudaMalloc(&ws, kWorkspaceBytes));
    h.handle = handle;
    h.workspace = ws;
  }
  return h;
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

cublasLtEpilogue_t LtEpilogue(Epilogue e) {
  switch (e) {
    case Epilogue::kBias:
      return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::kGeluAuxBias:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::kDGelu:
      return CUBLASLT_EPILOGUE_DGELU;
    case Epilogue::kDGeluBGrad:
      return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case Epilogue::kBGradOfA:
      return CUBLASLT_EPILOGUE_BGRADB;  // cuBLASLt's B is Loom's A
    default:
      return CUBLASLT_EPILOGUE_DEFAULT;
  }
}

// The descriptors of one call, destroyed with it.
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descs() {
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace

const char* EpilogueName(Epilogue e) {
  switch (e) {
    case Epilogue::kBias:
      return "bias";
    case Epilogue::kGeluAuxBias:
      return "gelu_aux_bias";
    case Epilogue::kDGelu:
      return "dgelu";
    case Epilogue::kDGeluBGrad:
      return "dgelu_bgrad";
    case Epilogue::kBGradOfA:
      return "bgrad";
    default:
      return "none";
  }
}

absl::Status LtGemm(const char* op, const LtGemmArgs& g) {
  constexpr int64_t kIntMax = (int64_t{1} << 31) - 1;
  for (int64_t v : {g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.ldaux}) {
    if (v > kIntMax) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": GEMM M=", g.m, " N=", g.n, " K=", g.k,
                                                     " exceeds cuBLASLt's 32-bit sizes"));
    }
  }
  const std::string what =
      absl::StrCat(op, ": cuBLASLt GEMM (epilogue ", EpilogueName(g.epilogue), ", M=", g.m,
                   " N=", g.n, " K=", g.k, " trans_a=", g.trans_a, " trans_b=", g.trans_b, " ",
                   DTypeName(g.ab), " -> ", DTypeName(g.c_dtype), ")");
  const bool has_aux = g.epilogue == Epilogue::kGeluAuxBias || g.epilogue == Epilogue::kDGelu ||
                       g.epilogue == Epilogue::kDGeluBGrad;
  if (has_aux && g.ldaux % 8 != 0) {
    return absl::UnimplementedError(absl::StrCat(what, ": GELU aux leading dim ", g.ldaux,
                                                 " is not a multiple of 8"));
  }
  absl::StatusOr<cudaStream_t> stream = CurrentStream();
  if (!stream.ok()) return stream.status();
  absl::StatusOr<LtThread> lt = LtFor();
  if (!lt.ok()) return lt.status();

  auto fail = [&](const char* call, cublasStatus_t st) {
    return absl::InternalError(absl::StrCat(what, ": ", call, " failed: ", CublasStatusName(st)));
  };
  Descs d;
  cublasStatus_t st = cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (st != CUBLAS_STATUS_SUCCESS) return fail("cublasLtMatmulDescCreate", st);
  // Swapped operands (see blaslt.h): cuBLASLt's A is Loom's B.
  const cublasOperation_t op_lt_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_lt_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasLtEpilogue_t epi = LtEpilogue(g.epilogue);
  auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* v, size_t bytes) {
    return cublasLtMatmulDescSetAttribute(d.op, attr, v, bytes);
  };
  for (cublasStatus_t s :
       {set(CUBLASLT_MATMUL_DESC_TRANSA, &op_lt_a, sizeof(op_lt_a)),
        set(CUBLASLT_MATMUL_DESC_TRANSB, &op_lt_b, sizeof(op_lt_b)),
        set(CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi))}) {
    if (s != CUBLAS_STATUS_SUCCESS) return fail("cublasLtMatmulDescSetAttribute", s);
  }
  if (g.epilogue != Epilogue::kNone && g.epilogue != Epilogue::kDGelu) {
    st = set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias));
    if (st != CUBLAS_STATUS_SUCCESS) return fail("set BIAS_POINTER", st);
  }
  if (has_aux) {
    st = set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof(g.aux));
    if (st != CUBLAS_STATUS_SUCCESS) return fail("set EPILOGUE_AUX_POINTER", st);
    st = set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &g.ldaux, sizeof(g.ldaux));
    if (st != CUBLAS_STATUS_SUCCESS) return fail("set EPILOGUE_AUX_LD", st);
  }
  // Column-major layouts of the stored matrices: Loom's row-major B [k, n]
  // ([n, k] with trans_b) is column-major [n, k] ([k, n]), and so on.
  const cudaDataType_t tab = CudaType(g.ab), tc = CudaType(g.c_dtype);
  st = cublasLtMatrixLayoutCreate(&d.a, tab, g.trans_b ? g.k : g.n, g.trans_b ? g.n : g.k, g.ldb);
  if (st != CUBLAS_STATUS_SUCCESS) return fail("cublasLtMatrixLayoutCreate(A)", st);
  st = cublasLtMatrixLayoutCreate(&d.b, tab, g.trans_a ? g.m : g.k, g.trans_a ? g.k : g.m, g.lda);
  if (st != CUBLAS_STATUS_SUCCESS) return fail("cublasLtMatrixLayoutCreate(B)", st);
  st = cublasLtMatrixLayoutCreate(&d.c, tc, g.n, g.m, g.ldc);
  if (st != CUBLAS_STATUS_SUCCESS) return fail("cublasLtMatrixLayoutCreate(C)", st);

  st = cublasLtMatmulPreferenceCreate(&d.pref);
  if (st != CUBLAS_STATUS_SUCCESS) return fail("cublasLtMatmulPreferenceCreate", st);
  const uint64_t ws = kWorkspaceBytes;
  st = cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                            sizeof(ws));
  if (st != CUBLAS_STATUS_SUCCESS) return fail("set MAX_WORKSPACE_BYTES", st);
  // The heuristic sees the pointers' alignment through the descriptors
  // (bias, aux) and the layouts; no algorithm means this epilogue cannot run
  // this call here: the caller runs the unfused kernels instead.
  cublasLtMatmulHeuristicResult_t result = {};
  int found = 0;
  st = cublasLtMatmulAlgoGetHeuristic(lt->handle, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &result,
                                      &found);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    return absl::UnimplementedError(
        absl::StrCat(what, ": no cuBLASLt algorithm (", CublasStatusName(st), ")"));
  }
  st = cublasLtMatmul(lt->handle, d.op, &g.alpha, g.b, d.a, g.a, d.b, &g.beta, g.c, d.c, g.c, d.c,
                      &result.algo, lt->workspace, kWorkspaceBytes, *stream);
  if (st != CUBLAS_STATUS_SUCCESS) return fail("cublasLtMatmul", st);
  return absl::OkStatus();
}

}  // namespace loom::core::cuda::internal
