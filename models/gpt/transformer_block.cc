#include "models/gpt/transformer_block.h"

#include "core/ops/kernel_choice.h"
#include "core/ops/ops.h"
#include "core/status_macros.h"
#include "models/gpt/moe_block.h"

namespace loom::layers {

using core::Tensor;

namespace {

// The parameter, or null where the config has none (biases, LayerNorm's beta).
Param* Optional(ParamBuffer* p, const std::string& name) {
  return p->contains(name) ? &p->at(name) : nullptr;
}

TransformerBlock::NormParams NormParamsOf(ParamBuffer* p, const GptConfig& c,
                                          const std::string& weight, const std::string& beta) {
  return {&p->at(weight), c.rms_norm() ? nullptr : &p->at(beta), c.layernorm_epsilon};
}

LayerNorm Norm(ParamBuffer* p, const GptConfig& c, const std::string& weight,
               const std::string& beta) {
  if (c.rms_norm()) return LayerNorm::Rms(&p->at(weight), c.layernorm_epsilon);
  return LayerNorm(&p->at(weight), &p->at(beta), c.layernorm_epsilon);
}

}  // namespace

AttentionOptions AttentionOptionsOf(const GptConfig& c) {
  AttentionOptions o;
  o.heads = c.num_attention_heads;
  o.query_groups = c.query_groups();
  o.rope = c.rope();
  o.rope_options.base = c.rotary_base;
  o.rope_options.rotary_dim = c.rotary_dim();
  o.recompute_core = c.recompute_selective();
  return o;
}

absl::Status HiddenDropout(Tensor* x, const DropoutStream& d, uint64_t site_stream,
                           const TpGroup& tp, const CpGroup& cp, bool backward) {
  if (!d.training || d.hidden_p <= 0.0f) return absl::OkStatus();
  core::ops::DropoutOptions opts;
  opts.p = d.hidden_p;
  opts.seed = d.seed;
  opts.offset = site_stream;
  const int64_t rows = x->dim(0), row_elems = x->numel() / rows;  // one position: b · h
  for (const RowRun& run : ActivationRowRuns(tp, cp, rows)) {
    LOOM_ASSIGN_OR_RETURN(Tensor part, x->Narrow(run.local_first, run.count));
    core::ops::GlobalIndex where;
    where.row_stride = x->dim(x->rank() - 1);
    where.first_index = run.global_first * row_elems;
    LOOM_RETURN_IF_ERROR(backward ? core::ops::DropoutBackward(part, &part, opts, where)
                                  : core::ops::DropoutForward(part, &part, opts, where));
  }
  return absl::OkStatus();
}

TransformerBlock::TransformerBlock(ParamBuffer* p, const GptConfig& c, int64_t layer, TpGroup tp,
                                   CpGroup cp, EpGroup ep)
    : TransformerBlock(p, c, layer, BlockParamNames(layer), tp, cp, ep) {}

TransformerBlock::TransformerBlock(ParamBuffer* p, const GptConfig& c, int64_t layer,
                                   const BlockParamNames& n, TpGroup tp, CpGroup cp, EpGroup ep)
    : layer_(layer),
      tp_(tp),
      cp_(cp),
      ln1_(Norm(p, c, n.input_norm_weight, n.input_norm_bias)),
      ln2_(Norm(p, c, n.post_norm_weight, n.post_norm_bias)),
      ln1_params_(NormParamsOf(p, c, n.input_norm_weight, n.input_norm_bias)),
      ln2_params_(NormParamsOf(p, c, n.post_norm_weight, n.post_norm_bias)),
      attention_(&p->at(n.qkv_weight), Optional(p, n.qkv_bias), &p->at(n.dense_weight),
                 Optional(p, n.dense_bias), AttentionOptionsOf(c), tp, cp, layer),
      mlp_(c.moe_layer(layer)
               ? std::nullopt
               : std::optional<ParallelMlp>(std::in_place, &p->at(n.fc1_weight),
                                            Optional(p, n.fc1_bias), &p->at(n.fc2_weight),
                                            Optional(p, n.fc2_bias), tp, c.swiglu)) {
  if (c.moe_layer(layer)) moe_.emplace(MoeMlpForLayer(p, c, layer, tp, ep, cp));
}

absl::Status TransformerBlock::Dropout(Tensor* x, const DropoutStream& d, int site,
                                       bool backward) const {
  return HiddenDropout(x, d, DropoutSite(d.stream, layer_, site), tp_, cp_, backward);
}

absl::StatusOr<bool> TransformerBlock::Fused(const Tensor& t) const {
  LOOM_ASSIGN_OR_RETURN(const core::ops::KernelChoice choice,
                        core::ops::ChooseKernel("residual_norm", t.device().type));
  return choice.implementation == "fused";
}

namespace {

core::ops::ResidualNormOptions FusedOptions(const TransformerBlock::NormParams& norm) {
  core::ops::ResidualNormOptions o;
  o.rms = norm.beta == nullptr;
  o.eps = norm.eps;
  return o;
}

// The hidden dropout's options at `site_stream`, or none (p = 0) where
// HiddenDropout would draw none.
core::ops::DropoutOptions HiddenDropoutOptions(const DropoutStream& d, uint64_t site_stream,
                                               bool on) {
  core::ops::DropoutOptions o = {0.0f, 0, 0};
  if (!on || !d.training || d.hidden_p <= 0.0f) return o;
  o.p = d.hidden_p;
  o.seed = d.seed;
  o.offset = site_stream;
  return o;
}

// Rows [first, first + count) of an activation's norm statistics, or t as it
// is when undefined (RMSNorm's mean).
absl::StatusOr<Tensor> StatRows(const Tensor& t, int64_t first, int64_t count) {
  if (!t.defined()) return t;
  return t.Narrow(first, count);
}

}  // namespace

absl::StatusOr<Tensor> TransformerBlock::ResidualNormForward(const Tensor& x, Tensor* branch,
                                                             const DropoutStream& d, int site,
                                                             const NormParams& norm,
                                                             LayerNorm::Saved* saved) const {
  core::ops::ResidualNormOptions o = FusedOptions(norm);
  o.dropout = HiddenDropoutOptions(d, site >= 0 ? DropoutSite(d.stream, layer_, site) : 0,
                                   site >= 0);
  const int64_t positions = branch->dim(0), h = branch->dim(branch->rank() - 1);
  const int64_t rows = branch->numel() / h, per_position = rows / positions;
  LOOM_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(branch->shape(), branch->dtype(),
                                                  branch->device()));
  LOOM_ASSIGN_OR_RETURN(saved->rstd,
                        Tensor::Empty(core::Shape{rows}, core::DType::kF32, branch->device()));
  saved->mean = Tensor();
  if (!o.rms) {
    LOOM_ASSIGN_OR_RETURN(saved->mean,
                          Tensor::Empty(core::Shape{rows}, core::DType::kF32, branch->device()));
  }
  saved->input = *branch;  // the norm's input: the residual sum, in the branch's storage
  const Tensor beta = o.rms ? Tensor() : norm.beta->value;
  // One call per run of consecutive global positions (HiddenDropout's runs:
  // the mask follows global indices); norm rows are independent, so the split
  // changes no bit.
  std::vector<RowRun> runs = {RowRun{0, positions, 0}};
  if (o.dropout.p > 0.0f) runs = ActivationRowRuns(tp_, cp_, positions);
  for (const RowRun& run : runs) {
    LOOM_ASSIGN_OR_RETURN(Tensor xr, x.Narrow(run.local_first, run.count));
    LOOM_ASSIGN_OR_RETURN(Tensor br, branch->Narrow(run.local_first, run.count));
    LOOM_ASSIGN_OR_RETURN(Tensor orr, out.Narrow(run.local_first, run.count));
    const int64_t r0 = run.local_first * per_position, rn = run.count * per_position;
    LOOM_ASSIGN_OR_RETURN(Tensor mean, StatRows(saved->mean, r0, rn));
    LOOM_ASSIGN_OR_RETURN(Tensor rstd, StatRows(saved->rstd, r0, rn));
    o.where.row_stride = h;
    o.where.first_index = run.global_first * (branch->numel() / positions);
    LOOM_RETURN_IF_ERROR(core::ops::ResidualNormForward(xr, br, norm.gamma->value, beta, o, &br,
                                                        &orr, o.rms ? nullptr : &mean, &rstd));
  }
  return out;
}

