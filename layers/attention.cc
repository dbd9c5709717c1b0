#include "layers/attention.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/kernel_choice.h"
#include "core/ops/ops.h"
#include "core/status_macros.h"

namespace loom::layers {

using core::Shape;
using core::Tensor;

uint64_t DropoutSite(uint64_t stream, int64_t layer, int site) {
  // SplitMix64 finaliser over (stream, layer, site): distinct, well-mixed ids.
  uint64_t z = stream * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(layer + 1) * 0xBF58476D1CE4E5B9ull +
               static_cast<uint64_t>(site) * 0x94D049BB133111EBull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

core::ops::AttentionDropout ParallelAttention::KernelDropout(const DropoutStream& dropout) const {
  // Site 2 of the layer (sites 0 and 1 are the hidden dropouts). The mask is
  // indexed in the global probs [b, heads_, s, s], so every TP layout draws
  // the same mask as TP=1; the backward regenerates it from the same options.
  const int64_t local_heads = heads_ / tp_.size();
  core::ops::AttentionDropout d;
  d.p = dropout.training ? dropout.attention_p : 0.0f;
  d.seed = dropout.seed;
  d.offset = DropoutSite(dropout.stream, layer_, 2);
  d.head_offset = tp_.rank() * local_heads;
  d.total_heads = heads_;
  if (dropout.documents != nullptr && !dropout.documents->doc_start.empty()) {
    d.doc_start = dropout.documents->doc_start.data();
  }
  return d;
}

absl::Status ParallelAttention::MakeIds(int64_t rows, const Tensor& like, Saved* saved) const {
  // Rows of d elements. Projection row of token t, group g, slot j (j < n: a
  // query head, n: k, n+1: v): t·width + g·(n+2) + j.
  const int64_t hl = heads_ / tp_.size(), gl = groups_ / tp_.size(), n = hl / gl;
  const int64_t width = gl * (n + 2);
  auto proj_row = [&](int64_t t, int64_t g, int64_t j) { return t * width + g * (n + 2) + j; };
  LOOM_ASSIGN_OR_RETURN(Tensor gather, Tensor::Empty(Shape{rows * hl * 3}, core::DType::kI32));
  int32_t* out = gather.data<int32_t>();
  if (options_.rope) {
    // The table: [rows, hl + gl] rotated rows (query heads, then k heads),
    // then [rows, gl] v rows.
    const int64_t qk = hl + gl, v_base = rows * qk;
    LOOM_ASSIGN_OR_RETURN(Tensor table, Tensor::Empty(Shape{rows * (qk + gl)}, core::DType::kI32));
    int32_t* tab = table.data<int32_t>();
    for (int64_t t = 0; t < rows; ++t) {
      for (int64_t m = 0; m < hl; ++m) tab[t * qk + m] = static_cast<int32_t>(proj_row(t, m / n, m % n));
      for (int64_t g = 0; g < gl; ++g) {
        tab[t * qk + hl + g] = static_cast<int32_t>(proj_row(t, g, n));
        tab[v_base + t * gl + g] = static_cast<int32_t>(proj_row(t, g, n + 1));
      }
      for (int64_t m = 0; m < hl; ++m) {
        int32_t* o = out + (t * hl + m) * 3;
        o[0] = static_cast<int32_t>(t * qk + m);
        o[1] = static_cast<int32_t>(t * qk + hl + m / n);
        o[2] = static_cast<int32_t>(v_base + t * gl + m / n);
      }
    }
    saved->table_ids = table;
  } else {
    for (int64_t t = 0; t < rows; ++t) {
      for (int64_t m = 0; m < hl; ++m) {
        int32_t* o = out + (t * hl + m) * 3;
        o[0] = static_cast<int32_t>(proj_row(t, m / n, m % n));
        o[1] = static_cast<int32_t>(proj_row(t, m / n, n));
        o[2] = static_cast<int32_t>(proj_row(t, m / n, n + 1));
      }
    }
  }
  saved->gather_ids = gather;
  if (!like.device().is_cpu()) {
    LOOM_ASSIGN_OR_RETURN(saved->gather_ids, gather.To(like.device()));
    if (saved->table_ids.defined()) {
      LOOM_ASSIGN_OR_RETURN(saved->table_ids, saved->table_ids.To(like.device()));
    }
  }
  return absl::OkStatus();
}

namespace {

// qk's token rows [s, b] in batch-row order [b, s] and back, as row-gather
// ids on `device`: to_rows[j·s + i] = i·b + j, to_tokens its inverse.
absl::Status RowOrders(int64_t s, int64_t b, core::Device device, Tensor* to_rows,
                       Tensor* to_tokens) {
  LOOM_ASSIGN_OR_RETURN(*to_rows, Tensor::Empty(Shape{s * b}, core::DType::kI32));
  LOOM_ASSIGN_OR_RETURN(*to_tokens, Tensor::Empty(Shape{s * b}, core::DType::kI32));
  for (int64_t i = 0; i < s; ++i) {
    for (int64_t j = 0; j < b; ++j) {
      to_rows->data<int32_t>()[j * s + i] = static_cast<int32_t>(i * b + j);
      to_tokens->data<int32_t>()[i * b + j] = static_cast<int32_t>(j * s + i);
    }
  }
  if (device.is_cpu()) return absl::OkStatus();
  LOOM_ASSIGN_OR_RETURN(*to_rows, to_rows->To(device));
  LOOM_ASSIGN_OR_RETURN(*to_tokens, to_tokens->To(device));
  return absl::OkStatus();
}

}  // namespace

absl::Status ParallelAttention::Rotate(Tensor* qk, bool backward,
                                      const PackedDocuments* documents) const {
  const int64_t s = qk->dim(0);
  if (documents != nullptr && !documents->position.empty()) {
    // Position ids per token: each batch row's tokens in order ([b, s], a
    // row gather away from qk's [s, b] when b > 1) rotated in runs whose ids
    // count up by one (the documents): one RoPE call per document, not per
    // token. The gathers copy rows, so every value is the per-token one.
    const int64_t b = qk->dim(1), width = qk->dim(2) * qk->dim(3);
    std::vector<int32_t> pos(b * s);  // [b, s]
    for (const RowRun& run : ActivationRowRuns(TpGroup{}, cp_, s)) {
      for (int64_t i = 0; i < run.count; ++i) {
        for (int64_t j = 0; j < b; ++j) {
          pos[j * s + run.local_first + i] =
              documents->position[j * documents->seq_len + run.global_first + i];
        }
      }
    }
    LOOM_ASSIGN_OR_RETURN(Tensor tokens, qk->Reshape(Shape{s * b, width}));
    Tensor by_row = tokens, to_rows, to_tokens;
    core::ops::EmbeddingOptions copy_rows;
    copy_rows.zero_out_of_range = true;  // in range by construction: no host check
    if (b > 1) {
      LOOM_RETURN_IF_ERROR(RowOrders(s, b, qk->device(), &to_rows, &to_tokens));
      LOOM_ASSIGN_OR_RETURN(by_row, Tensor::Empty(tokens.shape(), qk->dtype(), qk->device()));
      LOOM_RETURN_IF_ERROR(core::ops::EmbeddingForward(to_rows, tokens, &by_row, copy_rows));
    }
    LOOM_ASSIGN_OR_RETURN(Tensor rows, by_row.Reshape(Shape{s * b, 1, qk->dim(2), qk->dim(3)}));
    for (int64_t t0 = 0, t1; t0 < s * b; t0 = t1) {
      for (t1 = t0 + 1; t1 < s * b && pos[t1] == pos[t1 - 1] + 1;) ++t1;
      LOOM_ASSIGN_OR_RETURN(Tensor part, rows.Narrow(t0, t1 - t0));
      core::ops::RopeOptions rope = options_.rope_options;
      rope.position_offset = pos[t0];
      LOOM_RETURN_IF_ERROR(backward ? core::ops::RopeBackward(part, rope, &part)
                                    : core::ops::RopeForward(part, rope, &part));
    }
    if (b == 1) return absl::OkStatus();
    return core::ops::EmbeddingForward(to_tokens, by_row, &tokens, copy_rows);
  }
  // The attention's rows are the CP rank's whole local sequence (SP has
  // gathered it): runs of consecutive global positions, one without CP.
  for (const RowRun& run : ActivationRowRuns(TpGroup{}, cp_, s)) {
    LOOM_ASSIGN_OR_RETURN(Tensor part, qk->Narrow(run.local_first, run.count));
    core::ops::RopeOptions rope = options_.rope_options;
    rope.position_offset = run.global_first;
    LOOM_RETURN_IF_ERROR(backward ? core::ops::RopeBackward(part, rope, &part)
                                  : core::ops::RopeForward(part, rope, &part));
  }
  return absl::OkStatus();
}

absl::Status ParallelAttention::FusedSplit(const Tensor& in, Tensor* out, bool backward) const {
  core::ops::QkvSplitOptions o;
  o.heads = heads_ / tp_.size();
  o.groups = groups_ / tp_.size();
  o.rope = options_.rope;
  o.rope_options = options_.rope_options;
  auto call = [&](const Tensor& i, Tensor* out_part) {
    return backward ? core::ops::QkvSplitRopeBackward(i, o, out_part)
                    : core::ops::QkvSplitRopeForward(i, o, out_part);
  };
  if (!options_.rope) return call(in, out);
  // As Rotate: each run of consecutive global positions at its own offset.
  for (const RowRun& run : ActivationRowRuns(TpGroup{}, cp_, in.dim(0))) {
    LOOM_ASSIGN_OR_RETURN(Tensor in_part, in.Narrow(run.local_first, run.count));
    LOOM_ASSIGN_OR_RETURN(Tensor out_part, out->Narrow(run.local_first, run.count));
    o.rope_options.position_offset = run.global_first;
    LOOM_RETURN_IF_ERROR(call(in_part, &out_part));
  }
  return absl::OkStatus();
}

absl::StatusOr<core::ops::AttentionPlan> ParallelAttention::Plan(
    const Tensor& qkv, const DropoutStream& dropout) const {
  if (cp_.parallel()) return core::ops::AttentionPlan{"ring", core::ops::AttentionSaved::kLse};
  return core::ops::PlanAttention(qkv, heads_ / tp_.size(), KernelDropout(dropout));
}

namespace {

// The kernel's options with the document starts on qkv's device too (copied
// there once per micro-batch, PackedDocuments::DeviceDocStart).
absl::StatusOr<core::ops::AttentionDropout> OnDevice(core::ops::AttentionDropout d,
                                                     const DropoutStream& dropout,
                                                     const Tensor& qkv) {
  if (d.doc_start != nullptr) {
    LOOM_ASSIGN_OR_RETURN(d.device_doc_start, dropout.documents->DeviceDocStart(qkv.device()));
  }
  return d;
}

}  // namespace

absl::Status ParallelAttention::CoreForward(const core::ops::AttentionPlan& plan,
                                            const Tensor& qkv, const DropoutStream& dropout,
                                            Tensor* out, Tensor* kept) const {
  const int64_t local_heads = heads_ / tp_.size();
  LOOM_ASSIGN_OR_RETURN(*kept, core::ops::EmptySaved(plan, qkv, local_heads));
  if (!cp_.parallel()) {
    LOOM_ASSIGN_OR_RETURN(const core::ops::AttentionDropout d,
                          OnDevice(KernelDropout(dropout), dropout, qkv));
    return core::ops::PlannedAttentionForward(plan, qkv, local_heads, out, kept, d);
  }
  return RingAttentionForward(*cp_.comm, cp_.Layout(qkv.dim(0) * cp_.size()), qkv, local_heads,
                              KernelDropout(dropout), out, kept);
}

absl::Status ParallelAttention::CoreBackward(const core::ops::AttentionPlan& plan,
                                             const Tensor& dout, const Tensor& qkv,
                                             const Tensor& out, const Tensor& kept,
                                             const DropoutStream& dropout, Tensor* dqkv) const {
  const int64_t local_heads = heads_ / tp_.size();
  if (!cp_.parallel()) {
    LOOM_ASSIGN_OR_RETURN(const core::ops::AttentionDropout d,
                          OnDevice(KernelDropout(dropout), dropout, qkv));
    return core::ops::PlannedAttentionBackward(plan, dout, qkv, out, kept, local_heads, dqkv, d);
  }
  return RingAttentionBackward(*cp_.comm, cp_.Layout(qkv.dim(0) * cp_.size()), dout, qkv, out,
                               kept, local_heads, KernelDropout(dropout), dqkv);
}

namespace {

// The ids are in range by construction: skip the kernels' host-side check.
core::ops::EmbeddingOptions RowGather() {
  core::ops::EmbeddingOptions o;
  o.zero_out_of_range = true;
  return o;
}

// The rotated rows of a RoPE table [rows · (heads + 2·groups), d]: its first
// rows · (heads + groups) rows as [s, b, heads + groups, d].
absl::StatusOr<Tensor> RotatedRows(const Tensor& table, int64_t s, int64_t b, int64_t qk_heads) {
  const int64_t d = table.dim(1);
  LOOM_ASSIGN_OR_RETURN(Tensor head, table.Narrow(0, s * b * qk_heads));
  return head.Reshape(Shape{s, b, qk_heads, d});
}

}  // namespace

absl::StatusOr<Tensor> ParallelAttention::Forward(const Tensor& x, const DropoutStream& dropout,
                                                  Saved* saved) const {
  const int64_t local_heads = heads_ / tp_.size(), local_groups = groups_ / tp_.size();
  // [s, b, (heads + 2·groups)/p · d]
  LOOM_ASSIGN_OR_RETURN(Tensor proj, qkv_.Forward(x, &saved->qkv_in));
  const int64_t s = proj.dim(0), b = proj.dim(1);
  const int64_t d = proj.dim(2) / (local_heads + 2 * local_groups);
  const PackedDocuments* const documents = dropout.documents.get();
  if (documents != nullptr) {
    // Host tables: the CPU kernels read them; a device's attention reads
    // doc_start's device copy (OnDevice) and RoPE takes the position ids as
    // runs of consecutive positions (Rotate).
    if (documents->batch != b || documents->seq_len != s * cp_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ParallelAttention: packed documents for [", documents->batch, " rows, ",
          documents->seq_len, " positions], the micro-batch has ", b, " rows of ",
          s * cp_.size()));
    }
  }
  saved->fused_split = false;
  if (!Rearranged()) {
    saved->qkv = proj;  // already [s, b, heads/p, {q, k, v}, d]
  } else {
    LOOM_ASSIGN_OR_RETURN(const core::ops::KernelChoice split,
                          core::ops::ChooseKernel("qkv_split", proj.device().type));
    // Position ids per token rotate through the index tables (Rotate).
    saved->fused_split = split.implementation == "fused" &&
                         (documents == nullptr || documents->position.empty() || !options_.rope);
  }
  if (saved->fused_split) {
    LOOM_ASSIGN_OR_RETURN(saved->qkv, Tensor::Empty(Shape{s, b, local_heads * 3 * d}, proj.dtype(),
                                                    proj.device()));
    LOOM_RETURN_IF_ERROR(FusedSplit(proj, &saved->qkv, /*backward=*/false));
  } else if (Rearranged()) {
    LOOM_RETURN_IF_ERROR(MakeIds(s * b, proj, saved));
    LOOM_ASSIGN_OR_RETURN(Tensor table, proj.Reshape(Shape{proj.numel() / d, d}));
    if (options_.rope) {
      LOOM_ASSIGN_OR_RETURN(Tensor rotated, Tensor::Empty(table.shape(), proj.dtype(), proj.device()));
      LOOM_RETURN_IF_ERROR(core::ops::EmbeddingForward(saved->table_ids, table, &rotated, RowGather()));
      LOOM_ASSIGN_OR_RETURN(Tensor qk, RotatedRows(rotated, s, b, local_heads + local_groups));
      LOOM_RETURN_IF_ERROR(Rotate(&qk, /*backward=*/false, documents));
      table = rotated;
    }
    LOOM_ASSIGN_OR_RETURN(saved->qkv, Tensor::Empty(Shape{s, b, local_heads * 3 * d}, proj.dtype(),
                                                    proj.device()));
    LOOM_ASSIGN_OR_RETURN(Tensor rows, saved->qkv.Reshape(Shape{s * b * local_heads * 3, d}));
    LOOM_RETURN_IF_ERROR(core::ops::EmbeddingForward(saved->gather_ids, table, &rows, RowGather()));
  }
  // [s, b, heads/p · d], and the plan's lse [b, heads/p, s] (f32) or probs
  LOOM_ASSIGN_OR_RETURN(Tensor ctx, Tensor::Empty(Shape{s, b, local_heads * d}, proj.dtype(), proj.device()));
  LOOM_ASSIGN_OR_RETURN(saved->plan, Plan(saved->qkv, dropout));
  Tensor kept;
  LOOM_RETURN_IF_ERROR(CoreForward(saved->plan, saved->qkv, dropout, &ctx, &kept));
  if (!options_.recompute_core) {  // else rerun in Backward
    saved->out = ctx;
    (saved->plan.saved == core::ops::AttentionSaved::kProbs ? saved->probs : saved->lse) = kept;
  }
  return proj_.Forward(ctx, &saved->proj_in);
}

absl::StatusOr<Tensor> ParallelAttention::Backward(const Tensor& dy, const DropoutStream& dropout,
                                                   const Saved& saved) const {
  const int64_t local_heads = heads_ / tp_.size(), local_groups = groups_ / tp_.size();
  LOOM_ASSIGN_OR_RETURN(Tensor dctx, proj_.Backward(dy, saved.proj_in));
  LOOM_ASSIGN_OR_RETURN(Tensor dqkv, Tensor::Empty(saved.qkv.shape(), saved.qkv.dtype(), saved.qkv.device()));
  Tensor out = saved.out;
  Tensor kept = saved.plan.saved == core::ops::AttentionSaved::kProbs ? saved.probs : saved.lse;
  if (options_.recompute_core) {  // selective recomputation: the kernel's forward again
    // Its output is the output projection's kept input (the same tensor, whose
    // backward has already read it): rewritten in place with the same values,
    // so only the log-sum-exp (or the s x s kernel's probabilities) is new memory.
    out = saved.proj_in.input;
    LOOM_RETURN_IF_ERROR(CoreForward(saved.plan, saved.qkv, dropout, &out, &kept));
  }
  LOOM_RETURN_IF_ERROR(CoreBackward(saved.plan, dctx, saved.qkv, out, kept, dropout, &dqkv));
  if (!Rearranged()) return qkv_.Backward(dqkv, saved.qkv_in);
  if (saved.fused_split) {  // in dqkv's dtype, the sums in f32 inside the kernel
    const int64_t d = dqkv.dim(2) / (3 * local_heads);
    LOOM_ASSIGN_OR_RETURN(Tensor dproj, Tensor::Empty(Shape{dqkv.dim(0), dqkv.dim(1),
                                                            (local_heads + 2 * local_groups) * d},
                                                      dqkv.dtype(), dqkv.device()));
    LOOM_RETURN_IF_ERROR(FusedSplit(dqkv, &dproj, /*backward=*/true));
    return qkv_.Backward(dproj, saved.qkv_in);
  }

  // Back to the projection's layout: scatter-add (a group's k and v
  // gradients sum over its query heads), un-rotate q and k. Sums run in f32.
  const int64_t s = dqkv.dim(0), b = dqkv.dim(1), d = dqkv.dim(2) / (3 * local_heads);
  const int64_t proj_rows = s * b * (local_heads + 2 * local_groups);
  const core::Device device = dqkv.device();
  LOOM_ASSIGN_OR_RETURN(Tensor rows, dqkv.Reshape(Shape{s * b * local_heads * 3, d}));
  LOOM_ASSIGN_OR_RETURN(Tensor dproj, Tensor::Empty(Shape{proj_rows, d}, core::DType::kF32, device));
  LOOM_RETURN_IF_ERROR(core::ops::Zero(&dproj));
  if (options_.rope) {
    LOOM_ASSIGN_OR_RETURN(Tensor dtable, Tensor::Empty(Shape{proj_rows, d}, core::DType::kF32, device));
    LOOM_RETURN_IF_ERROR(core::ops::Zero(&dtable));
    LOOM_RETURN_IF_ERROR(core::ops::EmbeddingBackward(saved.gather_ids, rows, &dtable, RowGather()));
    LOOM_ASSIGN_OR_RETURN(Tensor dqk, RotatedRows(dtable, s, b, local_heads + local_groups));
    LOOM_RETURN_IF_ERROR(Rotate(&dqk, /*backward=*/true, dropout.documents.get()));
    LOOM_RETURN_IF_ERROR(core::ops::EmbeddingBackward(saved.table_ids, dtable, &dproj, RowGather()));
  } else {
    LOOM_RETURN_IF_ERROR(core::ops::EmbeddingBackward(saved.gather_ids, rows, &dproj, RowGather()));
  }
  LOOM_ASSIGN_OR_RETURN(Tensor dproj3, dproj.Reshape(Shape{s, b, proj_rows / (s * b) * d}));
  if (dqkv.dtype() != core::DType::kF32) {
    LOOM_ASSIGN_OR_RETURN(Tensor converted, Tensor::Empty(dproj3.shape(), dqkv.dtype(), device));
    LOOM_RETURN_IF_ERROR(core::ops::Convert(dproj3, &converted));
    dproj3 = converted;
  }
  return qkv_.Backward(dproj3, saved.qkv_in);
}

absl::StatusOr<Tensor> ParallelMlp::Forward(const Tensor& x, Saved* saved) const {
  if (!swiglu_) {
    // GELU inside the up-projection: one GEMM with its epilogue where the
    // "linear_epilogue" choice fuses it (layers/linear.h).
    LOOM_ASSIGN_OR_RETURN(Tensor act, up_.Forward(x, &saved->up_in, &saved->pre_gelu));
    return down_.Forward(act, &saved->down_in);
  }
  LOOM_ASSIGN_OR_RETURN(saved->pre_gelu, up_.Forward(x, &saved->up_in));
  const Tensor& pre = saved->pre_gelu;
  LOOM_ASSIGN_OR_RETURN(Tensor act, Tensor::Empty(core::Shape{pre.dim(0), pre.dim(1), pre.dim(2) / 2},
                                                  pre.dtype(), pre.device()));
  LOOM_RETURN_IF_ERROR(core::ops::SwigluForward(pre, &act));
  return down_.Forward(act, &saved->down_in);
}

absl::StatusOr<Tensor> ParallelMlp::Backward(const Tensor& dy, const Saved& saved) const {
  if (!swiglu_) {
    // GELU's derivative inside the down-projection's dX GEMM; where that is
    // fused, the up-projection's bias gradient comes with it (layers/linear.h).
    bool up_bias_done = false;
    RowParallelLinear::GeluGrad gelu{&saved.pre_gelu, Tensor(), &up_bias_done};
    LOOM_ASSIGN_OR_RETURN(gelu.up_bias_grad, up_.BiasGrad());
    LOOM_ASSIGN_OR_RETURN(Tensor dpre, down_.Backward(dy, saved.down_in, &gelu));
    return up_.Backward(dpre, saved.up_in, up_bias_done);
  }
  LOOM_ASSIGN_OR_RETURN(Tensor dact, down_.Backward(dy, saved.down_in));
  LOOM_ASSIGN_OR_RETURN(Tensor dpre, Tensor::Empty(saved.pre_gelu.shape(), saved.pre_gelu.dtype(),
                                                   saved.pre_gelu.device()));
  LOOM_RETURN_IF_ERROR(core::ops::SwigluBackward(dact, saved.pre_gelu, &dpre));
  return up_.Backward(dpre, saved.up_in);
}

}  // namespace loom::layers
