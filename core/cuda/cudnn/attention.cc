#include "core/cuda/cudnn/attention.h"

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/cuda/cudnn/loader.h"
#include "core/cuda/cudnn/sdpa_graph.h"
#include "core/cuda/runtime.h"
#include "core/status_macros.h"

namespace loom::core::cuda::cudnn {
namespace {

// ---- Argument checks: all before any CUDA or cuDNN call --------------------

struct Arg {
  const char* name;
  const Tensor* t;
};

absl::Status CheckDefined(const char* op, const std::vector<Arg>& args) {
  for (const Arg& a : args) {
    if (a.t == nullptr || !a.t->defined()) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": ", a.name, " is not defined"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckShape(const char* op, const char* name, const Tensor& t, const Shape& want) {
  if (t.shape() == want) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " is ", t.DebugString(),
                                                 ", expected shape ", want.ToString()));
}

// Every activation in one dtype, lse f32.
absl::Status CheckDTypes(const char* op, const std::vector<Arg>& acts, const Tensor& lse) {
  for (const Arg& a : acts) {
    if (a.t->dtype() != acts[0].t->dtype()) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": ", a.name, " is ",
                                                     a.t->DebugString(), " but ", acts[0].name,
                                                     " is ", acts[0].t->DebugString(),
                                                     " (one dtype for all activations)"));
    }
  }
  if (lse.dtype() != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": lse is ", lse.DebugString(), ", expected f32"));
  }
  return absl::OkStatus();
}

absl::Status CheckDropout(const char* op, const cpu::AttentionDropout& dropout) {
  if (!(dropout.p >= 0.0f && dropout.p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": dropout p = ", dropout.p, " is outside [0, 1]"));
  }
  return SupportsDocuments(dropout);
}

// All on one CUDA device, the calling thread's current one; returns it.
absl::StatusOr<int> CheckDevices(const char* op, const std::vector<Arg>& args) {
  const int current = CurrentDevice();
  for (const Arg& a : args) {
    const Device d = a.t->device();
    if (d.is_cpu() || d.index != current) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": ", a.name, " is ", a.t->DebugString(),
                       "; every tensor must be on the current CUDA device ", current));
    }
  }
  return current;
}

// [s, b, width] with width = per_head * heads; returns (s, b).
absl::Status CheckActivation(const char* op, const char* name, const Tensor& t, int64_t heads,
                             int64_t per_head) {
  if (t.rank() != 3 || heads <= 0 || t.dim(2) % (heads * per_head) != 0 || t.dim(2) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", name, " is ", t.DebugString(), "; expected [s, b, ", heads, " * ",
        per_head == 3 ? "3 * " : "", "head_dim] (heads = ", heads, ")"));
  }
  return absl::OkStatus();
}

// ---- Graph cache and execution --------------------------------------------

using GraphOr = absl::StatusOr<std::shared_ptr<SdpaGraph>>;

struct Cache {
  absl::Mutex mu;
  // Failures are cached too: a shape cuDNN refuses is refused once, then
  // answered from here (the caller falls back and keeps its choice).
  absl::flat_hash_map<std::string, GraphOr> graphs ABSL_GUARDED_BY(mu);
};

Cache& GetCache() {
  static Cache* cache = new Cache;  // never destroyed (graphs hold cuDNN objects)
  return *cache;
}

absl::StatusOr<int> SmVersion(int device) {
  int major = 0, minor = 0;
  cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (e == cudaSuccess) {
    e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  }
  if (e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cuDNN attention: compute capability of device ",
                                            device, ": ", cudaGetErrorString(e)));
  }
  return major * 10 + minor;
}

