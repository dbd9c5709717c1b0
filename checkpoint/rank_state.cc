#include "checkpoint/rank_state.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace loom::checkpoint {

Placement PlacementOf(const layers::ParamSpec& spec, const Shard& shard) {
  Placement out;
  const core::Shape& g = spec.global_shape;
  for (int i = 0; i < g.rank(); ++i) out.global_shape.push_back(g.dim(i));
  if (spec.unpadded_rows > 0) out.global_shape[0] = spec.unpadded_rows;
  int64_t rows, cols;
  MatrixDims(out.global_shape, &rows, &cols);
  switch (spec.split) {
    case layers::TpSplit::kRows:
      out.rect = Region::Rect(shard.split_start, shard.rows, 0, shard.cols);
      break;
    case layers::TpSplit::kCols:
      out.rect = Region::Rect(0, shard.rows, shard.split_start, shard.cols);
      break;
    case layers::TpSplit::kReplicated:
      out.rect = Region::Rect(0, shard.rows, 0, shard.cols);
      break;
  }
  // Vocabulary padding rows lie past the unpadded global shape: not stored.
  if (out.rect.row_start + out.rect.num_rows > rows) {
    out.rect.num_rows = std::max<int64_t>(0, rows - out.rect.row_start);
    out.rect.flat_end = out.rect.num_rows * out.rect.num_cols;
  }
  return out;
}

Placement PlacementOf(const layers::Param& p) {
  const core::Shape& local = p.master.shape();
  const int64_t local_rows = local.rank() == 0 ? 1 : local.dim(0);
  const int64_t local_cols = local_rows == 0 ? 0 : p.master.numel() / local_rows;
  return PlacementOf(*p.spec, Shard{p.split_start, local_rows, local_cols});
}

namespace {

bool Owns(const layers::Param& p, const RankView& v) {
  if (p.spec->split == layers::TpSplit::kReplicated && v.tp_rank != 0) return false;
  return !p.tied_copy;  // saved where the original lives (the first stage)
}

// A part of parameter p's local flat range [0, numel) that the moments cover,
// clipped to its stored rectangle: `region` (flat [begin, end) of the
// rectangle), at `at` in the moment buffers.
struct MomentPart {
  Region region;
  int64_t at;
};
std::vector<MomentPart> MomentParts(const layers::Param& p, const RankView& v,
                                    const Placement& pl) {
  std::vector<MomentPart> parts;
  int64_t base = 0;  // where the range starts in the moments
  for (const auto& [first, last] : v.moment_ranges) {
    const int64_t begin = std::max(p.offset, first) - p.offset;
    const int64_t end = std::min({p.offset + p.master.numel(), last, p.offset + pl.rect.flat_end}) -
                        p.offset;
    if (begin < end) {
      Region r = pl.rect;
      r.flat_begin = begin;
      r.flat_end = end;
      parts.push_back({r, base + p.offset + begin - first});
    }
    base += last - first;
  }
  return parts;
}

// The moment buffers, in the order their pieces are saved and read.
struct Moment {
  State state;
  core::Tensor* buffer;
};
std::array<Moment, 2> Moments(const RankView& v) {
  return {Moment{EXP_AVG, v.exp_avg}, Moment{EXP_AVG_SQ, v.exp_avg_sq}};
}

}  // namespace

std::vector<Piece> PiecesToSave(const RankView& v, bool save_optimizer) {
  std::vector<Piece> pieces;
  const bool moments = save_optimizer && v.exp_avg != nullptr && v.exp_avg_sq != nullptr;
  for (const layers::Param& p : v.params->params()) {
    if (!Owns(p, v)) continue;
    const Placement pl = PlacementOf(p);
    const int replica = p.spec->expert ? v.expert_dp_rank : v.dp_rank;
    if (replica == 0 && pl.rect.numel() > 0) {
      pieces.push_back(Piece{p.spec->name, PARAM, pl.global_shape, pl.rect,
                             p.master.data<float>()});
    }
    if (!moments || (!v.distributed_optimizer && replica != 0)) continue;
    for (const MomentPart& part : MomentParts(p, v, pl)) {
      for (const Moment& m : Moments(v)) {
        pieces.push_back(Piece{p.spec->name, m.state, pl.global_shape, part.region,
                               m.buffer->data<float>() + part.at});
      }
    }
  }
  return pieces;
}

