#include "layers/moe.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "core/ops/ops.h"
#include "core/status_macros.h"
#include "layers/mappings.h"

namespace loom::layers {

using core::DType;
using core::Shape;
using core::Tensor;

MoeOptions MoeOptionsOf(const GptConfig& c) {
  MoeOptions o;
  o.experts = c.num_experts;
  o.topk = c.moe_router_topk;
  o.swiglu = c.swiglu;
  o.aux_loss = c.moe_router_load_balancing_type == "aux_loss";
  o.aux_loss_coeff = c.moe_aux_loss_coeff;
  o.z_loss_coeff = c.moe_z_loss_coeff;
  o.capacity_factor = c.moe_expert_capacity_factor;
  o.pad_to_capacity = c.moe_pad_expert_input_to_capacity;
  o.grouped_gemm = c.moe_grouped_gemm;
  return o;
}

namespace {

// Softmax of n logits in double (the router's few logits per token).
void Softmax(const float* x, int64_t n, std::vector<double>* out, double* lse = nullptr) {
  double max = x[0];
  for (int64_t i = 1; i < n; ++i) max = std::max(max, double(x[i]));
  double sum = 0;
  out->resize(n);
  for (int64_t i = 0; i < n; ++i) sum += (*out)[i] = std::exp(double(x[i]) - max);
  for (int64_t i = 0; i < n; ++i) (*out)[i] /= sum;
  if (lse != nullptr) *lse = max + std::log(sum);
}

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

absl::StatusOr<Routing> Route(const float* logits, int64_t T, const MoeOptions& o) {
  const int64_t E = o.experts, K = o.topk;
  if (E < 1 || K < 1 || K > E || T < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Route: top-", K, " of ", E, " experts for ",
                                                   T, " tokens (--moe-router-topk, --num-experts)"));
  }
  Routing r;
  r.tokens = T;
  r.topk = K;
  r.experts = E;
  r.expert.resize(T * K);
  r.prob.resize(T * K);
  r.row.assign(T * K, -1);
  r.tokens_per_expert.assign(E, 0);
  std::vector<int32_t> order(E);
  std::vector<double> p, all;
  double z_sum = 0;
  std::vector<double> score_sum(E, 0.0);  // Σ_t softmax(logits_t)_e, for the aux loss
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits + t * E;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [l](int32_t a, int32_t b) {
      return l[a] > l[b] || (l[a] == l[b] && a < b);
    });
    std::vector<float> chosen(K);
    for (int k = 0; k < K; ++k) chosen[k] = l[order[k]];
    Softmax(chosen.data(), K, &p);
    for (int k = 0; k < K; ++k) {
      r.expert[t * K + k] = order[k];
      r.prob[t * K + k] = static_cast<float>(p[k]);
      ++r.tokens_per_expert[order[k]];
    }
    double lse = 0;
    Softmax(l, E, &all, &lse);
    for (int64_t e = 0; e < E; ++e) score_sum[e] += all[e];
    z_sum += lse * lse;
  }
  r.score_sum = std::move(score_sum);
  SetAuxLoss(&r, o, r.tokens_per_expert, r.score_sum, T, 1.0);
  if (o.z_loss_coeff > 0 && T > 0) r.z_loss = o.z_loss_coeff * z_sum / double(T);

  // Assignments per expert in token order; under a capacity each expert
  // keeps its `capacity` most probable ones (ties: the earlier token).
  std::vector<std::vector<int64_t>> by_expert(E);  // slots t·K + k
  for (int64_t slot = 0; slot < T * K; ++slot) by_expert[r.expert[slot]].push_back(slot);
  if (o.capacity_factor > 0) {
    r.capacity = Capacity(T, o);
    for (auto& slots : by_expert) {
      if (static_cast<int64_t>(slots.size()) <= r.capacity) continue;
      std::stable_sort(slots.begin(), slots.end(),
                       [&](int64_t a, int64_t b) { return r.prob[a] > r.prob[b]; });
      r.dropped += static_cast<int64_t>(slots.size()) - r.capacity;
      slots.resize(r.capacity);
      std::sort(slots.begin(), slots.end());  // back to token order
    }
  }
  r.expert_rows.assign(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = static_cast<int64_t>(by_expert[e].size());
    const int64_t rows = o.pad_to_capacity && r.capacity > 0 ? r.capacity : n;
    r.expert_rows[e + 1] = r.expert_rows[e] + rows;
    for (int64_t i = 0; i < rows; ++i) {
      if (i < n) {
        const int64_t slot = by_expert[e][i];
        r.row[slot] = static_cast<int32_t>(r.row_token.size());
        r.row_token.push_back(static_cast<int32_t>(slot / K));
      } else {
        r.row_token.push_back(-1);  // padding: a zero row, weight 0
      }
    }
  }
  return r;
}

