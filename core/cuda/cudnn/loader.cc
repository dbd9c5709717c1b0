#include "core/cuda/cudnn/loader.h"

#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

// The handle cudnn-frontend's dynamic-loading shim resolves cudnn* symbols
// from (declared `extern void* cudnn_dlhandle` in cudnn_frontend_shim.h).
// Set once by LoadCudnn() before any frontend call: the shim caches each
// symbol it resolves in a function-local static, so a frontend call made
// before loading would fail for the rest of the process.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace loom::core::cuda::cudnn {
namespace {

#define LOOM_CUDNN_STR2(x) #x
#define LOOM_CUDNN_STR(x) LOOM_CUDNN_STR2(x)

constexpr char kSoname[] = "libcudnn.so.9";

struct Library {
  absl::Status status = absl::UnknownError("not loaded");
  void* handle = nullptr;
  int64_t version = 0;
  std::string path;
  // The entry points Loom calls itself (the frontend resolves its own).
  size_t (*get_version)() = nullptr;
  cudnnStatus_t (*create)(cudnnHandle_t*) = nullptr;
  cudnnStatus_t (*set_stream)(cudnnHandle_t, cudaStream_t) = nullptr;
  const char* (*error_string)(cudnnStatus_t) = nullptr;
};

// The frontend dlopens libcudart itself (libcudart.so.12, then .13, warning
// when both exist); point it at the one this process already runs on.
void PinFrontendCudart() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&cudaRuntimeGetVersion), &info) == 0 ||
      info.dli_fname == nullptr) {
    return;
  }
  const std::string path = info.dli_fname;
  if (path.find("libcudart") == std::string::npos) return;  // linked statically
  setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", path.c_str(), /*overwrite=*/0);
}

template <typename F>
bool Resolve(void* handle, const char* name, F* fn, std::vector<std::string>* missing) {
  *fn = reinterpret_cast<F>(dlsym(handle, name));
  if (*fn == nullptr) missing->push_back(name);
  return *fn != nullptr;
}

Library Load() {
  Library lib;
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("LOOM_CUDNN_LIBRARY"); env != nullptr && env[0] != '\0') {
    candidates.push_back(env);  // explicit: nothing else is tried
  } else {
    candidates.push_back(kSoname);
#ifdef LOOM_CUDA_LIB64
    candidates.push_back(absl::StrCat(LOOM_CUDNN_STR(LOOM_CUDA_LIB64), "/", kSoname));
#endif
  }
  std::vector<std::string> tried;
  for (const std::string& c : candidates) {
    dlerror();
    void* h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h != nullptr) {
      lib.handle = h;
      break;
    }
    const char* err = dlerror();
    tried.push_back(absl::StrCat(c, " (", err != nullptr ? err : "unknown error", ")"));
  }
  if (lib.handle == nullptr) {
    lib.status = absl::FailedPreconditionError(absl::StrCat(
        "cuDNN: cannot load ", kSoname, "; tried ", absl::StrJoin(tried, "; "),
        ". Install cuDNN 9 (e.g. pip nvidia-cudnn-cu13) and put its lib directory on "
        "LD_LIBRARY_PATH, or set LOOM_CUDNN_LIBRARY to the library's path"));
    return lib;
  }
  std::vector<std::string> missing;
  Resolve(lib.handle, "cudnnGetVersion", &lib.get_version, &missing);
  Resolve(lib.handle, "cudnnCreate", &lib.create, &missing);
  Resolve(lib.handle, "cudnnSetStream", &lib.set_stream, &missing);
  Resolve(lib.handle, "cudnnGetErrorString", &lib.error_string, &missing);
  Dl_info info;
  lib.path = (lib.get_version != nullptr &&
              dladdr(reinterpret_cast<void*>(lib.get_version), &info) != 0 && info.dli_fname)
                 ? info.dli_fname
                 : candidates.front();
  if (!missing.empty()) {
    lib.status = absl::FailedPreconditionError(
        absl::StrCat("cuDNN: ", lib.path, " lacks ", absl::StrJoin(missing, ", "),
                     " (not a cuDNN 9 library?)"));
    return lib;
  }
  lib.version = static_cast<int64_t>(lib.get_version());
  if (lib.version < 90000) {
    lib.status = absl::FailedPreconditionError(absl::StrCat(
        "cuDNN: ", lib.path, " is version ", lib.version, "; Loom needs cuDNN 9 (", kSoname, ")"));
    return lib;
  }
  PinFrontendCudart();
  cudnn_frontend::cudnn_dlhandle = lib.handle;
  lib.status = absl::OkStatus();
  return lib;
}

const Library& Get() {
  static absl::once_flag once;
  static Library* lib = nullptr;  // never destroyed: used until exit
  absl::call_once(once, [] { lib = new Library(Load()); });
  return *lib;
}

}  // namespace

absl::Status LoadCudnn() { return Get().status; }

absl::StatusOr<int64_t> LoadedCudnnVersion() {
  const Library& lib = Get();
  if (!lib.status.ok()) return lib.status;
  return lib.version;
}

absl::StatusOr<std::string> LoadedCudnnPath() {
  const Library& lib = Get();
  if (!lib.status.ok()) return lib.status;
  return lib.path;
}

absl::StatusOr<cudnnContext*> ThreadHandle(int device, void* stream) {
  const Library& lib = Get();
  if (!lib.status.ok()) return lib.status;
  // One handle per (thread, device), deliberately never destroyed: Loom runs
  // one long-lived thread per device, and cudnnDestroy during static
  // destruction (after the CUDA context may be gone) is not safe.
  thread_local std::unordered_map<int, cudnnHandle_t> handles;
  auto it = handles.find(device);
  if (it == handles.end()) {
    cudnnHandle_t h = nullptr;
    const cudnnStatus_t st = lib.create(&h);
    if (st != CUDNN_STATUS_SUCCESS) {
      return absl::InternalError(absl::StrCat("cuDNN: cudnnCreate on device ", device,
                                              " failed: ", lib.error_string(st)));
    }
    it = handles.emplace(device, h).first;
  }
  const cudnnStatus_t st = lib.set_stream(it->second, static_cast<cudaStream_t>(stream));
  if (st != CUDNN_STATUS_SUCCESS) {
    return absl::InternalError(
        absl::StrCat("cuDNN: cudnnSetStream failed: ", lib.error_string(st)));
  }
  return it->second;
}

}  // namespace loom::core::cuda::cudnn