absl::Status LoadRank(CheckpointReader& reader, const RankView& v, bool load_optimizer) {
  const bool moments = load_optimizer && v.exp_avg != nullptr && v.exp_avg_sq != nullptr &&
                       reader.manifest().training().has_optimizer_state();
  // Every read of this rank, done as one batch (one pass per file, its
  // checksum checked before ReadMany returns). Elements no read covers are
  // zeroed: the padding of each parameter, and the moments outside the
  // stored ranges.
  std::vector<CheckpointReader::Request> requests;
  std::vector<std::pair<int64_t, int64_t>> moment_ranges;  // [at, +n) in the moment buffers
  for (layers::Param& p : v.params->params()) {
    const Placement pl = PlacementOf(p);
    const TensorInfo* t = reader.Find(p.spec->name, PARAM);
    if (t == nullptr) {
      return absl::NotFoundError(absl::StrCat("checkpoint ", reader.path(),
                                              " has no parameter ", p.spec->name));
    }
    if (std::vector<int64_t>(t->global_shape().begin(), t->global_shape().end()) !=
        pl.global_shape) {
      std::string want, got;
      for (int64_t d : pl.global_shape) absl::StrAppend(&want, want.empty() ? "" : ",", d);
      for (int64_t d : t->global_shape()) absl::StrAppend(&got, got.empty() ? "" : ",", d);
      return absl::FailedPreconditionError(
          absl::StrCat("parameter ", p.spec->name, " has global shape [", got,
                       "] in checkpoint ", reader.path(), " but [", want, "] from the flags"));
    }
    float* value = p.master.data<float>();
    // The stored rectangle is the local shard's leading rows: zero the rest.
    if (pl.rect.numel() < p.master.numel()) {
      std::memset(value + pl.rect.numel(), 0,
                  static_cast<size_t>(p.master.numel() - pl.rect.numel()) * sizeof(float));
    }
    requests.push_back({p.spec->name, PARAM, pl.rect, value});
    if (!moments) continue;
    for (const MomentPart& part : MomentParts(p, v, pl)) {
      for (const Moment& m : Moments(v)) {
        requests.push_back({p.spec->name, m.state, part.region, m.buffer->data<float>() + part.at});
      }
      moment_ranges.push_back({part.at, part.region.numel()});
    }
  }
  if (moments) {
    // Zero the gaps between the ranges read (not the whole buffers: that
    // would be a second pass over all of them).
    std::sort(moment_ranges.begin(), moment_ranges.end());
    for (const Moment& m : Moments(v)) {
      float* data = m.buffer->data<float>();
      const int64_t total = m.buffer->numel();
      int64_t at = 0;
      for (const auto& [begin, n] : moment_ranges) {
        if (begin > at) std::memset(data + at, 0, static_cast<size_t>(begin - at) * sizeof(float));
        at = std::max(at, begin + n);
      }
      if (total > at) std::memset(data + at, 0, static_cast<size_t>(total - at) * sizeof(float));
    }
  }
  return reader.ReadMany(requests);
}

ModelConfig ModelConfigProto(const layers::GptConfig& c) {
  ModelConfig m;
  m.set_num_layers(c.num_layers);
  m.set_hidden_size(c.hidden_size);
  m.set_num_attention_heads(c.num_attention_heads);
  m.set_ffn_hidden_size(c.ffn());
  m.set_seq_length(c.seq_length);
  m.set_max_position_embeddings(c.max_positions());
  m.set_vocab_size(c.vocab_size);
  m.set_make_vocab_size_divisible_by(c.make_vocab_size_divisible_by);
  m.set_init_method_std(c.init_method_std);
  m.set_layernorm_epsilon(c.layernorm_epsilon);
  m.set_seed(c.seed);
  m.set_normalization(c.normalization);
  m.set_position_embedding_type(c.position_embedding_type);
  m.set_rotary_base(c.rotary_base);
  m.set_rotary_percent(c.rotary_percent);
  m.set_swiglu(c.swiglu);
  m.set_group_query_attention(c.group_query_attention);
  m.set_num_query_groups(c.num_query_groups);
  m.set_untie_embeddings_and_output_weights(c.untie_embeddings_and_output_weights);
  m.set_disable_bias_linear(!c.add_bias_linear);
  if (c.moe()) {
    m.set_num_experts(c.num_experts);
    m.set_moe_router_topk(c.moe_router_topk);
    m.set_moe_layer_freq(c.moe_layer_freq);
    m.set_moe_aux_loss_coeff(c.moe_router_load_balancing_type == "aux_loss" ? c.moe_aux_loss_coeff
                                                                            : 0.0f);
  }
  return m;
}