absl::Status TransformerBlock::ResidualNormBackward(const Tensor& dout, const Tensor& dresid,
                                                    const DropoutStream& d, int site,
                                                    const NormParams& norm,
                                                    const LayerNorm::Saved& saved, Tensor* dx,
                                                    Tensor* dbranch) const {
  core::ops::ResidualNormOptions o = FusedOptions(norm);
  o.dropout = HiddenDropoutOptions(d, site >= 0 ? DropoutSite(d.stream, layer_, site) : 0,
                                   site >= 0 && dbranch != nullptr);
  const Tensor mean = o.rms ? Tensor() : saved.mean;
  Tensor* dbeta = o.rms ? nullptr : &norm.beta->grad;
  const int64_t positions = dout.dim(0);
  const std::vector<RowRun> runs =
      o.dropout.p > 0.0f ? ActivationRowRuns(tp_, cp_, positions) : std::vector<RowRun>{};
  if (runs.size() <= 1) {
    if (!runs.empty()) {
      o.where.row_stride = dout.dim(dout.rank() - 1);
      o.where.first_index = runs[0].global_first * (dout.numel() / positions);
    }
    return core::ops::ResidualNormBackward(dout, dresid, saved.input, norm.gamma->value, mean,
                                           saved.rstd, o, dx, dbranch,
                                           &norm.gamma->grad, dbeta);
  }
  // Several runs (CP's two chunks): one call over all rows keeps dgamma's
  // summation order the unfused one; the dropout then per run, as HiddenDropout.
  o.dropout = HiddenDropoutOptions(d, 0, false);
  LOOM_RETURN_IF_ERROR(core::ops::ResidualNormBackward(dout, dresid, saved.input,
                                                       norm.gamma->value, mean, saved.rstd, o,
                                                       dx, dbranch, &norm.gamma->grad, dbeta));
  return Dropout(dbranch, d, site, /*backward=*/true);
}

