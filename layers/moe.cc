#include "layers/moe.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "core/ops/ops.h"
#include "core/storage.h"
#include "core/status_macros.h"
#include "layers/mappings.h"
#include "layers/weight_grad_store.h"

namespace loom::layers {

using core::DType;
using core::Shape;
using core::Tensor;

MoeOptions MoeOptionsOf(const GptConfig& c) {
  MoeOptions o;
  o.experts = c.num_experts;
  o.topk = c.moe_router_topk;
  o.swiglu = c.swiglu;
  o.aux_loss = c.moe_router_load_balancing_type == MoeLoadBalancing::kAuxLoss;
  o.aux_loss_coeff = c.moe_aux_loss_coeff;
  o.z_loss_coeff = c.moe_z_loss_coeff;
  o.capacity_factor = c.moe_expert_capacity_factor;
  o.pad_to_capacity = c.moe_pad_expert_input_to_capacity;
  o.grouped_gemm = c.moe_grouped_gemm;
  return o;
}

namespace {

// Megatron's get_capacity(tokens · K, E, factor).
int64_t Capacity(int64_t tokens, const MoeOptions& o) {
  return static_cast<int64_t>(std::ceil(static_cast<double>(tokens * o.topk) /
                                        static_cast<double>(o.experts) * o.capacity_factor));
}

// Sets r's load-balancing statistics and loss (see Routing).
void SetAuxLoss(Routing* r, const MoeOptions& o, std::vector<int64_t> counts,
                const std::vector<double>& score_sum, int64_t tokens, double grad_scale) {
  r->aux_counts = std::move(counts);
  r->aux_tokens = tokens;
  r->aux_grad_scale = grad_scale;
  r->aux_loss = 0;
  if (!o.aux_loss || o.aux_loss_coeff <= 0 || tokens <= 0) return;
  // Switch Transformer: E · Σ_e f_e · P_e with f_e the share of the T·K
  // assignments and P_e the mean router probability (Megatron's formula).
  double dot = 0;
  for (int64_t e = 0; e < r->experts; ++e) dot += score_sum[e] * double(r->aux_counts[e]);
  const double T = double(tokens);
  r->aux_loss = o.aux_loss_coeff * double(r->experts) / (double(r->topk) * T * T) * dot;
}

}  // namespace

namespace {

absl::Status CheckRouteOptions(int64_t T, const MoeOptions& o) {
  const int64_t E = o.experts, K = o.topk;
  if (E < 1 || K < 1 || K > E || T < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Route: top-", K, " of ", E, " experts for ",
                                                   T, " tokens (--moe-router-topk, --num-experts)"));
  }
  return absl::OkStatus();
}

// A host copy of `t` as a vector (i32 or f32).
template <typename T>
absl::StatusOr<std::vector<T>> HostVector(const Tensor& t) {
  Tensor host = t;
  if (!t.device().is_cpu()) {
    LOOM_ASSIGN_OR_RETURN(host, t.To(core::Device::CPU()));
  }
  const T* p = host.data<T>();
  return std::vector<T>(p, p + host.numel());
}

// A host tensor moved to `device` (itself on the CPU).
absl::StatusOr<Tensor> OnDevice(const Tensor& host, core::Device device) {
  if (device.is_cpu()) return host;
  return host.To(device);
}

// The aux loss's gradient with respect to softmax(logits_t)_e, the same for
// every token: w · coeff · E / (K·T²) · count[e] (T, count: the aux
// statistics', times their scale). Empty without an aux loss.
std::vector<double> AuxGrad(const Routing& r, float w, const MoeOptions& o) {
  const int64_t T = r.tokens, K = r.topk, E = r.experts;
  if (!(o.aux_loss && o.aux_loss_coeff > 0 && r.aux_tokens > 0 && T > 0)) return {};
  std::vector<double> g(E, 0.0);
  const double Ta = double(r.aux_tokens);
  for (int64_t e = 0; e < E; ++e) {
    g[e] = r.aux_grad_scale * double(w) * o.aux_loss_coeff * double(E) / (double(K) * Ta * Ta) *
           double(r.aux_counts[e]);
  }
  return g;
}