void RouterBackward(const Routing& r, const float* logits, const float* dprob, float w,
                    const MoeOptions& o, float* dlogits) {
  const int64_t T = r.tokens, K = r.topk, E = r.experts;
  std::fill(dlogits, dlogits + T * E, 0.0f);
  // The aux loss's gradient with respect to softmax(logits_t)_e is g_e, the
  // same for every token: w · coeff · E / (K·T²) · count[e] (T, count: the
  // aux statistics', times their scale).
  std::vector<double> g(E, 0.0);
  const bool aux = o.aux_loss && o.aux_loss_coeff > 0 && r.aux_tokens > 0 && T > 0;
  if (aux) {
    const double Ta = double(r.aux_tokens);
    for (int64_t e = 0; e < E; ++e) {
      g[e] = r.aux_grad_scale * double(w) * o.aux_loss_coeff * double(E) / (double(K) * Ta * Ta) *
             double(r.aux_counts[e]);
    }
  }
  const bool z = o.z_loss_coeff > 0 && T > 0;
  std::vector<double> s;
  for (int64_t t = 0; t < T; ++t) {
    float* d = dlogits + t * E;
    // Through the softmax over the K chosen logits (a dropped assignment has
    // no gradient of its own but its probability still takes part).
    double dot = 0;
    for (int k = 0; k < K; ++k) dot += double(r.prob[t * K + k]) * dprob[t * K + k];
    for (int k = 0; k < K; ++k) {
      const double pk = r.prob[t * K + k];
      d[r.expert[t * K + k]] += static_cast<float>(pk * (double(dprob[t * K + k]) - dot));
    }
    if (!z && !aux) continue;
    double lse = 0;
    Softmax(logits + t * E, E, &s, &lse);
    double sg = 0;
    for (int64_t e = 0; e < E; ++e) sg += s[e] * g[e];
    const double zg = z ? double(w) * o.z_loss_coeff * 2.0 * lse / double(T) : 0.0;
    for (int64_t e = 0; e < E; ++e) {
      d[e] += static_cast<float>(s[e] * (g[e] - sg) + zg * s[e]);
    }
  }
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

// Calls fn(t, k, row, prob) for every kept (token, k) assignment, tokens in
// parallel (one token's calls in k order, so per-token sums are deterministic).
template <typename Fn>
void ForEachKept(const Routing& r, Fn&& fn) {
  const int64_t K = r.topk;
#pragma omp parallel for
  for (int64_t t = 0; t < r.tokens; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const int32_t row = r.row[t * K + k];
      if (row >= 0) fn(t, k, row, r.prob[t * K + k]);
    }
  }
}

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

// Rows `ids` of `table` [R, h] into a new [ids.size(), h] tensor.
absl::StatusOr<Tensor> GatherRows(const Tensor& table, const std::vector<int32_t>& ids);

core::ops::EmbeddingOptions RowGather() {
  core::ops::EmbeddingOptions o;
  o.zero_out_of_range = true;  // padding rows (-1): zeros forward, nothing backward
  return o;
}

absl::StatusOr<Tensor> IdsTensor(const std::vector<int32_t>& ids) {
  LOOM_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(Shape{static_cast<int64_t>(ids.size())},
                                                DType::kI32));
  std::copy(ids.begin(), ids.end(), t.data<int32_t>());
  return t;
}