// One build per (device, SM, desc), under the cache's lock (a build takes
// milliseconds to a second; it happens once per shape).
GraphOr GetGraph(const SdpaDesc& desc, int device, int sm, cudnnContext* handle) {
  Cache& cache = GetCache();
  const std::string key = absl::StrCat("device", device, " sm", sm, " ", desc.Key());
  absl::MutexLock lock(&cache.mu);
  auto it = cache.graphs.find(key);
  if (it != cache.graphs.end()) return it->second;
  GraphOr built = [&]() -> GraphOr {
    LOOM_ASSIGN_OR_RETURN(std::unique_ptr<SdpaGraph> g, SdpaGraph::Describe(desc, sm));
    LOOM_RETURN_IF_ERROR(g->Build(handle));
    return std::shared_ptr<SdpaGraph>(std::move(g));
  }();
  cache.graphs.emplace(key, built);
  return built;
}

absl::Status Run(const SdpaDesc& desc, int device, const SdpaPointers& ptrs) {
  LOOM_RETURN_IF_ERROR(LoadCudnn());
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, CurrentStream());
  LOOM_ASSIGN_OR_RETURN(const int sm, SmVersion(device));
  LOOM_ASSIGN_OR_RETURN(cudnnContext* handle, ThreadHandle(device, stream));
  LOOM_ASSIGN_OR_RETURN(std::shared_ptr<SdpaGraph> graph, GetGraph(desc, device, sm, handle));
  const int64_t ws_bytes = graph->WorkspaceBytes();
  Tensor workspace;  // freed at return: stream-ordered reuse (allocator.h)
  if (ws_bytes > 0) {
    LOOM_ASSIGN_OR_RETURN(workspace,
                          Tensor::Empty(Shape({ws_bytes}), DType::kU8, Device::CUDA(device)));
  }
  return graph->Execute(handle, ptrs, workspace.raw_data());
}

const char* Offset(const Tensor& t, int64_t elements) {
  return static_cast<const char*>(t.raw_data()) + elements * DTypeSize(t.dtype());
}

}  // namespace

absl::Status FlashAttentionForward(const Tensor& qkv, int64_t heads, Tensor* out, Tensor* lse,
                                   const cpu::AttentionDropout& dropout) {
  constexpr char op[] = "cudnn::FlashAttentionForward";
  LOOM_RETURN_IF_ERROR(CheckDefined(op, {{"qkv", &qkv}, {"out", out}, {"lse", lse}}));
  LOOM_RETURN_IF_ERROR(CheckActivation(op, "qkv", qkv, heads, 3));
  LOOM_RETURN_IF_ERROR(CheckDropout(op, dropout));
  const int64_t s = qkv.dim(0), b = qkv.dim(1), d = qkv.dim(2) / (3 * heads);
  LOOM_RETURN_IF_ERROR(CheckShape(op, "out", *out, Shape({s, b, heads * d})));
  LOOM_RETURN_IF_ERROR(CheckShape(op, "lse", *lse, Shape({b, heads, s})));
  LOOM_RETURN_IF_ERROR(CheckDTypes(op, {{"qkv", &qkv}, {"out", out}}, *lse));
  const AttentionShape g{b, s, heads, heads, d};
  LOOM_RETURN_IF_ERROR(Supports(g, qkv.dtype(), dropout.p));
  LOOM_ASSIGN_OR_RETURN(const int device,
                        CheckDevices(op, {{"qkv", &qkv}, {"out", out}, {"lse", lse}}));
  SdpaPointers p;
  p.q = qkv.raw_data();
  p.k = Offset(qkv, InterleavedKOffset(d));
  p.v = Offset(qkv, InterleavedVOffset(d));
  p.o = out->raw_data();
  p.stats = static_cast<float*>(lse->raw_data());
  return Run(InterleavedDesc(Direction::kForward, g, qkv.dtype()), device, p);
}

