#include "core/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cpu/check.h"
#include "core/ops/contracts/moe_checks.h"

namespace loom::core::cpu {
namespace {

using internal::CheckInput;
using internal::CheckOutput;

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

// Every element of `t` (i32) lies in [-1, limit) (`what` names the range).
absl::Status CheckIndices(const char* op, const char* name, const Tensor& t, int64_t limit,
                          const char* what) {
  const int32_t* p = t.data<int32_t>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (p[i] < -1 || p[i] >= limit) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, "[", i, "] = ", p[i],
                                                     ", expected -1 or a ", what, " in [0, ",
                                                     limit, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status MoeRouteTopK(const Tensor& logits, const MoeRouteOptions& o, Tensor* expert,
                          Tensor* prob, Tensor* stats) {
  constexpr const char* kOp = "MoeRouteTopK";
  LOOM_ASSIGN_OR_RETURN(const ops::MoeDims d,
                        ops::CheckMoeRouteTopK(kOp, logits, o, expert, prob, stats));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "logits", logits));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "expert", expert, DType::kI32));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "prob", prob));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "stats", stats, DType::kF64));
  const int64_t T = d.tokens, E = d.experts, K = d.topk;
  const float* logit = logits.data<float>();
  int32_t* ex = expert->data<int32_t>();
  float* pr = prob->data<float>();
  std::vector<int64_t> counts(E, 0);
  std::vector<int32_t> order(E);
  std::vector<double> p, all;
  double z_sum = 0;
  std::vector<double> score_sum(E, 0.0);
  // Sequential over tokens: the sums are in token order (what Route did).
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logit + t * E;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [l](int32_t a, int32_t b) {
      return l[a] > l[b] || (l[a] == l[b] && a < b);
    });
    std::vector<float> chosen(K);
    for (int k = 0; k < K; ++k) chosen[k] = l[order[k]];
    Softmax(chosen.data(), K, &p);
    for (int k = 0; k < K; ++k) {
      ex[t * K + k] = order[k];
      pr[t * K + k] = static_cast<float>(p[k]);
      ++counts[order[k]];
    }
    double lse = 0;
    Softmax(l, E, &all, &lse);
    for (int64_t e = 0; e < E; ++e) score_sum[e] += all[e];
    // Fused as the compiler fused it in layers/moe.cc (GCC contracts a*b+c
    // only where it sees fit: spelled out, the bits do not depend on it).
    z_sum = std::fma(lse, lse, z_sum);
  }
  double* st = stats->data<double>();
  for (int64_t e = 0; e < E; ++e) {
    st[e] = double(counts[e]);
    st[E + e] = score_sum[e];
  }
  st[2 * E] = z_sum;
  return absl::OkStatus();
}

absl::Status MoeRouteLayout(const Tensor& expert, const Tensor& prob, const MoeRouteOptions& o,
                            Tensor* row, Tensor* row_token) {
  constexpr const char* kOp = "MoeRouteLayout";
  LOOM_ASSIGN_OR_RETURN(const ops::MoeDims d,
                        ops::CheckMoeRouteLayout(kOp, expert, prob, o, row, row_token));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "expert", expert, DType::kI32));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "prob", prob));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "row", row, DType::kI32));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "row_token", row_token, DType::kI32));
  const int64_t T = d.tokens, E = d.experts, K = d.topk;
  const int32_t* ex = expert.data<int32_t>();
  const float* pr = prob.data<float>();
  for (int64_t slot = 0; slot < T * K; ++slot) {
    if (ex[slot] < 0 || ex[slot] >= E) {
      return absl::InvalidArgumentError(absl::StrCat(kOp, ": expert[", slot, "] = ", ex[slot],
                                                     ", expected an expert in [0, ", E, ")"));
    }
  }
  // Assignments per expert in slot (token) order; under a capacity each
  // expert keeps its `capacity` most probable ones (ties: the earlier slot).
  std::vector<std::vector<int64_t>> by_expert(E);
  for (int64_t slot = 0; slot < T * K; ++slot) by_expert[ex[slot]].push_back(slot);
  if (o.capacity > 0) {
    for (auto& slots : by_expert) {
      if (static_cast<int64_t>(slots.size()) <= o.capacity) continue;
      std::stable_sort(slots.begin(), slots.end(),
                       [&](int64_t a, int64_t b) { return pr[a] > pr[b]; });
      slots.resize(o.capacity);
      std::sort(slots.begin(), slots.end());  // back to token order
    }
  }
  int64_t n_rows = 0;
  for (int64_t e = 0; e < E; ++e) {
    n_rows += o.pad_to_capacity ? o.capacity : static_cast<int64_t>(by_expert[e].size());
  }
  if (n_rows != d.rows) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": row_token is ",
                                                   row_token->DebugString(), ", the layout has ",
                                                   n_rows, " rows"));
  }
  int32_t* rw = row->data<int32_t>();
  int32_t* rt = row_token->data<int32_t>();
  std::fill(rw, rw + T * K, -1);
  int64_t at = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = static_cast<int64_t>(by_expert[e].size());
    const int64_t rows = o.pad_to_capacity ? o.capacity : n;
    for (int64_t i = 0; i < rows; ++i, ++at) {
      if (i < n) {
        const int64_t slot = by_expert[e][i];
        rw[slot] = static_cast<int32_t>(at);
        rt[at] = static_cast<int32_t>(slot / K);
      } else {
        rt[at] = -1;  // padding: a zero row, weight 0
      }
    }
  }
  return absl::OkStatus();
}

