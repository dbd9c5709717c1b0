#include "layers/transformer_block.h"

#include "absl/strings/str_cat.h"
#include "core/ops/ops.h"
#include "core/status_macros.h"

namespace loom::layers {

using core::Tensor;

namespace {
std::string Name(int64_t layer, const char* rest) { return absl::StrCat("layers.", layer, ".", rest); }

// The parameter, or null where the config has none (biases, LayerNorm's beta).
Param* Optional(ParamBuffer* p, const std::string& name) {
  return p->contains(name) ? &p->at(name) : nullptr;
}

LayerNorm Norm(ParamBuffer* p, const GptConfig& c, int64_t layer, const char* which) {
  Param* gamma = &p->at(Name(layer, absl::StrCat(which, ".weight").c_str()));
  if (c.rms_norm()) return LayerNorm::Rms(gamma, c.layernorm_epsilon);
  return LayerNorm(gamma, &p->at(Name(layer, absl::StrCat(which, ".bias").c_str())),
                   c.layernorm_epsilon);
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
    : layer_(layer),
      tp_(tp),
      cp_(cp),
      ln1_(Norm(p, c, layer, "input_layernorm")),
      ln2_(Norm(p, c, layer, "post_attention_layernorm")),
      attention_(&p->at(Name(layer, "attention.qkv.weight")),
                 Optional(p, Name(layer, "attention.qkv.bias")),
                 &p->at(Name(layer, "attention.dense.weight")),
                 Optional(p, Name(layer, "attention.dense.bias")), AttentionOptionsOf(c), tp, cp,
                 layer),
      mlp_(c.moe_layer(layer)
               ? std::nullopt
               : std::optional<ParallelMlp>(std::in_place,
                                            &p->at(Name(layer, "mlp.dense_h_to_4h.weight")),
                                            Optional(p, Name(layer, "mlp.dense_h_to_4h.bias")),
                                            &p->at(Name(layer, "mlp.dense_4h_to_h.weight")),
                                            Optional(p, Name(layer, "mlp.dense_4h_to_h.bias")), tp,
                                            c.swiglu)) {
  if (c.moe_layer(layer)) moe_.emplace(MoeMlp::ForLayer(p, c, layer, tp, ep, cp));
}

absl::Status TransformerBlock::Dropout(Tensor* x, const DropoutStream& d, int site,
                                       bool backward) const {
  return HiddenDropout(x, d, DropoutSite(d.stream, layer_, site), tp_, cp_, backward);
}

absl::StatusOr<Tensor> TransformerBlock::Forward(const Tensor& x, const DropoutStream& d,
                                                 Saved* saved) const {
  LOOM_ASSIGN_OR_RETURN(Tensor a, ln1_.Forward(x, &saved->ln1));
  LOOM_ASSIGN_OR_RETURN(a, attention_.Forward(a, d, &saved->attention));
  LOOM_RETURN_IF_ERROR(Dropout(&a, d, 0, false));
  LOOM_RETURN_IF_ERROR(core::ops::Add(a, x, &a));  // a is now h1
  LOOM_ASSIGN_OR_RETURN(Tensor m, ln2_.Forward(a, &saved->ln2));
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