absl::Status FlashAttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                    const Tensor& lse, int64_t heads, Tensor* dqkv,
                                    const cpu::AttentionDropout& dropout) {
  constexpr char op[] = "cudnn::FlashAttentionBackward";
  LOOM_RETURN_IF_ERROR(CheckDefined(
      op, {{"dout", &dout}, {"qkv", &qkv}, {"out", &out}, {"lse", &lse}, {"dqkv", dqkv}}));
  LOOM_RETURN_IF_ERROR(CheckActivation(op, "qkv", qkv, heads, 3));
  LOOM_RETURN_IF_ERROR(CheckDropout(op, dropout));
  const int64_t s = qkv.dim(0), b = qkv.dim(1), d = qkv.dim(2) / (3 * heads);
  LOOM_RETURN_IF_ERROR(CheckShape(op, "dout", dout, Shape({s, b, heads * d})));
  LOOM_RETURN_IF_ERROR(CheckShape(op, "out", out, Shape({s, b, heads * d})));
  LOOM_RETURN_IF_ERROR(CheckShape(op, "lse", lse, Shape({b, heads, s})));
  LOOM_RETURN_IF_ERROR(CheckShape(op, "dqkv", *dqkv, qkv.shape()));
  LOOM_RETURN_IF_ERROR(CheckDTypes(
      op, {{"qkv", &qkv}, {"dout", &dout}, {"out", &out}, {"dqkv", dqkv}}, lse));
  const AttentionShape g{b, s, heads, heads, d};
  LOOM_RETURN_IF_ERROR(Supports(g, qkv.dtype(), dropout.p));
  LOOM_ASSIGN_OR_RETURN(
      const int device,
      CheckDevices(op, {{"dout", &dout}, {"qkv", &qkv}, {"out", &out}, {"lse", &lse},
                        {"dqkv", dqkv}}));
  SdpaPointers p;
  p.q = qkv.raw_data();
  p.k = Offset(qkv, InterleavedKOffset(d));
  p.v = Offset(qkv, InterleavedVOffset(d));
  p.o = out.raw_data();
  p.stats = static_cast<float*>(lse.raw_data());
  p.dout = dout.raw_data();
  p.dq = dqkv->raw_data();
  p.dk = const_cast<char*>(Offset(*dqkv, InterleavedKOffset(d)));
  p.dv = const_cast<char*>(Offset(*dqkv, InterleavedVOffset(d)));
  return Run(InterleavedDesc(Direction::kBackward, g, qkv.dtype()), device, p);
}

namespace {

// q [s, b, heads * d], k and v [s, b, groups * d]; returns the shape.
absl::StatusOr<AttentionShape> CheckGqaInputs(const char* op, const Tensor& q, const Tensor& k,
                                              const Tensor& v, int64_t heads, int64_t groups) {
  if (heads <= 0 || groups <= 0 || heads % groups != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": heads ", heads, " and groups ", groups,
        " must be positive with heads a multiple of groups"));
  }
  LOOM_RETURN_IF_ERROR(CheckActivation(op, "q", q, heads, 1));
  const int64_t s = q.dim(0), b = q.dim(1), d = q.dim(2) / heads;
  LOOM_RETURN_IF_ERROR(CheckShape(op, "k", k, Shape({s, b, groups * d})));
  LOOM_RETURN_IF_ERROR(CheckShape(op, "v", v, Shape({s, b, groups * d})));
  return AttentionShape{b, s, heads, groups, d};
}

}  // namespace