absl::StatusOr<Tensor> GatherRows(const Tensor& table, const std::vector<int32_t>& ids) {
  const int64_t n = static_cast<int64_t>(ids.size()), h = table.dim(1);
  LOOM_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(Shape{n, h}, DType::kF32));
  if (n == 0) return out;
  LOOM_ASSIGN_OR_RETURN(Tensor t, IdsTensor(ids));
  LOOM_RETURN_IF_ERROR(core::ops::EmbeddingForward(t, table, &out, RowGather()));
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
  LOOM_ASSIGN_OR_RETURN(Tensor mine, Tensor::Empty(Shape{E}, DType::kI64));
  LOOM_ASSIGN_OR_RETURN(Tensor theirs, Tensor::Empty(Shape{E}, DType::kI64));
  for (int64_t e = 0; e < E; ++e) {
    mine.data<int64_t>()[e] = r.expert_rows[e + 1] - r.expert_rows[e];
  }
  LOOM_RETURN_IF_ERROR(TimedAllToAll(comm_stats_, /*backward=*/false,
                                     [&] { return ep_.comm->AllToAll(mine, theirs); }));
  const int64_t* count = theirs.data<int64_t>();  // [source j][local expert l]
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
  return x;
}

absl::StatusOr<Tensor> MoeMlp::ToExperts(const ExpertExchange& x, const Tensor& rows,
                                         bool backward) const {
  if (!ep_.parallel()) return rows;
  const int64_t h = rows.dim(1);
  LOOM_ASSIGN_OR_RETURN(
      Tensor received,
      Tensor::Empty(Shape{static_cast<int64_t>(x.perm.size()), h}, DType::kF32));
  LOOM_RETURN_IF_ERROR(TimedAllToAll(
      comm_stats_, backward, [&] { return ep_.comm->AllToAllV(rows, x.send, received, x.recv); }));
  return GatherRows(received, x.perm);
}

absl::StatusOr<Tensor> MoeMlp::FromExperts(const ExpertExchange& x, const Tensor& rows,
                                           bool backward) const {
  if (!ep_.parallel()) return rows;
  const int64_t h = rows.dim(1);
  int64_t n = 0;
  for (int64_t c : x.send) n += c / h;
  LOOM_ASSIGN_OR_RETURN(Tensor by_source, GatherRows(rows, x.inverse));
  LOOM_ASSIGN_OR_RETURN(Tensor back, Tensor::Empty(Shape{n, h}, DType::kF32));
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
  LOOM_RETURN_IF_ERROR(cp_.comm->AllReduce(stats, comm::ReduceOp::kSum)->Wait());
  std::vector<int64_t> counts(E);
  for (int64_t e = 0; e < E; ++e) counts[e] = static_cast<int64_t>(s[e]);
  SetAuxLoss(r, options_, std::move(counts), std::vector<double>(s + E, s + 2 * E),
             r->tokens * cp_.size(), cp_.size());
  return absl::OkStatus();
}

MoeMlp MoeMlp::ForLayer(ParamBuffer* params, const GptConfig& c, int64_t layer, TpGroup tp,
                        EpGroup ep, CpGroup cp) {
  const std::string prefix = absl::StrCat("layers.", layer, ".mlp.");
  std::vector<Param*> fc1, fc2;
  const int64_t first = ep.shard().first(c.num_experts);
  for (int64_t e = first; e < first + ep.shard().count(c.num_experts); ++e) {
    const std::string expert = absl::StrCat(prefix, "experts.", e, ".");
    fc1.push_back(&params->at(expert + "dense_h_to_4h.weight"));
    fc2.push_back(&params->at(expert + "dense_4h_to_h.weight"));
  }
  return MoeMlp(&params->at(prefix + "router.weight"), std::move(fc1), std::move(fc2),
                MoeOptionsOf(c), tp, ep, cp);
}