absl::Status MoePermute(const Tensor& x, const Tensor& row_token, Tensor* out) {
  constexpr const char* kOp = "MoePermute";
  LOOM_ASSIGN_OR_RETURN(const ops::MoeDims d, ops::CheckMoePermute(kOp, x, row_token, out));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "x", x));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "row_token", row_token, DType::kI32));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "out", out));
  LOOM_RETURN_IF_ERROR(CheckIndices(kOp, "row_token", row_token, d.tokens, "token"));
  const int64_t h = d.hidden;
  const float* px = x.data<float>();
  const int32_t* rt = row_token.data<int32_t>();
  float* po = out->data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < d.rows; ++i) {
    if (rt[i] >= 0) {
      std::memcpy(po + i * h, px + rt[i] * h, h * sizeof(float));
    } else {
      std::fill(po + i * h, po + (i + 1) * h, 0.0f);
    }
  }
  return absl::OkStatus();
}

absl::Status MoePermuteBackward(const Tensor& drows, const Tensor& row, Tensor* dx) {
  constexpr const char* kOp = "MoePermuteBackward";
  LOOM_ASSIGN_OR_RETURN(const ops::MoeDims d, ops::CheckMoePermuteBackward(kOp, drows, row, dx));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "drows", drows));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "row", row, DType::kI32));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "dx", dx));
  LOOM_RETURN_IF_ERROR(CheckIndices(kOp, "row", row, d.rows, "row"));
  const int64_t T = d.tokens, K = d.topk, h = d.hidden;
  const float* pd = drows.data<float>();
  const int32_t* rw = row.data<int32_t>();
  float* px = dx->data<float>();
#pragma omp parallel
  {
    std::vector<int32_t> rows;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      rows.clear();
      for (int64_t k = 0; k < K; ++k) {
        if (rw[t * K + k] >= 0) rows.push_back(rw[t * K + k]);
      }
      std::sort(rows.begin(), rows.end());
      float* dst = px + t * h;
      std::fill(dst, dst + h, 0.0f);
      for (int32_t r : rows) {
        const float* src = pd + int64_t{r} * h;
#pragma omp simd
        for (int64_t j = 0; j < h; ++j) dst[j] += src[j];
      }
    }
  }
  return absl::OkStatus();
}

absl::Status MoeCombineForward(const Tensor& rows, const Tensor& prob, const Tensor& row,
                               Tensor* y) {
  constexpr const char* kOp = "MoeCombineForward";
  LOOM_ASSIGN_OR_RETURN(const ops::MoeDims d, ops::CheckMoeCombine(kOp, rows, prob, row, "y", y));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "rows", rows));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "prob", prob));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "row", row, DType::kI32));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "y", y));
  LOOM_RETURN_IF_ERROR(CheckIndices(kOp, "row", row, d.rows, "row"));
  const int64_t T = d.tokens, K = d.topk, h = d.hidden;
  const float* pr = rows.data<float>();
  const float* pp = prob.data<float>();
  const int32_t* rw = row.data<int32_t>();
  float* yp = y->data<float>();
  std::fill(yp, yp + T * h, 0.0f);
#pragma omp parallel for
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const int32_t r = rw[t * K + k];
      if (r < 0) continue;
      const float p = pp[t * K + k];
      const float* o = pr + int64_t{r} * h;
      for (int64_t j = 0; j < h; ++j) yp[t * h + j] += p * o[j];
    }
  }
  return absl::OkStatus();
}