// dlogits [T, E] f32 on the logits' device (core::ops::MoeRouterBackward).
absl::Status RouterBackwardOnDevice(const Routing& r, const Tensor& logits, const Tensor& dprob,
                                    float w, const MoeOptions& o, Tensor* dlogits) {
  const std::vector<double> g = AuxGrad(r, w, o);
  core::ops::MoeRouterBackwardOptions b;
  b.aux_loss = !g.empty();
  b.z_loss = o.z_loss_coeff > 0 && r.tokens > 0;
  b.z_scale = double(w) * o.z_loss_coeff * 2.0;  // · lse / T per token, as before
  Tensor aux;
  if (b.aux_loss) {
    LOOM_ASSIGN_OR_RETURN(Tensor host, Tensor::Empty(Shape{r.experts}, DType::kF64));
    std::copy(g.begin(), g.end(), host.data<double>());
    LOOM_ASSIGN_OR_RETURN(aux, OnDevice(host, logits.device()));
  }
  return core::ops::MoeRouterBackward(logits, r.expert_t, r.prob_t, dprob, aux, b, dlogits);
}

}  // namespace

absl::StatusOr<Routing> RouteOnDevice(const Tensor& logits, const MoeOptions& o) {
  if (logits.rank() != 2 || logits.dtype() != DType::kF32 || logits.dim(1) != o.experts) {
    return absl::InvalidArgumentError(absl::StrCat("Route: logits ", logits.DebugString(),
                                                   ", expected f32 [T, ", o.experts, "]"));
  }
  const int64_t T = logits.dim(0), E = o.experts, K = o.topk;
  LOOM_RETURN_IF_ERROR(CheckRouteOptions(T, o));
  const core::Device device = logits.device();
  Routing r;
  r.tokens = T;
  r.topk = K;
  r.experts = E;
  core::ops::MoeRouteOptions ro;
  ro.experts = E;
  ro.topk = K;
  LOOM_ASSIGN_OR_RETURN(r.expert_t, Tensor::Empty(Shape{T, K}, DType::kI32, device));
  LOOM_ASSIGN_OR_RETURN(r.prob_t, Tensor::Empty(Shape{T, K}, DType::kF32, device));
  LOOM_ASSIGN_OR_RETURN(Tensor stats, Tensor::Empty(Shape{2 * E + 1}, DType::kF64, device));
  LOOM_RETURN_IF_ERROR(core::ops::MoeRouteTopK(logits, ro, &r.expert_t, &r.prob_t, &stats));
  // The one device-to-host copy of routing: the exchange plan and the losses
  // need the counts (as Megatron syncs them for its all-to-all-v).
  LOOM_ASSIGN_OR_RETURN(const std::vector<double> st, HostVector<double>(stats));
  r.tokens_per_expert.resize(E);
  for (int64_t e = 0; e < E; ++e) r.tokens_per_expert[e] = static_cast<int64_t>(st[e]);
  r.score_sum.assign(st.begin() + E, st.begin() + 2 * E);
  const double z_sum = st[2 * E];
  SetAuxLoss(&r, o, r.tokens_per_expert, r.score_sum, T, 1.0);
  if (o.z_loss_coeff > 0 && T > 0) r.z_loss = o.z_loss_coeff * z_sum / double(T);

  // Under a capacity each expert keeps its `capacity` most probable
  // assignments (ties: the earlier token); the kernel lays them out.
  if (o.capacity_factor > 0) r.capacity = Capacity(T, o);
  r.expert_rows.assign(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = r.tokens_per_expert[e];
    const int64_t kept = r.capacity > 0 ? std::min(n, r.capacity) : n;
    r.dropped += n - kept;
    const int64_t rows = o.pad_to_capacity && r.capacity > 0 ? r.capacity : kept;
    r.expert_rows[e + 1] = r.expert_rows[e] + rows;
  }
  ro.capacity = r.capacity;
  ro.pad_to_capacity = o.pad_to_capacity && r.capacity > 0;
  LOOM_ASSIGN_OR_RETURN(r.row_t, Tensor::Empty(Shape{T, K}, DType::kI32, device));
  LOOM_ASSIGN_OR_RETURN(r.row_token_t,
                        Tensor::Empty(Shape{r.expert_rows[E]}, DType::kI32, device));
  LOOM_RETURN_IF_ERROR(
      core::ops::MoeRouteLayout(r.expert_t, r.prob_t, ro, &r.row_t, &r.row_token_t));
  if (device.is_cpu()) {
    LOOM_ASSIGN_OR_RETURN(r.expert, HostVector<int32_t>(r.expert_t));
    LOOM_ASSIGN_OR_RETURN(r.prob, HostVector<float>(r.prob_t));
    LOOM_ASSIGN_OR_RETURN(r.row, HostVector<int32_t>(r.row_t));
    LOOM_ASSIGN_OR_RETURN(r.row_token, HostVector<int32_t>(r.row_token_t));
  }
  return r;
}

