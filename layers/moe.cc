#include "layers/moe.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
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

// Runs fn(l) for every local expert with rows (`rows`: each one's first row
// and count): one after the other (each GEMM using every core), or with
// --moe-grouped-gemm all at once, an expert per thread (each GEMM on one
// core: many small experts fill the machine better than one small GEMM at a
// time). Experts write disjoint rows and their own gradients. Returns the
// first error.
// Expert l's rows [first, first + count) from [experts + 1] offsets.
ExpertRows RangesOf(const std::vector<int64_t>& offsets) {
  ExpertRows rows;
  for (size_t l = 0; l + 1 < offsets.size(); ++l) {
    rows.push_back({offsets[l], offsets[l + 1] - offsets[l]});
  }
  return rows;
}

template <typename Fn>
absl::Status ForEachExpert(const ExpertRows& rows, bool grouped, Fn fn) {
  const int64_t E = static_cast<int64_t>(rows.size());
  if (!grouped) {
    for (int64_t e = 0; e < E; ++e) {
      if (rows[e].second > 0) LOOM_RETURN_IF_ERROR(fn(e));
    }
    return absl::OkStatus();
  }
  absl::Status first;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t e = 0; e < E; ++e) {
    if (rows[e].second == 0) continue;
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

// An all-to-all in flight; with `stats`, the issue call, any Poll and the
// Wait count as blocked, and the span runs from the issue to the first Poll
// that saw it done, or the Wait's return (the default path only tests the
// pointer).
class PendingAllToAll {
 public:
  using Clock = std::chrono::steady_clock;
  template <typename Issue>
  PendingAllToAll(MoeCommStats* stats, bool backward, Issue issue)
      : stats_(stats), backward_(backward) {
    if (stats_ == nullptr) {
      work_ = issue();
      return;
    }
    const Clock::time_point t0 = Clock::now();
    if (stats_->in_flight++ == 0) stats_->busy_since = t0;
    work_ = issue();
    stats_->blocked_ms += Ms(Clock::now() - t0);
  }
  PendingAllToAll(const PendingAllToAll&) = delete;
  PendingAllToAll& operator=(const PendingAllToAll&) = delete;
  ~PendingAllToAll() { (void)Wait(); }  // never leaves an exchange on freed buffers

  // Only for the statistics: notes the completion if it is done.
  void Poll() {
    if (stats_ == nullptr || waited_ || done_) return;
    const Clock::time_point t0 = Clock::now();
    const bool done = work_->Poll();
    const Clock::time_point t1 = Clock::now();
    stats_->blocked_ms += Ms(t1 - t0);
    if (done) Finished(t1);
  }
  absl::Status Wait() {
    if (waited_) return status_;
    waited_ = true;
    if (stats_ == nullptr || done_) return status_ = work_->Wait();
    const Clock::time_point t0 = Clock::now();
    status_ = work_->Wait();
    const Clock::time_point t1 = Clock::now();
    stats_->blocked_ms += Ms(t1 - t0);
    Finished(t1);
    return status_;
  }

 private:
  static double Ms(Clock::duration d) {
    return std::chrono::duration<double, std::milli>(d).count();
  }
  // Ends this exchange's flight at `t`, and the in-flight interval with the
  // last one.
  void Finished(Clock::time_point t) {
    done_ = true;
    ++stats_->calls;
    if (--stats_->in_flight == 0) {
      (backward_ ? stats_->backward_ms : stats_->forward_ms) += Ms(t - stats_->busy_since);
    }
  }
  MoeCommStats* stats_;
  bool backward_;
  comm::WorkPtr work_;
  bool done_ = false, waited_ = false;
  absl::Status status_;
};

// Issues an all-to-all and waits for it (timed into `stats` when set).
template <typename Issue>
absl::Status TimedAllToAll(MoeCommStats* stats, bool backward, Issue issue) {
  return PendingAllToAll(stats, backward, issue).Wait();
}

// The exchange plan from the rows this rank sends each expert (`mine`, [E])
// and the rows source rank j sends local expert l (`theirs(j, l)`), over P
// EP ranks of E/P experts each, h elements a row.
template <typename Theirs>
absl::StatusOr<ExpertExchange> BuildExchange(const std::vector<int64_t>& mine, Theirs theirs,
                                             int64_t P, int64_t h, core::Device device) {
  const int64_t El = static_cast<int64_t>(mine.size()) / P;
  ExpertExchange x;
  x.send.assign(P, 0);
  x.recv.resize(P);
  std::vector<int64_t> source_first(P * El);  // where block (j, l) starts in the received rows
  int64_t at = 0;
  for (int64_t j = 0; j < P; ++j) {
    int64_t rows = 0;
    for (int64_t l = 0; l < El; ++l) {
      x.send[j] += mine[j * El + l] * h;
      source_first[j * El + l] = at;
      at += theirs(j, l);
      rows += theirs(j, l);
    }
    x.recv[j] = rows * h;
  }
  // Expert-major: expert l's rows from rank 0, then rank 1, ...
  x.local_rows.assign(El + 1, 0);
  x.inverse.resize(at);
  for (int64_t l = 0; l < El; ++l) {
    for (int64_t j = 0; j < P; ++j) {
      for (int64_t i = 0; i < theirs(j, l); ++i) {
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
  std::vector<int64_t> rows(E);
  for (int64_t e = 0; e < E; ++e) rows[e] = r.expert_rows[e + 1] - r.expert_rows[e];
  LOOM_ASSIGN_OR_RETURN(Tensor mine, Tensor::Empty(Shape{E}, DType::kI64));
  std::copy(rows.begin(), rows.end(), mine.data<int64_t>());
  LOOM_ASSIGN_OR_RETURN(mine, OnDevice(mine, device));
  LOOM_ASSIGN_OR_RETURN(Tensor theirs, Tensor::Empty(Shape{E}, DType::kI64, device));
  LOOM_RETURN_IF_ERROR(TimedAllToAll(comm_stats_, /*backward=*/false,
                                     [&] { return ep_.comm->AllToAll(mine, theirs); }));
  LOOM_ASSIGN_OR_RETURN(const std::vector<int64_t> counts, HostVector<int64_t>(theirs));
  // counts: [source j][local expert l]
  return BuildExchange(
      rows, [&](int64_t j, int64_t l) { return counts[j * El + l]; }, P, h, device);
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

absl::Status MoeMlp::ExpertsForward(const ExpertRows& rows, const Tensor& in,
                                    Tensor pre_all, Tensor act_all, Tensor out_all) const {
  const int64_t h = in.dim(1);
  // An expert without tokens computes nothing. Side by side only on the
  // host: a device's stream is per thread. (A grouped GEMM is a follow-up.)
  return ForEachExpert(rows, options_.grouped_gemm && in.device().is_cpu(),
                       [&](int64_t l) -> absl::Status {
    const auto [first, n] = rows[l];
    LOOM_ASSIGN_OR_RETURN(Tensor xe, Rows(in, first, n));
    LOOM_ASSIGN_OR_RETURN(Tensor pre, Rows(pre_all, first, n));
    LOOM_ASSIGN_OR_RETURN(Tensor act, Rows(act_all, first, n));
    LOOM_ASSIGN_OR_RETURN(Tensor out, Rows(out_all, first, n));
    LOOM_ASSIGN_OR_RETURN(Tensor w1, Matrix(fc1_[l]->value, h));
    LOOM_RETURN_IF_ERROR(core::ops::Matmul(xe, w1, &pre, {.trans_b = true}));
    LOOM_RETURN_IF_ERROR(options_.swiglu ? core::ops::SwigluForward(pre, &act)
                                         : core::ops::GeluForward(pre, &act));
    return core::ops::Matmul(act, fc2_[l]->value, &out, {.trans_b = true});
  });
}

absl::Status MoeMlp::ExpertsBackwardInput(const ExpertRows& rows, const Tensor& pre_all,
                                          const Tensor& dout_all, Tensor dact_all,
                                          Tensor dpre_all, Tensor din_all) const {
  const int64_t h = din_all.dim(1);
  return ForEachExpert(rows, options_.grouped_gemm && din_all.device().is_cpu(),
                       [&](int64_t l) -> absl::Status {
    const auto [first, n] = rows[l];
    LOOM_ASSIGN_OR_RETURN(Tensor pre, Rows(pre_all, first, n));
    LOOM_ASSIGN_OR_RETURN(Tensor de, Rows(dout_all, first, n));
    LOOM_ASSIGN_OR_RETURN(Tensor dxe, Rows(din_all, first, n));
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
  });
}

absl::Status MoeMlp::ExpertsWeightGrad(const ExpertRows& rows, const Tensor& in,
                                       const Tensor& act_all, const Tensor& dout_all,
                                       const Tensor& dpre_all) const {
  const int64_t h = in.dim(1);
  return ForEachExpert(rows, options_.grouped_gemm && in.device().is_cpu(),
                       [&](int64_t l) -> absl::Status {
    const auto [first, n] = rows[l];
    LOOM_ASSIGN_OR_RETURN(Tensor xe, Rows(in, first, n));
    LOOM_ASSIGN_OR_RETURN(Tensor act, Rows(act_all, first, n));
    LOOM_ASSIGN_OR_RETURN(Tensor de, Rows(dout_all, first, n));
    LOOM_ASSIGN_OR_RETURN(Tensor dpre, Rows(dpre_all, first, n));
    LOOM_RETURN_IF_ERROR(
        core::ops::Matmul(de, act, &fc2_[l]->grad, {.trans_a = true, .beta = 1.0f}));
    LOOM_ASSIGN_OR_RETURN(Tensor dw1, Matrix(fc1_[l]->grad, h));
    return core::ops::Matmul(dpre, xe, &dw1, {.trans_a = true, .beta = 1.0f});
  });
}

// --- Chunked exchange (--moe-a2a-overlap-chunks > 1 under EP) -------------

absl::Status MoeMlp::PlanChunks(const Routing& r, int64_t h, Saved* saved) const {
  const int64_t T = r.tokens, K = r.topk, E = r.experts, C = options_.a2a_overlap_chunks;
  const int64_t P = ep_.size(), El = E / P, N = r.expert_rows[E];
  const core::Device device = r.row_token_t.device();
  std::vector<int32_t> row_token = r.row_token, row = r.row;
  if (!device.is_cpu()) {  // the per-token decisions stay on a device: fetch them
    LOOM_ASSIGN_OR_RETURN(row_token, HostVector<int32_t>(r.row_token_t));
    LOOM_ASSIGN_OR_RETURN(row, HostVector<int32_t>(r.row_t));
  }
  // Chunk c: tokens t with floor(t·C/T) = c; padding (at each expert's end)
  // goes with the last chunk, so within an expert chunks follow row order.
  auto chunk_of = [&](int32_t t) { return t < 0 ? C - 1 : int64_t{t} * C / T; };
  std::vector<int64_t> count(C * E, 0);  // [chunk][expert] rows
  for (int64_t i = 0; i < N; ++i) {
    const int64_t e = std::upper_bound(r.expert_rows.begin(), r.expert_rows.end(), i) -
                      r.expert_rows.begin() - 1;
    ++count[chunk_of(row_token[i]) * E + e];
  }
  ChunkPlan& plan = saved->chunks;
  plan.dispatch_rows.assign(C + 1, 0);
  std::vector<int64_t> next(C * E);  // the next free chunk-major row of (chunk, expert)
  for (int64_t c = 0, at = 0; c < C; ++c) {
    plan.dispatch_rows[c] = at;
    for (int64_t e = 0; e < E; ++e) {
      next[c * E + e] = at;
      at += count[c * E + e];
    }
    plan.dispatch_rows[c + 1] = at;
  }
  std::vector<int32_t> position(N), chunk_row_token(N), chunk_row(T * K);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t i = r.expert_rows[e]; i < r.expert_rows[e + 1]; ++i) {
      position[i] = static_cast<int32_t>(next[chunk_of(row_token[i]) * E + e]++);
      chunk_row_token[position[i]] = row_token[i];
    }
  }
  for (int64_t a = 0; a < T * K; ++a) chunk_row[a] = row[a] < 0 ? -1 : position[row[a]];
  LOOM_ASSIGN_OR_RETURN(plan.row_token_t, IdsTensor(chunk_row_token, device));
  LOOM_ASSIGN_OR_RETURN(plan.row_t, IdsTensor(chunk_row, device));
  LOOM_ASSIGN_OR_RETURN(plan.row_t, plan.row_t.Reshape(Shape{T, K}));

  // One counts exchange for every chunk: block j = [chunk][rank j's experts].
  LOOM_ASSIGN_OR_RETURN(Tensor mine, Tensor::Empty(Shape{P * C * El}, DType::kI64));
  for (int64_t j = 0; j < P; ++j) {
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t l = 0; l < El; ++l) {
        mine.data<int64_t>()[(j * C + c) * El + l] = count[c * E + j * El + l];
      }
    }
  }
  LOOM_ASSIGN_OR_RETURN(mine, OnDevice(mine, device));
  LOOM_ASSIGN_OR_RETURN(Tensor theirs_t, Tensor::Empty(Shape{P * C * El}, DType::kI64, device));
  LOOM_RETURN_IF_ERROR(TimedAllToAll(comm_stats_, /*backward=*/false,
                                     [&] { return ep_.comm->AllToAll(mine, theirs_t); }));
  // theirs(j, c, l): rows source j sends local expert l in chunk c.
  LOOM_ASSIGN_OR_RETURN(const std::vector<int64_t> theirs, HostVector<int64_t>(theirs_t));
  auto from = [&](int64_t j, int64_t c, int64_t l) { return theirs[(j * C + c) * El + l]; };
  plan.chunk.resize(C);
  for (int64_t c = 0; c < C; ++c) {
    const std::vector<int64_t> rows(count.begin() + c * E, count.begin() + (c + 1) * E);
    LOOM_ASSIGN_OR_RETURN(
        plan.chunk[c],
        BuildExchange(rows, [&](int64_t j, int64_t l) { return from(j, c, l); }, P, h, device));
  }
  // The experts' rows, expert-major: local expert l's rows of chunk 0, 1, ...
  // (each by source, then token), so every expert's rows stay one block for
  // the weight gradients and each chunk's block of an expert is contiguous.
  ExpertExchange& x = saved->exchange;
  x = {};
  x.local_rows.assign(El + 1, 0);
  plan.rows.assign(C, ExpertRows(El));
  for (int64_t l = 0, at = 0; l < El; ++l) {
    for (int64_t c = 0; c < C; ++c) {
      const std::vector<int64_t>& local = plan.chunk[c].local_rows;
      plan.rows[c][l] = {at, local[l + 1] - local[l]};
      at += local[l + 1] - local[l];
    }
    x.local_rows[l + 1] = at;
  }
  // A chunk's combine sends its experts' outputs from those rows.
  for (int64_t c = 0; c < C; ++c) {
    ExpertExchange& xc = plan.chunk[c];
    for (int64_t l = 0; l < El; ++l) {
      for (int64_t i = xc.local_rows[l]; i < xc.local_rows[l + 1]; ++i) {
        const int32_t received = xc.perm[i];
        xc.inverse[received] = static_cast<int32_t>(plan.rows[c][l].first + i - xc.local_rows[l]);
      }
    }
    LOOM_ASSIGN_OR_RETURN(xc.inverse_t, IdsTensor(xc.inverse, device));
  }
  return absl::OkStatus();
}

namespace {

// Runs `body` (which issues and waits the chunks' all-to-alls in `pending`),
// then waits every exchange still in flight, so no buffer is freed under
// one even when `body` failed half-way. Returns the first error.
absl::Status RunPipeline(std::vector<std::unique_ptr<PendingAllToAll>>& pending,
                         const std::function<absl::Status()>& body) {
  absl::Status status = body();
  for (auto& p : pending) {
    if (p != nullptr) {
      const absl::Status s = p->Wait();
      if (status.ok()) status = s;
    }
  }
  return status;
}

}  // namespace

absl::Status MoeMlp::ToExpertRows(const ExpertExchange& x, const ExpertRows& rows,
                                  const Tensor& received, const Tensor& expert_rows) const {
  for (size_t l = 0; l < rows.size(); ++l) {
    const auto [first, n] = rows[l];
    if (n == 0) continue;
    LOOM_ASSIGN_OR_RETURN(Tensor ids, x.perm_t.Narrow(x.local_rows[l], n));
    LOOM_ASSIGN_OR_RETURN(Tensor out, Rows(expert_rows, first, n));
    LOOM_RETURN_IF_ERROR(core::ops::MoePermute(received, ids, &out));
  }
  return absl::OkStatus();
}

absl::Status MoeMlp::ForwardChunks(Saved* saved) const {
  const ChunkPlan& plan = saved->chunks;
  const int64_t C = plan.chunks(), h = saved->input.dim(1);
  const int64_t M = saved->exchange.local_rows.back(), N = plan.dispatch_rows[C];
  const DType dt = saved->input.dtype();
  const core::Device dev = saved->input.device();
  const int64_t f = fc2_[0]->value.dim(1);  // f/p
  LOOM_ASSIGN_OR_RETURN(saved->dispatched, GatherRows(saved->input, plan.row_token_t));
  LOOM_ASSIGN_OR_RETURN(saved->expert_in, Tensor::Empty(Shape{M, h}, dt, dev));
  LOOM_ASSIGN_OR_RETURN(saved->pre_act,
                        Tensor::Empty(Shape{M, options_.swiglu ? 2 * f : f}, dt, dev));
  LOOM_ASSIGN_OR_RETURN(saved->act, Tensor::Empty(Shape{M, f}, dt, dev));
  LOOM_ASSIGN_OR_RETURN(Tensor out_rows, Tensor::Empty(Shape{M, h}, dt, dev));
  LOOM_ASSIGN_OR_RETURN(saved->expert_out, Tensor::Empty(Shape{N, h}, dt, dev));

  // In flight: chunk c's dispatch into received[c], its combine from
  // by_source[c]; 2C exchanges, issued D0 D1 C0 D2 C1 ... (one order on
  // every rank).
  std::vector<Tensor> received(C), by_source(C);
  std::vector<std::unique_ptr<PendingAllToAll>> pending(2 * C);
  auto dispatch = [&](int64_t c) -> absl::Status {
    const ExpertExchange& x = plan.chunk[c];
    LOOM_ASSIGN_OR_RETURN(Tensor send, saved->dispatched.Narrow(
                                           plan.dispatch_rows[c],
                                           plan.dispatch_rows[c + 1] - plan.dispatch_rows[c]));
    LOOM_ASSIGN_OR_RETURN(received[c],
                          Tensor::Empty(Shape{static_cast<int64_t>(x.perm.size()), h}, dt, dev));
    pending[2 * c] = std::make_unique<PendingAllToAll>(comm_stats_, /*backward=*/false, [&] {
      return ep_.comm->AllToAllV(send, x.send, received[c], x.recv);
    });
    return absl::OkStatus();
  };
  return RunPipeline(pending, [&]() -> absl::Status {
    LOOM_RETURN_IF_ERROR(dispatch(0));
    for (int64_t c = 0; c < C; ++c) {
      const ExpertExchange& x = plan.chunk[c];
      LOOM_RETURN_IF_ERROR(pending[2 * c]->Wait());
      if (c + 1 < C) LOOM_RETURN_IF_ERROR(dispatch(c + 1));
      LOOM_RETURN_IF_ERROR(ToExpertRows(x, plan.rows[c], received[c], saved->expert_in));
      received[c] = Tensor();  // its exchange is done
      LOOM_RETURN_IF_ERROR(
          ExpertsForward(plan.rows[c], saved->expert_in, saved->pre_act, saved->act, out_rows));
      for (auto& p : pending) {
        if (p != nullptr) p->Poll();
      }
      LOOM_ASSIGN_OR_RETURN(by_source[c], GatherRows(out_rows, x.inverse_t));
      LOOM_ASSIGN_OR_RETURN(Tensor back, Rows(saved->expert_out, plan.dispatch_rows[c],
                                              plan.dispatch_rows[c + 1] - plan.dispatch_rows[c]));
      pending[2 * c + 1] = std::make_unique<PendingAllToAll>(comm_stats_, false, [&] {
        return ep_.comm->AllToAllV(by_source[c], x.recv, back, x.send);
      });
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<Tensor> MoeMlp::BackwardChunks(const Saved& saved, const Tensor& dout) const {
  const ChunkPlan& plan = saved.chunks;
  const int64_t C = plan.chunks(), h = saved.input.dim(1);
  const int64_t M = saved.exchange.local_rows.back(), N = plan.dispatch_rows[C];
  const DType dt = dout.dtype();
  const core::Device dev = dout.device();
  LOOM_ASSIGN_OR_RETURN(Tensor dexp_out, Tensor::Empty(Shape{M, h}, dt, dev));
  LOOM_ASSIGN_OR_RETURN(Tensor dexp_in, Tensor::Empty(Shape{M, h}, dt, dev));
  LOOM_ASSIGN_OR_RETURN(Tensor dact_all, Tensor::Empty(saved.act.shape(), dt, dev));
  LOOM_ASSIGN_OR_RETURN(Tensor dpre_all, Tensor::Empty(saved.pre_act.shape(), dt, dev));
  LOOM_ASSIGN_OR_RETURN(Tensor ddisp, Tensor::Empty(Shape{N, h}, dt, dev));

  std::vector<Tensor> received(C), by_source(C);
  std::vector<std::unique_ptr<PendingAllToAll>> pending(2 * C);
  auto dispatch = [&](int64_t c) -> absl::Status {
    const ExpertExchange& x = plan.chunk[c];
    LOOM_ASSIGN_OR_RETURN(Tensor send, dout.Narrow(plan.dispatch_rows[c],
                                                   plan.dispatch_rows[c + 1] -
                                                       plan.dispatch_rows[c]));
    LOOM_ASSIGN_OR_RETURN(received[c],
                          Tensor::Empty(Shape{static_cast<int64_t>(x.perm.size()), h}, dt, dev));
    pending[2 * c] = std::make_unique<PendingAllToAll>(comm_stats_, /*backward=*/true, [&] {
      return ep_.comm->AllToAllV(send, x.send, received[c], x.recv);
    });
    return absl::OkStatus();
  };
  LOOM_RETURN_IF_ERROR(RunPipeline(pending, [&]() -> absl::Status {
    LOOM_RETURN_IF_ERROR(dispatch(0));
    for (int64_t c = 0; c < C; ++c) {
      const ExpertExchange& x = plan.chunk[c];
      LOOM_RETURN_IF_ERROR(pending[2 * c]->Wait());
      if (c + 1 < C) LOOM_RETURN_IF_ERROR(dispatch(c + 1));
      LOOM_RETURN_IF_ERROR(ToExpertRows(x, plan.rows[c], received[c], dexp_out));
      received[c] = Tensor();  // its exchange is done
      LOOM_RETURN_IF_ERROR(ExpertsBackwardInput(plan.rows[c], saved.pre_act, dexp_out, dact_all,
                                                dpre_all, dexp_in));
      for (auto& p : pending) {
        if (p != nullptr) p->Poll();
      }
      LOOM_ASSIGN_OR_RETURN(by_source[c], GatherRows(dexp_in, x.inverse_t));
      LOOM_ASSIGN_OR_RETURN(Tensor back, Rows(ddisp, plan.dispatch_rows[c],
                                              plan.dispatch_rows[c + 1] - plan.dispatch_rows[c]));
      pending[2 * c + 1] = std::make_unique<PendingAllToAll>(comm_stats_, true, [&] {
        return ep_.comm->AllToAllV(by_source[c], x.recv, back, x.send);
      });
    }
    // The weight gradients, one GEMM pair per expert over all its rows,
    // while the last combine is in flight: now, or at a split backward's
    // BackwardWeight.
    return WeightGradStore::RunOrDefer(
        [this, rows = RangesOf(saved.exchange.local_rows), expert_in = saved.expert_in,
         act = saved.act, dexp_out, dpre_all]() {
          return ExpertsWeightGrad(rows, expert_in, act, dexp_out, dpre_all);
        },
        static_cast<int64_t>(dexp_out.nbytes() + dpre_all.nbytes()));
  }));
  return ddisp;
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
  saved->chunks = {};
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

  if (chunked()) {  // dispatch, experts and combine pipelined chunk by chunk
    LOOM_RETURN_IF_ERROR(PlanChunks(r, h, saved));
    LOOM_RETURN_IF_ERROR(ForwardChunks(saved));
  } else {
    // Dispatch: one row per kept assignment, grouped by expert (and so by the
    // EP rank that owns it), then to the experts.
    LOOM_ASSIGN_OR_RETURN(saved->dispatched, GatherRows(saved->input, r.row_token_t));
    LOOM_ASSIGN_OR_RETURN(saved->exchange, PlanExchange(r, h));
    const ExpertExchange& xc = saved->exchange;
    LOOM_ASSIGN_OR_RETURN(saved->expert_in, ToExperts(xc, saved->dispatched, /*backward=*/false));
    const int64_t M = saved->expert_in.dim(0);
    const int64_t f = fc2_[0]->value.dim(1);  // f/p
    LOOM_ASSIGN_OR_RETURN(saved->pre_act,
                          Tensor::Empty(Shape{M, options_.swiglu ? 2 * f : f}, dt, dev));
    LOOM_ASSIGN_OR_RETURN(saved->act, Tensor::Empty(Shape{M, f}, dt, dev));
    LOOM_ASSIGN_OR_RETURN(Tensor out_rows, Tensor::Empty(Shape{M, h}, dt, dev));
    LOOM_RETURN_IF_ERROR(
        ExpertsForward(RangesOf(xc.local_rows), saved->expert_in, saved->pre_act, saved->act,
                       out_rows));
    LOOM_ASSIGN_OR_RETURN(saved->expert_out, FromExperts(xc, out_rows, /*backward=*/false));
  }

  // Combine: y_t = Σ_k prob_tk · out_row(t,k), in k order (deterministic).
  const Tensor& row_t = chunked() ? saved->chunks.row_t : r.row_t;
  LOOM_ASSIGN_OR_RETURN(Tensor y, Tensor::Empty(Shape{T, h}, dt, dev));
  LOOM_RETURN_IF_ERROR(core::ops::MoeCombineForward(saved->expert_out, r.prob_t, row_t, &y));
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
  const Tensor& row_t = chunked() ? saved.chunks.row_t : r.row_t;
  LOOM_RETURN_IF_ERROR(
      core::ops::MoeCombineBackward(d2, saved.expert_out, r.prob_t, row_t, &dout, &dprob));
  comm::WorkPtr dprob_sum = AllReduceTpAsync(tp_, dprob);
  Tensor ddisp;
  if (chunked()) {
    LOOM_ASSIGN_OR_RETURN(ddisp, BackwardChunks(saved, dout));
  } else {
    // The experts, backwards, on the rows they computed; their input gradients
    // go back to the assignments' owners and scatter-add into dx.
    LOOM_ASSIGN_OR_RETURN(Tensor dexp_out, ToExperts(xc, dout, /*backward=*/true));
    const int64_t M = saved.expert_in.dim(0);
    LOOM_ASSIGN_OR_RETURN(Tensor dexp_in, Tensor::Empty(Shape{M, h}, dt, dev));
    LOOM_ASSIGN_OR_RETURN(Tensor dact_all, Tensor::Empty(saved.act.shape(), dt, dev));
    LOOM_ASSIGN_OR_RETURN(Tensor dpre_all, Tensor::Empty(saved.pre_act.shape(), dt, dev));
    LOOM_RETURN_IF_ERROR(ExpertsBackwardInput(RangesOf(xc.local_rows), saved.pre_act, dexp_out,
                                              dact_all, dpre_all, dexp_in));
    // The experts' weight gradients, each from its own rows: now, or at a split
    // backward's BackwardWeight (layers/weight_grad_store.h), which then keeps
    // the experts' output and pre-activation gradients.
    LOOM_RETURN_IF_ERROR(WeightGradStore::RunOrDefer(
        [this, rows = RangesOf(xc.local_rows), expert_in = saved.expert_in, act = saved.act,
         dexp_out, dpre_all]() {
          return ExpertsWeightGrad(rows, expert_in, act, dexp_out, dpre_all);
        },
        static_cast<int64_t>(dexp_out.nbytes() + dpre_all.nbytes())));
    LOOM_ASSIGN_OR_RETURN(ddisp, FromExperts(xc, dexp_in, /*backward=*/true));
  }
  // Each token sums its rows' gradients (no atomics; padding rows have none).
  LOOM_ASSIGN_OR_RETURN(Tensor dx, Tensor::Empty(Shape{T, h}, dt, dev));
  LOOM_RETURN_IF_ERROR(core::ops::MoePermuteBackward(ddisp, row_t, &dx));

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