absl::Status MoeCombineBackward(const Tensor& dy, const Tensor& rows, const Tensor& prob,
                                const Tensor& row, Tensor* drows, Tensor* dprob) {
  constexpr const char* kOp = "MoeCombineBackward";
  LOOM_ASSIGN_OR_RETURN(const ops::MoeDims d,
                        ops::CheckMoeCombineBackward(kOp, dy, rows, prob, row, drows, dprob));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "dy", dy));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "rows", rows));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "prob", prob));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "row", row, DType::kI32));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "drows", drows));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "dprob", dprob));
  LOOM_RETURN_IF_ERROR(CheckIndices(kOp, "row", row, d.rows, "row"));
  const int64_t T = d.tokens, K = d.topk, h = d.hidden;
  const float* g = dy.data<float>();
  const float* rp = rows.data<float>();
  const float* pp = prob.data<float>();
  const int32_t* rw = row.data<int32_t>();
  float* dop = drows->data<float>();
  float* dpp = dprob->data<float>();
  std::fill(dop, dop + d.rows * h, 0.0f);
  std::fill(dpp, dpp + T * K, 0.0f);
#pragma omp parallel for
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t r = rw[t * K + k];
      if (r < 0) continue;
      const float p = pp[t * K + k];
      double dot = 0;
      for (int64_t j = 0; j < h; ++j) {
        dop[r * h + j] = p * g[t * h + j];
        dot += double(g[t * h + j]) * rp[r * h + j];
      }
      dpp[t * K + k] = static_cast<float>(dot);
    }
  }
  return absl::OkStatus();
}

absl::Status MoeRouterBackward(const Tensor& logits, const Tensor& expert, const Tensor& prob,
                               const Tensor& dprob, const Tensor& aux_grad,
                               const MoeRouterBackwardOptions& o, Tensor* dlogits) {
  constexpr const char* kOp = "MoeRouterBackward";
  LOOM_ASSIGN_OR_RETURN(const ops::MoeDims d, ops::CheckMoeRouterBackward(
                                                  kOp, logits, expert, prob, dprob, aux_grad, o,
                                                  dlogits));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "logits", logits));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "expert", expert, DType::kI32));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "prob", prob));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "dprob", dprob));
  if (o.aux_loss) LOOM_RETURN_IF_ERROR(CheckInput(kOp, "aux_grad", aux_grad, DType::kF64));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "dlogits", dlogits));
  const int64_t T = d.tokens, K = d.topk, E = d.experts;
  const int32_t* ex = expert.data<int32_t>();
  for (int64_t i = 0; i < T * K; ++i) {
    if (ex[i] < 0 || ex[i] >= E) {
      return absl::InvalidArgumentError(absl::StrCat(kOp, ": expert[", i, "] = ", ex[i],
                                                     ", expected an expert in [0, ", E, ")"));
    }
  }
  const float* lg = logits.data<float>();
  const float* pr = prob.data<float>();
  const float* dp = dprob.data<float>();
  float* dl = dlogits->data<float>();
  std::fill(dl, dl + T * E, 0.0f);
  std::vector<double> g(E, 0.0);
  if (o.aux_loss) std::copy(aux_grad.data<double>(), aux_grad.data<double>() + E, g.begin());
  std::vector<double> s;
  for (int64_t t = 0; t < T; ++t) {
    float* dt = dl + t * E;
    double dot = 0;
    for (int k = 0; k < K; ++k) dot += double(pr[t * K + k]) * dp[t * K + k];
    for (int k = 0; k < K; ++k) {
      const double pk = pr[t * K + k];
      dt[ex[t * K + k]] += static_cast<float>(pk * (double(dp[t * K + k]) - dot));
    }
    if (!o.z_loss && !o.aux_loss) continue;
    double lse = 0;
    Softmax(lg + t * E, E, &s, &lse);
    double sg = 0;
    for (int64_t e = 0; e < E; ++e) sg += s[e] * g[e];
    const double zg = o.z_loss ? o.z_scale * lse / double(T) : 0.0;
    for (int64_t e = 0; e < E; ++e) {
      dt[e] += static_cast<float>(s[e] * (g[e] - sg) + zg * s[e]);
    }
  }
  return absl::OkStatus();
}

}  // namespace loom::core::cpu