absl::StatusOr<Routing> Route(const float* logits, int64_t T, const MoeOptions& o) {
  LOOM_RETURN_IF_ERROR(CheckRouteOptions(T, o));
  LOOM_ASSIGN_OR_RETURN(Tensor l, Tensor::Empty(Shape{T, o.experts}, DType::kF32));
  std::copy(logits, logits + T * o.experts, l.data<float>());
  return RouteOnDevice(l, o);
}

void RouterBackward(const Routing& r, const float* logits, const float* dprob, float w,
                    const MoeOptions& o, float* dlogits) {
  const int64_t T = r.tokens, K = r.topk, E = r.experts;
  // Host pointers: borrowed as CPU tensors (the routing's own are host ones
  // when it was routed on the host).
  auto borrow = [](const void* p, const Shape& shape, DType dtype) {
    const size_t bytes = static_cast<size_t>(shape.numel()) * core::DTypeSize(dtype);
    return *Tensor::FromStorage(
        core::Storage::Borrow(const_cast<void*>(p), bytes, core::Device::CPU()), 0, shape, dtype);
  };
  Routing host = r;
  if (!host.expert_t.defined() || !host.expert_t.device().is_cpu()) {
    host.expert_t = borrow(r.expert.data(), Shape{T, K}, DType::kI32);
    host.prob_t = borrow(r.prob.data(), Shape{T, K}, DType::kF32);
  }
  Tensor out = borrow(dlogits, Shape{T, E}, DType::kF32);
  const absl::Status s = RouterBackwardOnDevice(host, borrow(logits, Shape{T, E}, DType::kF32),
                                                borrow(dprob, Shape{T, K}, DType::kF32), w, o,
                                                &out);
  if (!s.ok()) std::fprintf(stderr, "loom: RouterBackward: %s\n", std::string(s.message()).c_str());
}

int64_t MoeMlp::Saved::Bytes() const {
  int64_t n = 0;
  for (const Tensor* t : {&input, &logits, &dispatched, &pre_act, &act, &expert_out}) {
    if (t->defined()) n += static_cast<int64_t>(t->nbytes());
  }
  // With EP the experts' rows are a tensor of their own (else `dispatched`).
  if (expert_in.defined() && expert_in.storage() != dispatched.storage()) {
    n += static_cast<int64_t>(expert_in.nbytes());
  }
  return n;
}

namespace {

// The weight's local shard as the [rows, cols] GEMM operand (SwiGLU's fc1 is
// stored [2, F·h/p] and used as [2F/p, h]).
absl::StatusOr<Tensor> Matrix(const Tensor& t, int64_t cols) {
  return t.Reshape(Shape{t.numel() / cols, cols});
}

absl::StatusOr<Tensor> Rows(const Tensor& t, int64_t first, int64_t n) {
  return t.Narrow(first, n);
}

// Runs fn(l) for every local expert with rows (`rows`: [experts + 1] row
// offsets): one after the other (each GEMM using every core), or with
// --moe-grouped-gemm all at once, an expert per thread (each GEMM on one
// core: many small experts fill the machine better than one small GEMM at a
// time). Experts write disjoint rows and their own gradients. Returns the
// first error.
template <typename Fn>
absl::Status ForEachExpert(const std::vector<int64_t>& rows, bool grouped, Fn fn) {
  const int64_t E = static_cast<int64_t>(rows.size()) - 1;
  if (!grouped) {
    for (int64_t e = 0; e < E; ++e) {
      if (rows[e + 1] > rows[e]) LOOM_RETURN_IF_ERROR(fn(e));
    }
    return absl::OkStatus();
  }
  absl::Status first;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t e = 0; e < E; ++e) {
    if (rows[e + 1] == rows[e]) continue;
    absl::Status s = fn(e);
    if (!s.ok()) {
#pragma omp critical(loom_moe_expert_error)
      if (first.ok()) first = s;
    }
  }
  return first;
}