absl::StatusOr<Tensor> TransformerBlock::Forward(const Tensor& x, const DropoutStream& d,
                                                 Saved* saved) const {
  LOOM_ASSIGN_OR_RETURN(Tensor a, ln1_.Forward(x, &saved->ln1));
  LOOM_ASSIGN_OR_RETURN(a, attention_.Forward(a, d, &saved->attention));
  LOOM_ASSIGN_OR_RETURN(const bool fused, Fused(x));
  Tensor m;
  if (fused) {  // a becomes h1 in place, as below
    LOOM_ASSIGN_OR_RETURN(m, ResidualNormForward(x, &a, d, 0, ln2_params_, &saved->ln2));
  } else {
    LOOM_RETURN_IF_ERROR(Dropout(&a, d, 0, false));
    LOOM_RETURN_IF_ERROR(core::ops::Add(a, x, &a));  // a is now h1
    LOOM_ASSIGN_OR_RETURN(m, ln2_.Forward(a, &saved->ln2));
  }
  LOOM_ASSIGN_OR_RETURN(m, moe_ ? moe_->Forward(m, &saved->moe) : mlp_->Forward(m, &saved->mlp));
  LOOM_RETURN_IF_ERROR(Dropout(&m, d, 1, false));
  LOOM_RETURN_IF_ERROR(core::ops::Add(m, a, &m));
  return m;
}

absl::StatusOr<Tensor> TransformerBlock::Backward(const Tensor& dy, const DropoutStream& d,
                                                  const Saved& saved, float loss_weight) const {
  LOOM_ASSIGN_OR_RETURN(Tensor dm, dy.Clone());
  LOOM_RETURN_IF_ERROR(Dropout(&dm, d, 1, true));
  LOOM_ASSIGN_OR_RETURN(dm, moe_ ? moe_->Backward(dm, loss_weight, saved.moe)
                                : mlp_->Backward(dm, saved.mlp));
  LOOM_ASSIGN_OR_RETURN(const bool fused, Fused(dy));
  if (fused) {  // the same tensors, each written in one pass
    LOOM_ASSIGN_OR_RETURN(Tensor dh1, Tensor::Empty(dy.shape(), dy.dtype(), dy.device()));
    LOOM_ASSIGN_OR_RETURN(Tensor da, Tensor::Empty(dy.shape(), dy.dtype(), dy.device()));
    LOOM_RETURN_IF_ERROR(ResidualNormBackward(dm, dy, d, 0, ln2_params_, saved.ln2, &dh1, &da));
    LOOM_ASSIGN_OR_RETURN(da, attention_.Backward(da, d, saved.attention));
    LOOM_ASSIGN_OR_RETURN(Tensor dx, Tensor::Empty(dy.shape(), dy.dtype(), dy.device()));
    LOOM_RETURN_IF_ERROR(ResidualNormBackward(da, dh1, d, -1, ln1_params_, saved.ln1, &dx, nullptr));
    return dx;
  }
  LOOM_ASSIGN_OR_RETURN(Tensor dh1, ln2_.Backward(dm, saved.ln2));
  LOOM_RETURN_IF_ERROR(core::ops::Add(dh1, dy, &dh1));  // residual
  LOOM_ASSIGN_OR_RETURN(Tensor da, dh1.Clone());
  LOOM_RETURN_IF_ERROR(Dropout(&da, d, 0, true));
  LOOM_ASSIGN_OR_RETURN(da, attention_.Backward(da, d, saved.attention));
  LOOM_ASSIGN_OR_RETURN(Tensor dx, ln1_.Backward(da, saved.ln1));
  LOOM_RETURN_IF_ERROR(core::ops::Add(dx, dh1, &dx));
  return dx;
}

}  // namespace loom::layers