absl::Status GqaAttentionForward(const Tensor& q, const Tensor& k, const Tensor& v,
                                 int64_t heads, int64_t groups, Tensor* out, Tensor* lse,
                                 const cpu::AttentionDropout& dropout) {
  constexpr char op[] = "cudnn::GqaAttentionForward";
  LOOM_RETURN_IF_ERROR(
      CheckDefined(op, {{"q", &q}, {"k", &k}, {"v", &v}, {"out", out}, {"lse", lse}}));
  LOOM_ASSIGN_OR_RETURN(const AttentionShape g, CheckGqaInputs(op, q, k, v, heads, groups));
  LOOM_RETURN_IF_ERROR(CheckDropout(op, dropout));
  LOOM_RETURN_IF_ERROR(CheckShape(op, "out", *out, q.shape()));
  LOOM_RETURN_IF_ERROR(CheckShape(op, "lse", *lse, Shape({g.batch, heads, g.seq})));
  LOOM_RETURN_IF_ERROR(CheckDTypes(op, {{"q", &q}, {"k", &k}, {"v", &v}, {"out", out}}, *lse));
  LOOM_RETURN_IF_ERROR(Supports(g, q.dtype(), dropout.p));
  LOOM_ASSIGN_OR_RETURN(
      const int device,
      CheckDevices(op, {{"q", &q}, {"k", &k}, {"v", &v}, {"out", out}, {"lse", lse}}));
  SdpaPointers p;
  p.q = q.raw_data();
  p.k = k.raw_data();
  p.v = v.raw_data();
  p.o = out->raw_data();
  p.stats = static_cast<float*>(lse->raw_data());
  return Run(SeparateDesc(Direction::kForward, g, q.dtype()), device, p);
}

absl::Status GqaAttentionBackward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse,
                                  int64_t heads, int64_t groups, Tensor* dq, Tensor* dk,
                                  Tensor* dv, const cpu::AttentionDropout& dropout) {
  constexpr char op[] = "cudnn::GqaAttentionBackward";
  LOOM_RETURN_IF_ERROR(CheckDefined(op, {{"dout", &dout}, {"q", &q}, {"k", &k}, {"v", &v},
                                         {"out", &out}, {"lse", &lse}, {"dq", dq},
                                         {"dk", dk}, {"dv", dv}}));
  LOOM_ASSIGN_OR_RETURN(const AttentionShape g, CheckGqaInputs(op, q, k, v, heads, groups));
  LOOM_RETURN_IF_ERROR(CheckDropout(op, dropout));
  LOOM_RETURN_IF_ERROR(CheckShape(op, "dout", dout, q.shape()));
  LOOM_RETURN_IF_ERROR(CheckShape(op, "out", out, q.shape()));
  LOOM_RETURN_IF_ERROR(CheckShape(op, "lse", lse, Shape({g.batch, heads, g.seq})));
  LOOM_RETURN_IF_ERROR(CheckShape(op, "dq", *dq, q.shape()));
  LOOM_RETURN_IF_ERROR(CheckShape(op, "dk", *dk, k.shape()));
  LOOM_RETURN_IF_ERROR(CheckShape(op, "dv", *dv, v.shape()));
  LOOM_RETURN_IF_ERROR(CheckDTypes(op, {{"q", &q}, {"k", &k}, {"v", &v}, {"dout", &dout},
                                        {"out", &out}, {"dq", dq}, {"dk", dk}, {"dv", dv}},
                                   lse));
  LOOM_RETURN_IF_ERROR(Supports(g, q.dtype(), dropout.p));
  LOOM_ASSIGN_OR_RETURN(
      const int device,
      CheckDevices(op, {{"dout", &dout}, {"q", &q}, {"k", &k}, {"v", &v}, {"out", &out},
                        {"lse", &lse}, {"dq", dq}, {"dk", dk}, {"dv", dv}}));
  SdpaPointers p;
  p.q = q.raw_data();
  p.k = k.raw_data();
  p.v = v.raw_data();
  p.o = out.raw_data();
  p.stats = static_cast<float*>(lse.raw_data());
  p.dout = dout.raw_data();
  p.dq = dq->raw_data();
  p.dk = dk->raw_data();
  p.dv = dv->raw_data();
  return Run(SeparateDesc(Direction::kBackward, g, q.dtype()), device, p);
}

absl::Status SupportsDocuments(const cpu::AttentionDropout& dropout) {
  if (dropout.doc_start == nullptr && dropout.device_doc_start == nullptr) {
    return absl::OkStatus();
  }
  return absl::UnimplementedError(
      "cuDNN attention: packed documents (--reset-attention-mask) are not supported by this "
      "SDPA graph");
}

}  // namespace loom::core::cuda::cudnn