absl::StatusOr<Tensor> IdsTensor(const std::vector<int32_t>& ids, core::Device device) {
  LOOM_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(Shape{static_cast<int64_t>(ids.size())},
                                                DType::kI32));
  std::copy(ids.begin(), ids.end(), t.data<int32_t>());
  return OnDevice(t, device);
}

// Rows `ids` (i32 [n] on table's device; -1: a zero row) of `table` [R, h]
// into a new [n, h] tensor.
absl::StatusOr<Tensor> GatherRows(const Tensor& table, const Tensor& ids) {
  LOOM_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(Shape{ids.numel(), table.dim(1)},
                                                  table.dtype(), table.device()));
  LOOM_RETURN_IF_ERROR(core::ops::MoePermute(table, ids, &out));
  return out;
}

// Issues an all-to-all and waits for it; with `stats`, times the issue call,
// the wait and the whole (the default path only tests the pointer).
template <typename Issue>
absl::Status TimedAllToAll(MoeCommStats* stats, bool backward, Issue issue) {
  if (stats == nullptr) return issue()->Wait();
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  comm::WorkPtr work = issue();
  const Clock::time_point t1 = Clock::now();
  absl::Status s = work->Wait();
  const Clock::time_point t2 = Clock::now();
  auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  ++stats->calls;
  (backward ? stats->backward_ms : stats->forward_ms) += ms(t2 - t0);
  stats->blocked_ms += ms((t1 - t0) + (t2 - t1));
  return s;
}

}  // namespace

absl::StatusOr<ExpertExchange> MoeMlp::PlanExchange(const Routing& r, int64_t h) const {
  ExpertExchange x;
  if (!ep_.parallel()) {
    x.local_rows = r.expert_rows;
    return x;
  }
  const int64_t E = r.experts, P = ep_.size(), El = E / P;
  // Rows per expert: block j (El experts) goes to rank j; back comes, in
  // block j, rank j's rows for each of this rank's experts.
  // The counts travel where the activations live (a device communicator
  // takes device buffers), then come back to the host for the plan.
  const core::Device device = r.row_token_t.device();
  LOOM_ASSIGN_OR_RETURN(Tensor mine, Tensor::Empty(Shape{E}, DType::kI64));
  for (int64_t e = 0; e < E; ++e) {
    mine.data<int64_t>()[e] = r.expert_rows[e + 1] - r.expert_rows[e];
  }
  LOOM_ASSIGN_OR_RETURN(mine, OnDevice(mine, device));
  LOOM_ASSIGN_OR_RETURN(Tensor theirs, Tensor::Empty(Shape{E}, DType::kI64, device));
  LOOM_RETURN_IF_ERROR(TimedAllToAll(comm_stats_, /*backward=*/false,
                                     [&] { return ep_.comm->AllToAll(mine, theirs); }));
  LOOM_ASSIGN_OR_RETURN(const std::vector<int64_t> counts, HostVector<int64_t>(theirs));
  const int64_t* count = counts.data();  // [source j][local expert l]
  x.send.resize(P);
  x.recv.resize(P);
  std::vector<int64_t> source_first(P * El);  // where block (j, l) starts in the received rows
  int64_t at = 0;
  for (int64_t j = 0; j < P; ++j) {
    x.send[j] = (r.expert_rows[(j + 1) * El] - r.expert_rows[j * El]) * h;
    int64_t rows = 0;
    for (int64_t l = 0; l < El; ++l) {
      source_first[j * El + l] = at;
      at += count[j * El + l];
      rows += count[j * El + l];
    }
    x.recv[j] = rows * h;
  }
  // Expert-major: expert l's rows from rank 0, then rank 1, ...
  x.local_rows.assign(El + 1, 0);
  x.inverse.resize(at);
  for (int64_t l = 0; l < El; ++l) {
    for (int64_t j = 0; j < P; ++j) {
      for (int64_t i = 0; i < count[j * El + l]; ++i) {
        x.inverse[source_first[j * El + l] + i] = static_cast<int32_t>(x.perm.size());
        x.perm.push_back(static_cast<int32_t>(source_first[j * El + l] + i));
      }
    }
    x.local_rows[l + 1] = static_cast<int64_t>(x.perm.size());
  }
  LOOM_ASSIGN_OR_RETURN(x.perm_t, IdsTensor(x.perm, device));
  LOOM_ASSIGN_OR_RETURN(x.inverse_t, IdsTensor(x.inverse, device));
  return x;
}

