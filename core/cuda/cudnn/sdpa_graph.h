#ifndef LOOM_CORE_CUDA_CUDNN_SDPA_GRAPH_H_
#define LOOM_CORE_CUDA_CUDNN_SDPA_GRAPH_H_

// An SdpaDesc (graph_desc.h) as a cudnn-frontend graph. This header includes
// no frontend header: the frontend (heavy to compile) lives in sdpa_graph.cc
// alone. Every frontend exception and error becomes an absl::Status.
//
// Life of a graph: Describe() (pure: builds the frontend graph for a target
// SM version and validate()s it; needs libcudnn loaded, because the frontend
// asks the library's version, but no GPU) -> Build() (operation graph,
// heuristics, support check, plan: needs the GPU) -> Execute() any number of
// times (thread-compatible: one caller at a time per graph and handle).

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cuda/cudnn/graph_desc.h"

struct cudnnContext;

namespace loom::core::cuda::cudnn {

// Device pointers of one call. Forward: q, k, v in; o, stats out (dout, dq,
// dk, dv unused). Backward: q, k, v, o, stats, dout in; dq, dk, dv out.
struct SdpaPointers {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* dout = nullptr;
  void* o = nullptr;      // written by the forward, read by the backward
  float* stats = nullptr;  // likewise
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
};

class SdpaGraph {
 public:
  // The validated frontend graph of `desc` for SM `sm_version` (e.g. 90).
  // InvalidArgument with the frontend's message when cuDNN refuses it; needs
  // LoadCudnn() to have succeeded (FailedPrecondition otherwise).
  static absl::StatusOr<std::unique_ptr<SdpaGraph>> Describe(const SdpaDesc& desc,
                                                             int sm_version);
  ~SdpaGraph();
  SdpaGraph(const SdpaGraph&) = delete;
  SdpaGraph& operator=(const SdpaGraph&) = delete;

  // Lowers the graph and picks an execution plan (heuristics mode A, then the
  // fallback list) on the handle's device. Unimplemented when no engine
  // supports it on this device/library.
  absl::Status Build(cudnnContext* handle);
  // Device scratch bytes Execute needs (after Build).
  int64_t WorkspaceBytes() const;
  // Enqueues the attention on the handle's stream.
  absl::Status Execute(cudnnContext* handle, const SdpaPointers& p, void* workspace) const;

  const SdpaDesc& desc() const { return desc_; }

 private:
  struct Impl;
  SdpaGraph(const SdpaDesc& desc, std::unique_ptr<Impl> impl);
  SdpaDesc desc_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::core::cuda::cudnn

#endif  // LOOM_CORE_CUDA_CUDNN_SDPA_GRAPH_H_