layers::GptConfig GptConfigFromProto(const ModelConfig& m) {
  layers::GptConfig c;
  c.num_layers = m.num_layers();
  c.hidden_size = m.hidden_size();
  c.num_attention_heads = m.num_attention_heads();
  c.ffn_hidden_size = m.ffn_hidden_size();
  c.seq_length = m.seq_length();
  c.max_position_embeddings = m.max_position_embeddings();
  c.vocab_size = m.vocab_size();
  c.make_vocab_size_divisible_by = m.make_vocab_size_divisible_by();
  c.init_method_std = m.init_method_std();
  c.layernorm_epsilon = m.layernorm_epsilon();
  c.seed = m.seed();
  // Absent fields (older checkpoints) keep GptConfig's defaults: GPT-2.
  if (!m.normalization().empty()) c.normalization = m.normalization();
  if (!m.position_embedding_type().empty()) c.position_embedding_type = m.position_embedding_type();
  if (m.rotary_base() != 0.0f) c.rotary_base = m.rotary_base();
  if (m.rotary_percent() != 0.0f) c.rotary_percent = m.rotary_percent();
  c.swiglu = m.swiglu();
  c.group_query_attention = m.group_query_attention();
  if (m.num_query_groups() != 0) c.num_query_groups = m.num_query_groups();
  c.untie_embeddings_and_output_weights = m.untie_embeddings_and_output_weights();
  c.add_bias_linear = !m.disable_bias_linear();
  c.num_experts = m.num_experts();
  if (m.moe_router_topk() != 0) c.moe_router_topk = m.moe_router_topk();
  if (m.moe_layer_freq() != 0) c.moe_layer_freq = m.moe_layer_freq();
  if (m.has_moe_aux_loss_coeff()) c.moe_aux_loss_coeff = m.moe_aux_loss_coeff();
  return c;
}

absl::Status CheckModelConfig(const ModelConfig& saved, const layers::GptConfig& flags,
                              const std::string& path) {
  const ModelConfig want = ModelConfigProto(flags);
  struct Field {
    const char* flag;
    int64_t saved, flags;
  };
  const Field fields[] = {
      {"--num-layers", saved.num_layers(), want.num_layers()},
      {"--hidden-size", saved.hidden_size(), want.hidden_size()},
      {"--num-attention-heads", saved.num_attention_heads(), want.num_attention_heads()},
      {"--ffn-hidden-size", saved.ffn_hidden_size(), want.ffn_hidden_size()},
      {"--max-position-embeddings", saved.max_position_embeddings(),
       want.max_position_embeddings()},
      {"--seq-length", saved.seq_length(), want.seq_length()},
      {"vocabulary size (--tokenizer-type / --vocab-file)", saved.vocab_size(),
       want.vocab_size()},
  };
  auto mismatch = [&](const char* flag, const std::string& s, const std::string& f) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model config mismatch: ", flag, " is ", s, " in checkpoint ", path, " but ", f,
        " from the flags (resume with the flags the checkpoint was saved with, see ", path,
        "/manifest.txt)"));
  };
  for (const Field& f : fields) {
    if (f.saved != f.flags) {
      return mismatch(f.flag, absl::StrCat(f.saved), absl::StrCat(f.flags));
    }
  }
  // The Llama-style fields, compared as GptConfig reads them (absent = GPT-2).
  const layers::GptConfig s = GptConfigFromProto(saved);
  const layers::GptConfig& w = flags;
  struct Text {
    const char* flag;
    std::string saved, flags;
  };
  auto b = [](bool v) { return std::string(v ? "true" : "false"); };
  const Text texts[] = {
      {"--normalization", s.normalization, w.normalization},
      {"--position-embedding-type", s.position_embedding_type, w.position_embedding_type},
      {"--swiglu", b(s.swiglu), b(w.swiglu)},
      {"--group-query-attention", b(s.group_query_attention), b(w.group_query_attention)},
      {"--num-query-groups", absl::StrCat(s.query_groups()), absl::StrCat(w.query_groups())},
      {"--untie-embeddings-and-output-weights", b(s.untie_embeddings_and_output_weights),
       b(w.untie_embeddings_and_output_weights)},
      {"--disable-bias-linear", b(!s.add_bias_linear), b(!w.add_bias_linear)},
      {"--num-experts", absl::StrCat(s.num_experts), absl::StrCat(w.num_experts)},
      {"--moe-router-topk", absl::StrCat(s.moe() ? s.moe_router_topk : 0),
       absl::StrCat(w.moe() ? w.moe_router_topk : 0)},
      {"--moe-layer-freq", absl::StrCat(s.moe() ? s.moe_layer_freq : 0),
       absl::StrCat(w.moe() ? w.moe_layer_freq : 0)},
  };
  for (const Text& t : texts) {
    if (t.saved != t.flags) return mismatch(t.flag, t.saved, t.flags);
  }
  struct Real {
    const char* flag;
    float saved, flags;
  };
  const Real reals[] = {
      {"--norm-epsilon", s.layernorm_epsilon, w.layernorm_epsilon},
      {"--rotary-base", s.rope() ? s.rotary_base : 0.0f, w.rope() ? w.rotary_base : 0.0f},
      {"--rotary-percent", s.rope() ? s.rotary_percent : 0.0f,
       w.rope() ? w.rotary_percent : 0.0f},
  };
  for (const Real& r : reals) {
    if (r.saved != r.flags) return mismatch(r.flag, absl::StrCat(r.saved), absl::StrCat(r.flags));
  }
  return absl::OkStatus();
}

}  // namespace loom::checkpoint