absl::StatusOr<Tensor> MoeMlp::ToExperts(const ExpertExchange& x, const Tensor& rows,
                                         bool backward) const {
  if (!ep_.parallel()) return rows;
  const int64_t h = rows.dim(1);
  LOOM_ASSIGN_OR_RETURN(
      Tensor received,
      Tensor::Empty(Shape{static_cast<int64_t>(x.perm.size()), h}, rows.dtype(), rows.device()));
  LOOM_RETURN_IF_ERROR(TimedAllToAll(
      comm_stats_, backward, [&] { return ep_.comm->AllToAllV(rows, x.send, received, x.recv); }));
  return GatherRows(received, x.perm_t);
}

absl::StatusOr<Tensor> MoeMlp::FromExperts(const ExpertExchange& x, const Tensor& rows,
                                           bool backward) const {
  if (!ep_.parallel()) return rows;
  const int64_t h = rows.dim(1);
  int64_t n = 0;
  for (int64_t c : x.send) n += c / h;
  LOOM_ASSIGN_OR_RETURN(Tensor by_source, GatherRows(rows, x.inverse_t));
  LOOM_ASSIGN_OR_RETURN(Tensor back, Tensor::Empty(Shape{n, h}, rows.dtype(), rows.device()));
  LOOM_RETURN_IF_ERROR(TimedAllToAll(
      comm_stats_, backward, [&] { return ep_.comm->AllToAllV(by_source, x.recv, back, x.send); }));
  return back;
}

absl::Status MoeMlp::AuxStatsOverCp(Routing* r) const {
  const int64_t E = r->experts;
  // Counts (exact in f64) and probability sums of every CP rank's tokens.
  LOOM_ASSIGN_OR_RETURN(Tensor stats, Tensor::Empty(Shape{2 * E}, DType::kF64));
  double* s = stats.data<double>();
  for (int64_t e = 0; e < E; ++e) {
    s[e] = double(r->tokens_per_expert[e]);
    s[E + e] = r->score_sum[e];
  }
  // Reduced where the activations live (a device communicator takes device buffers).
  LOOM_ASSIGN_OR_RETURN(Tensor reduced, OnDevice(stats, r->expert_t.device()));
  LOOM_RETURN_IF_ERROR(cp_.comm->AllReduce(reduced, comm::ReduceOp::kSum)->Wait());
  if (!reduced.device().is_cpu()) {
    LOOM_ASSIGN_OR_RETURN(stats, reduced.To(core::Device::CPU()));
    s = stats.data<double>();
  }
  std::vector<int64_t> counts(E);
  for (int64_t e = 0; e < E; ++e) counts[e] = static_cast<int64_t>(s[e]);
  SetAuxLoss(r, options_, std::move(counts), std::vector<double>(s + E, s + 2 * E),
             r->tokens * cp_.size(), cp_.size());
  return absl::OkStatus();
}

MoeMlp MoeMlp::ForLayer(ParamBuffer* params, const GptConfig& c, int64_t layer, TpGroup tp,
                        EpGroup ep, CpGroup cp) {
  const BlockParamNames names(layer);
  std::vector<Param*> fc1, fc2;
  const int64_t first = ep.shard().first(c.num_experts);
  for (int64_t e = first; e < first + ep.shard().count(c.num_experts); ++e) {
    fc1.push_back(&params->at(names.expert_fc1_weight(e)));
    fc2.push_back(&params->at(names.expert_fc2_weight(e)));
  }
  return MoeMlp(&params->at(names.router_weight), std::move(fc1), std::move(fc2),
                MoeOptionsOf(c), tp, ep, cp);
}

