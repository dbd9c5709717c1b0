// The only translation unit that includes cudnn-frontend (compile time: see
// README.md). Host code, compiled by g++.
#include "core/cuda/cudnn/sdpa_graph.h"

#include <cudnn_frontend.h>

#include <exception>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cuda/cudnn/loader.h"

namespace loom::core::cuda::cudnn {
namespace {

namespace fe = cudnn_frontend;

// Tensor uids (the variant pack's keys).
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

std::vector<int64_t> Vec(const std::array<int64_t, 4>& a) { return {a.begin(), a.end()}; }

fe::DataType_t FeType(DType dtype) {
  return dtype == DType::kBF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::FLOAT;
}

std::shared_ptr<fe::graph::Tensor_attributes> Input(fe::graph::Graph& g, const char* name,
                                                    Uid uid, const Strided& t) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim(Vec(t.dim))
                      .set_stride(Vec(t.stride)));
}

void Output(const std::shared_ptr<fe::graph::Tensor_attributes>& t, Uid uid, const Strided& s) {
  t->set_output(true).set_uid(uid).set_dim(Vec(s.dim)).set_stride(Vec(s.stride));
}

absl::Status FromFe(const char* what, const SdpaDesc& desc, fe::error_t e,
                    absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
  if (e.is_good()) return absl::OkStatus();
  return absl::Status(code, absl::StrCat("cuDNN SDPA ", what, " (", desc.Key(),
                                         "): ", e.get_message()));
}

absl::Status FromException(const char* what, const SdpaDesc& desc, const std::exception& e) {
  return absl::InternalError(
      absl::StrCat("cuDNN SDPA ", what, " (", desc.Key(), "): exception: ", e.what()));
}

}  // namespace

struct SdpaGraph::Impl {
  fe::graph::Graph graph;
};

SdpaGraph::SdpaGraph(const SdpaDesc& desc, std::unique_ptr<Impl> impl)
    : desc_(desc), impl_(std::move(impl)) {}
SdpaGraph::~SdpaGraph() = default;

absl::StatusOr<std::unique_ptr<SdpaGraph>> SdpaGraph::Describe(const SdpaDesc& desc,
                                                               int sm_version) {
  // The frontend asks the library's version while validating: load it first
  // (see loader.h on why no frontend call may come before).
  if (absl::Status st = LoadCudnn(); !st.ok()) return st;
  auto impl = std::make_unique<Impl>();
  try {
    fe::graph::Graph& g = impl->graph;
    g.set_io_data_type(FeType(desc.dtype))
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    g.set_sm_version(sm_version);
    auto q = Input(g, "Q", kQ, desc.q);
    auto k = Input(g, "K", kK, desc.k);
    auto v = Input(g, "V", kV, desc.v);
    if (desc.direction == Direction::kForward) {
      auto attrs = fe::graph::SDPA_attributes()
                       .set_name("loom_sdpa_fwd")
                       .set_generate_stats(true)
                       .set_causal_mask(desc.causal)
                       .set_attn_scale(desc.scale);
      auto [o, stats] = g.sdpa(q, k, v, std::move(attrs));
      Output(o, kO, desc.o);
      Output(stats, kStats, desc.stats);
      stats->set_data_type(fe::DataType_t::FLOAT);
    } else {
      auto o = Input(g, "O", kO, desc.o);
      auto dout = Input(g, "dO", kDO, desc.o);
      auto stats = Input(g, "Stats", kStats, desc.stats);
      stats->set_data_type(fe::DataType_t::FLOAT);
      auto attrs = fe::graph::SDPA_backward_attributes()
                       .set_name("loom_sdpa_bwd")
                       .set_causal_mask(desc.causal)
                       .set_attn_scale(desc.scale)
                       .set_deterministic_algorithm(desc.deterministic);
      auto [dq, dk, dv] = g.sdpa_backward(q, k, v, o, dout, stats, std::move(attrs));
      Output(dq, kDQ, desc.dq);
      Output(dk, kDK, desc.dk);
      Output(dv, kDV, desc.dv);
    }
    if (absl::Status st = FromFe("validate", desc, g.validate()); !st.ok()) return st;
  } catch (const std::exception& e) {
    return FromException("describe", desc, e);
  }
  return std::unique_ptr<SdpaGraph>(new SdpaGraph(desc, std::move(impl)));
}

absl::Status SdpaGraph::Build(cudnnContext* handle) {
  try {
    fe::graph::Graph& g = impl_->graph;
    absl::Status st = FromFe("build_operation_graph", desc_, g.build_operation_graph(handle),
                             absl::StatusCode::kInternal);
    if (!st.ok()) return st;
    st = FromFe("create_execution_plans", desc_,
                g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}),
                absl::StatusCode::kUnimplemented);
    if (!st.ok()) return st;
    st = FromFe("check_support", desc_, g.check_support(), absl::StatusCode::kUnimplemented);
    if (!st.ok()) return st;
    return FromFe("build_plans", desc_, g.build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE),
                  absl::StatusCode::kUnimplemented);
  } catch (const std::exception& e) {
    return FromException("build", desc_, e);
  }
}

int64_t SdpaGraph::WorkspaceBytes() const {
  int64_t bytes = 0;
  try {
    if (!impl_->graph.get_workspace_size(bytes).is_good()) return 0;
  } catch (const std::exception&) {
    return 0;
  }
  return bytes;
}

absl::Status SdpaGraph::Execute(cudnnContext* handle, const SdpaPointers& p,
                                void* workspace) const {
  auto mut = [](const void* ptr) { return const_cast<void*>(ptr); };
  std::unordered_map<int64_t, void*> pack = {
      {kQ, mut(p.q)}, {kK, mut(p.k)}, {kV, mut(p.v)}, {kO, p.o}, {kStats, p.stats}};
  if (desc_.direction == Direction::kBackward) {
    pack[kDO] = mut(p.dout);
    pack[kDQ] = p.dq;
    pack[kDK] = p.dk;
    pack[kDV] = p.dv;
  }
  try {
    return FromFe("execute", desc_, impl_->graph.execute(handle, pack, workspace),
                  absl::StatusCode::kInternal);
  } catch (const std::exception& e) {
    return FromException("execute", desc_, e);
  }
}

}  // namespace loom::core::cuda::cudnn
