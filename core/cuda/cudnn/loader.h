#ifndef LOOM_CORE_CUDA_CUDNN_LOADER_H_
#define LOOM_CORE_CUDA_CUDNN_LOADER_H_

// libcudnn at run time. Nothing in Loom links libcudnn: cudnn-frontend is
// compiled with NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING and resolves every
// cudnn* symbol from the handle that LoadCudnn() dlopens (it defines the
// frontend's cudnn_frontend::cudnn_dlhandle). A machine without libcudnn
// loads Loom's binaries fine; LoadCudnn() then says why, and callers fall back.
//
// Tried in order (the first that dlopens wins):
//   $LOOM_CUDNN_LIBRARY (a path or a soname) when set, and then nothing else;
//   otherwise libcudnn.so.9 through the dynamic loader's search
//   (LD_LIBRARY_PATH, ...), then <CUDA toolkit>/lib64/libcudnn.so.9 (the
//   toolkit Loom was configured with).
// It also pins the frontend's own libcudart lookup to the libcudart this
// process already uses (CUDNN_FRONTEND_CUDART_LIB_NAME, unless set), so a
// second CUDA runtime on the library path is never mixed in.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct cudnnContext;  // cudnnHandle_t is cudnnContext*

namespace loom::core::cuda::cudnn {

// Loads libcudnn once per process (later calls return the first result):
// OK, or FailedPrecondition naming libcudnn.so.9 and every path tried, with
// dlerror()'s reasons. A library older than cuDNN 9 is FailedPrecondition too.
absl::Status LoadCudnn();

// cudnnGetVersion() of the loaded library (e.g. 91900 for 9.19.0), or
// LoadCudnn()'s error.
absl::StatusOr<int64_t> LoadedCudnnVersion();

// Where the library was loaded from (dladdr), or LoadCudnn()'s error.
absl::StatusOr<std::string> LoadedCudnnPath();

// The calling thread's cuDNN handle for CUDA device `device` (created on
// first use, kept for the thread's lifetime), bound to `stream`
// (cudnnSetStream on every call). Needs LoadCudnn() and a GPU.
absl::StatusOr<cudnnContext*> ThreadHandle(int device, void* stream);

}  // namespace loom::core::cuda::cudnn

#endif  // LOOM_CORE_CUDA_CUDNN_LOADER_H_