absl::StatusOr<Tensor> MoeMlp::Forward(const Tensor& x, Saved* saved) const {
  // The CPU kernels compute in f32; a device's take f32 or bf16 activations.
  const bool host = x.device().is_cpu();
  if (x.rank() != 3 || !(x.dtype() == DType::kF32 || (!host && x.dtype() == DType::kBF16))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoE layer: input ", x.DebugString(),
        ", expected [s, b, h] in f32 (on a device also bf16)"));
  }
  if (router_->value.device() != x.device() || router_->value.dtype() != x.dtype()) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoE layer: input ", x.DebugString(), " does not match the router weight ",
                     router_->value.DebugString(), " in dtype and device"));
  }
  const DType dt = x.dtype();
  const core::Device dev = x.device();
  const int64_t h = x.dim(2);
  Tensor full = x;
  if (tp_.sequence_parallel) {
    LOOM_ASSIGN_OR_RETURN(full, AllGatherSeq(tp_, x));
  }
  const Shape out_shape = full.shape();
  const int64_t T = full.numel() / h, E = options_.experts;
  LOOM_ASSIGN_OR_RETURN(saved->input, full.Reshape(Shape{T, h}));
  LOOM_ASSIGN_OR_RETURN(saved->logits, Tensor::Empty(Shape{T, E}, DType::kF32, dev));
  LOOM_RETURN_IF_ERROR(
      core::ops::Matmul(saved->input, router_->value, &saved->logits, {.trans_b = true}));
  LOOM_ASSIGN_OR_RETURN(saved->routing, RouteOnDevice(saved->logits, options_));
  if (cp_.parallel()) LOOM_RETURN_IF_ERROR(AuxStatsOverCp(&saved->routing));
  const Routing& r = saved->routing;

  // Dispatch: one row per kept assignment, grouped by expert (and so by the
  // EP rank that owns it), then to the experts.
  LOOM_ASSIGN_OR_RETURN(saved->dispatched, GatherRows(saved->input, r.row_token_t));
  LOOM_ASSIGN_OR_RETURN(saved->exchange, PlanExchange(r, h));
  const ExpertExchange& xc = saved->exchange;
  LOOM_ASSIGN_OR_RETURN(saved->expert_in, ToExperts(xc, saved->dispatched, /*backward=*/false));
  const int64_t M = saved->expert_in.dim(0);
  const int64_t f = fc2_[0]->value.dim(1);  // f/p
  const int64_t f1 = options_.swiglu ? 2 * f : f;
  LOOM_ASSIGN_OR_RETURN(saved->pre_act, Tensor::Empty(Shape{M, f1}, dt, dev));
  LOOM_ASSIGN_OR_RETURN(saved->act, Tensor::Empty(Shape{M, f}, dt, dev));
  LOOM_ASSIGN_OR_RETURN(Tensor out_rows, Tensor::Empty(Shape{M, h}, dt, dev));
  // An expert without tokens computes nothing. Side by side only on the
  // host: a device's stream is per thread. (A grouped GEMM is a follow-up.)
  LOOM_RETURN_IF_ERROR(ForEachExpert(xc.local_rows, options_.grouped_gemm && host,
                                     [&](int64_t l) -> absl::Status {
    const int64_t first = xc.local_rows[l], n = xc.local_rows[l + 1] - first;
    LOOM_ASSIGN_OR_RETURN(Tensor xe, Rows(saved->expert_in, first, n));
    LOOM_ASSIGN_OR_RETURN(Tensor pre, Rows(saved->pre_act, first, n));
    LOOM_ASSIGN_OR_RETURN(Tensor act, Rows(saved->act, first, n));
    LOOM_ASSIGN_OR_RETURN(Tensor out, Rows(out_rows, first, n));
    LOOM_ASSIGN_OR_RETURN(Tensor w1, Matrix(fc1_[l]->value, h));
    LOOM_RETURN_IF_ERROR(core::ops::Matmul(xe, w1, &pre, {.trans_b = true}));
    LOOM_RETURN_IF_ERROR(options_.swiglu ? core::ops::SwigluForward(pre, &act)
                                         : core::ops::GeluForward(pre, &act));
    return core::ops::Matmul(act, fc2_[l]->value, &out, {.trans_b = true});
  }));
  LOOM_ASSIGN_OR_RETURN(saved->expert_out, FromExperts(xc, out_rows, /*backward=*/false));

  // Combine: y_t = Σ_k prob_tk · out_row(t,k), in k order (deterministic).
  LOOM_ASSIGN_OR_RETURN(Tensor y, Tensor::Empty(Shape{T, h}, dt, dev));
  LOOM_RETURN_IF_ERROR(core::ops::MoeCombineForward(saved->expert_out, r.prob_t, r.row_t, &y));
  LOOM_ASSIGN_OR_RETURN(y, y.Reshape(out_shape));
  if (tp_.sequence_parallel) return ReduceScatterSeq(tp_, y);
  LOOM_RETURN_IF_ERROR(AllReduceTp(tp_, y));
  return y;
}