absl::StatusOr<Tensor> MoeMlp::Forward(const Tensor& x, Saved* saved) const {
  if (!x.device().is_cpu() || x.dtype() != DType::kF32 || x.rank() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoE layer: input ", x.DebugString(), ", expected a host f32 [s, b, h]"));
  }
  const int64_t h = x.dim(2);
  Tensor full = x;
  if (tp_.sequence_parallel) {
    LOOM_ASSIGN_OR_RETURN(full, AllGatherSeq(tp_, x));
  }
  const Shape out_shape = full.shape();
  const int64_t T = full.numel() / h, E = options_.experts;
  LOOM_ASSIGN_OR_RETURN(saved->input, full.Reshape(Shape{T, h}));
  LOOM_ASSIGN_OR_RETURN(saved->logits, Tensor::Empty(Shape{T, E}, DType::kF32));
  LOOM_RETURN_IF_ERROR(
      core::ops::Matmul(saved->input, router_->value, &saved->logits, {.trans_b = true}));
  LOOM_ASSIGN_OR_RETURN(saved->routing, Route(saved->logits.data<float>(), T, options_));
  if (cp_.parallel()) LOOM_RETURN_IF_ERROR(AuxStatsOverCp(&saved->routing));
  const Routing& r = saved->routing;

  // Dispatch: one row per kept assignment, grouped by expert (and so by the
  // EP rank that owns it), then to the experts.
  LOOM_ASSIGN_OR_RETURN(saved->dispatched, GatherRows(saved->input, r.row_token));
  LOOM_ASSIGN_OR_RETURN(saved->exchange, PlanExchange(r, h));
  const ExpertExchange& xc = saved->exchange;
  LOOM_ASSIGN_OR_RETURN(saved->expert_in, ToExperts(xc, saved->dispatched, /*backward=*/false));
  const int64_t M = saved->expert_in.dim(0);
  const int64_t f = fc2_[0]->value.dim(1);  // f/p
  const int64_t f1 = options_.swiglu ? 2 * f : f;
  LOOM_ASSIGN_OR_RETURN(saved->pre_act, Tensor::Empty(Shape{M, f1}, DType::kF32));
  LOOM_ASSIGN_OR_RETURN(saved->act, Tensor::Empty(Shape{M, f}, DType::kF32));
  LOOM_ASSIGN_OR_RETURN(Tensor out_rows, Tensor::Empty(Shape{M, h}, DType::kF32));
  // An expert without tokens computes nothing.
  LOOM_RETURN_IF_ERROR(ForEachExpert(xc.local_rows, options_.grouped_gemm,
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
  LOOM_ASSIGN_OR_RETURN(Tensor y, Tensor::Zeros(Shape{T, h}, DType::kF32));
  const float* rows = saved->expert_out.data<float>();
  float* yp = y.data<float>();
  ForEachKept(r, [&](int64_t t, int64_t, int32_t row, float p) {
    const float* o = rows + row * h;
    for (int64_t j = 0; j < h; ++j) yp[t * h + j] += p * o[j];
  });
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
  const float* g = d2.data<float>();
  const float* rows = saved.expert_out.data<float>();
  const int64_t N = saved.expert_out.dim(0);

  // The combine's gradients: d out_row = prob · dy_t; dprob_tk = ⟨dy_t,
  // out_row⟩, a partial sum over TP (the rows are) completed by an all-reduce.
  LOOM_ASSIGN_OR_RETURN(Tensor dout, Tensor::Zeros(Shape{N, h}, DType::kF32));
  LOOM_ASSIGN_OR_RETURN(Tensor dprob, Tensor::Zeros(Shape{T, K}, DType::kF32));
  float* dop = dout.data<float>();
  float* dpp = dprob.data<float>();
  ForEachKept(r, [&](int64_t t, int64_t k, int32_t row, float p) {
    double dot = 0;
    for (int64_t j = 0; j < h; ++j) {
      dop[row * h + j] = p * g[t * h + j];
      dot += double(g[t * h + j]) * rows[row * h + j];
    }
    dpp[t * K + k] = static_cast<float>(dot);
  });
  comm::WorkPtr dprob_sum = AllReduceTpAsync(tp_, dprob);

  // The experts, backwards, on the rows they computed; their input gradients
  // go back to the assignments' owners and scatter-add into dx.
  LOOM_ASSIGN_OR_RETURN(Tensor dexp_out, ToExperts(xc, dout, /*backward=*/true));
  const int64_t M = saved.expert_in.dim(0);
  LOOM_ASSIGN_OR_RETURN(Tensor dexp_in, Tensor::Empty(Shape{M, h}, DType::kF32));
  LOOM_ASSIGN_OR_RETURN(Tensor dact_all, Tensor::Empty(saved.act.shape(), DType::kF32));
  LOOM_ASSIGN_OR_RETURN(Tensor dpre_all, Tensor::Empty(saved.pre_act.shape(), DType::kF32));
  LOOM_RETURN_IF_ERROR(ForEachExpert(xc.local_rows, options_.grouped_gemm,
                                     [&](int64_t l) -> absl::Status {
    const int64_t first = xc.local_rows[l], n = xc.local_rows[l + 1] - first;
    LOOM_ASSIGN_OR_RETURN(Tensor xe, Rows(saved.expert_in, first, n));
    LOOM_ASSIGN_OR_RETURN(Tensor pre, Rows(saved.pre_act, first, n));
    LOOM_ASSIGN_OR_RETURN(Tensor act, Rows(saved.act, first, n));
    LOOM_ASSIGN_OR_RETURN(Tensor de, Rows(dexp_out, first, n));
    LOOM_ASSIGN_OR_RETURN(Tensor dxe, Rows(dexp_in, first, n));
    LOOM_ASSIGN_OR_RETURN(Tensor dact, Rows(dact_all, first, n));
    LOOM_ASSIGN_OR_RETURN(Tensor dpre, Rows(dpre_all, first, n));
    LOOM_RETURN_IF_ERROR(core::ops::Matmul(de, fc2_[l]->value, &dact));
    LOOM_RETURN_IF_ERROR(
        core::ops::Matmul(de, act, &fc2_[l]->grad, {.trans_a = true, .beta = 1.0f}));
    if (options_.swiglu) {
      LOOM_RETURN_IF_ERROR(core::ops::SwigluBackward(dact, pre, &dpre));
    } else {
      LOOM_RETURN_IF_ERROR(core::ops::GeluBackward(pre, dact, &dpre));
    }
    LOOM_ASSIGN_OR_RETURN(Tensor w1, Matrix(fc1_[l]->value, h));
    LOOM_ASSIGN_OR_RETURN(Tensor dw1, Matrix(fc1_[l]->grad, h));
    LOOM_RETURN_IF_ERROR(core::ops::Matmul(dpre, xe, &dw1, {.trans_a = true, .beta = 1.0f}));
    return core::ops::Matmul(dpre, w1, &dxe);
  }));
  LOOM_ASSIGN_OR_RETURN(Tensor ddisp, FromExperts(xc, dexp_in, /*backward=*/true));
  LOOM_ASSIGN_OR_RETURN(Tensor dx, Tensor::Zeros(Shape{T, h}, DType::kF32));
  if (N > 0) {
    LOOM_ASSIGN_OR_RETURN(Tensor ids, IdsTensor(r.row_token));
    LOOM_RETURN_IF_ERROR(core::ops::EmbeddingBackward(ids, ddisp, &dx, RowGather()));
  }

  // The router: its gradients are whole on every TP rank (same tokens, the
  // summed dprob), so its input gradient joins after the experts' reduction.
  if (dprob_sum != nullptr) LOOM_RETURN_IF_ERROR(dprob_sum->Wait());
  LOOM_ASSIGN_OR_RETURN(Tensor dlogits, Tensor::Empty(Shape{T, E}, DType::kF32));
  RouterBackward(r, saved.logits.data<float>(), dprob.data<float>(), loss_weight, options_,
                 dlogits.data<float>());
  LOOM_RETURN_IF_ERROR(core::ops::Matmul(dlogits, saved.input, &router_->grad,
                                         {.trans_a = true, .beta = 1.0f}));
  LOOM_ASSIGN_OR_RETURN(Tensor drouter, Tensor::Empty(Shape{T, h}, DType::kF32));
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