absl::StatusOr<Tensor> MoeMlp::Backward(const Tensor& dy, float loss_weight,
                                        const Saved& saved) const {
  const Routing& r = saved.routing;
  const ExpertExchange& xc = saved.exchange;
  const int64_t T = r.tokens, K = r.topk, E = r.experts, h = saved.input.dim(1);
  Tensor dfull = dy;
  if (tp_.sequence_parallel) {
    LOOM_ASSIGN_OR_RETURN(dfull, AllGatherSeq(tp_, dy));
  }
  LOOM_ASSIGN_OR_RETURN(Tensor d2, dfull.Reshape(Shape{T, h}));
  const DType dt = d2.dtype();
  const core::Device dev = d2.device();
  const int64_t N = saved.expert_out.dim(0);

  // The combine's gradients: d out_row = prob · dy_t; dprob_tk = ⟨dy_t,
  // out_row⟩, a partial sum over TP (the rows are) completed by an all-reduce.
  LOOM_ASSIGN_OR_RETURN(Tensor dout, Tensor::Empty(Shape{N, h}, dt, dev));
  LOOM_ASSIGN_OR_RETURN(Tensor dprob, Tensor::Empty(Shape{T, K}, DType::kF32, dev));
  LOOM_RETURN_IF_ERROR(
      core::ops::MoeCombineBackward(d2, saved.expert_out, r.prob_t, r.row_t, &dout, &dprob));
  comm::WorkPtr dprob_sum = AllReduceTpAsync(tp_, dprob);

  // The experts, backwards, on the rows they computed; their input gradients
  // go back to the assignments' owners and scatter-add into dx.
  LOOM_ASSIGN_OR_RETURN(Tensor dexp_out, ToExperts(xc, dout, /*backward=*/true));
  const int64_t M = saved.expert_in.dim(0);
  LOOM_ASSIGN_OR_RETURN(Tensor dexp_in, Tensor::Empty(Shape{M, h}, dt, dev));
  LOOM_ASSIGN_OR_RETURN(Tensor dact_all, Tensor::Empty(saved.act.shape(), dt, dev));
  LOOM_ASSIGN_OR_RETURN(Tensor dpre_all, Tensor::Empty(saved.pre_act.shape(), dt, dev));
  LOOM_RETURN_IF_ERROR(ForEachExpert(xc.local_rows, options_.grouped_gemm && dev.is_cpu(),
                                     [&](int64_t l) -> absl::Status {
    const int64_t first = xc.local_rows[l], n = xc.local_rows[l + 1] - first;
    LOOM_ASSIGN_OR_RETURN(Tensor pre, Rows(saved.pre_act, first, n));
    LOOM_ASSIGN_OR_RETURN(Tensor de, Rows(dexp_out, first, n));
    LOOM_ASSIGN_OR_RETURN(Tensor dxe, Rows(dexp_in, first, n));
    LOOM_ASSIGN_OR_RETURN(Tensor dact, Rows(dact_all, first, n));
    LOOM_ASSIGN_OR_RETURN(Tensor dpre, Rows(dpre_all, first, n));
    LOOM_RETURN_IF_ERROR(core::ops::Matmul(de, fc2_[l]->value, &dact));
    if (options_.swiglu) {
      LOOM_RETURN_IF_ERROR(core::ops::SwigluBackward(dact, pre, &dpre));
    } else {
      LOOM_RETURN_IF_ERROR(core::ops::GeluBackward(pre, dact, &dpre));
    }
    LOOM_ASSIGN_OR_RETURN(Tensor w1, Matrix(fc1_[l]->value, h));
    return core::ops::Matmul(dpre, w1, &dxe);
  }));
  // The experts' weight gradients, each from its own rows: now, or at a split
  // backward's BackwardWeight (layers/weight_grad_store.h), which then keeps
  // the experts' output and pre-activation gradients.
  LOOM_RETURN_IF_ERROR(WeightGradStore::RunOrDefer(
      [this, rows = xc.local_rows, grouped = options_.grouped_gemm && dev.is_cpu(),
       expert_in = saved.expert_in, act_all = saved.act, dexp_out, dpre_all,
       h]() -> absl::Status {
        return ForEachExpert(rows, grouped, [&](int64_t l) -> absl::Status {
          const int64_t first = rows[l], n = rows[l + 1] - first;
          LOOM_ASSIGN_OR_RETURN(Tensor xe, Rows(expert_in, first, n));
          LOOM_ASSIGN_OR_RETURN(Tensor act, Rows(act_all, first, n));
          LOOM_ASSIGN_OR_RETURN(Tensor de, Rows(dexp_out, first, n));
          LOOM_ASSIGN_OR_RETURN(Tensor dpre, Rows(dpre_all, first, n));
          LOOM_RETURN_IF_ERROR(
              core::ops::Matmul(de, act, &fc2_[l]->grad, {.trans_a = true, .beta = 1.0f}));
          LOOM_ASSIGN_OR_RETURN(Tensor dw1, Matrix(fc1_[l]->grad, h));
          return core::ops::Matmul(dpre, xe, &dw1, {.trans_a = true, .beta = 1.0f});
        });
      },
      static_cast<int64_t>(dexp_out.nbytes() + dpre_all.nbytes())));
  LOOM_ASSIGN_OR_RETURN(Tensor ddisp, FromExperts(xc, dexp_in, /*backward=*/true));
  // Each token sums its rows' gradients (no atomics; padding rows have none).
  LOOM_ASSIGN_OR_RETURN(Tensor dx, Tensor::Empty(Shape{T, h}, dt, dev));
  LOOM_RETURN_IF_ERROR(core::ops::MoePermuteBackward(ddisp, r.row_t, &dx));

  // The router: its gradients are whole on every TP rank (same tokens, the
  // summed dprob), so its input gradient joins after the experts' reduction.
  if (dprob_sum != nullptr) LOOM_RETURN_IF_ERROR(dprob_sum->Wait());
  LOOM_ASSIGN_OR_RETURN(Tensor dlogits, Tensor::Empty(Shape{T, E}, DType::kF32, dev));
  LOOM_RETURN_IF_ERROR(
      RouterBackwardOnDevice(r, saved.logits, dprob, loss_weight, options_, &dlogits));
  if (dt != DType::kF32) {  // the router's GEMMs take the activations' dtype
    LOOM_ASSIGN_OR_RETURN(Tensor rounded, Tensor::Empty(Shape{T, E}, dt, dev));
    LOOM_RETURN_IF_ERROR(core::ops::Convert(dlogits, &rounded));
    dlogits = rounded;
  }
  LOOM_RETURN_IF_ERROR(WeightGradStore::RunOrDefer(
      [this, dlogits, input = saved.input]() -> absl::Status {
        return core::ops::Matmul(dlogits, input, &router_->grad, {.trans_a = true, .beta = 1.0f});
      },
      static_cast<int64_t>(dlogits.nbytes())));
  LOOM_ASSIGN_OR_RETURN(Tensor drouter, Tensor::Empty(Shape{T, h}, dt, dev));
  LOOM_RETURN_IF_ERROR(core::ops::Matmul(dlogits, router_->value, &drouter));

  LOOM_ASSIGN_OR_RETURN(dx, dx.Reshape(dfull.shape()));
  LOOM_ASSIGN_OR_RETURN(drouter, drouter.Reshape(dfull.shape()));
  if (tp_.sequence_parallel) {
    LOOM_ASSIGN_OR_RETURN(dx, ReduceScatterSeq(tp_, dx));
    const int64_t local = dx.dim(0);
    LOOM_ASSIGN_OR_RETURN(drouter, drouter.Narrow(tp_.rank() * local, local));
  } else {
    LOOM_RETURN_IF_ERROR(AllReduceTp(tp_, dx));
  }
  LOOM_RETURN_IF_ERROR(core::ops::Add(dx, drouter, &dx));
  return dx;
}

}  // namespace loom::layers
