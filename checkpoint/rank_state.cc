#include "checkpoint/rank_state.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace loom::checkpoint {

Placement PlacementOf(const layers::Param& p, const layers::GptConfig& model) {
  Placement out;
  const core::Shape& g = p.spec->global_shape;
  for (int i = 0; i < g.rank(); ++i) out.global_shape.push_back(g.dim(i));
  if (p.spec->name == kWordEmbedding) out.global_shape[0] = model.vocab_size;
  int64_t rows, cols;
  MatrixDims(out.global_shape, &rows, &cols);
  const core::Shape& local = p.master.shape();
  const int64_t local_rows = local.rank() == 0 ? 1 : local.dim(0);
  const int64_t local_cols = local_rows == 0 ? 0 : p.master.numel() / local_rows;
  switch (p.spec->split) {
    case layers::TpSplit::kRows:
      out.rect = Region::Rect(p.split_start, local_rows, 0, local_cols);
      break;
    case layers::TpSplit::kCols:
      out.rect = Region::Rect(0, local_rows, p.split_start, local_cols);
      break;
    case layers::TpSplit::kReplicated:
      out.rect = Region::Rect(0, local_rows, 0, local_cols);
      break;
  }
  // Vocabulary padding rows lie past the unpadded global shape: not stored.
  if (out.rect.row_start + out.rect.num_rows > rows) {
    out.rect.num_rows = std::max<int64_t>(0, rows - out.rect.row_start);
    out.rect.flat_end = out.rect.num_rows * out.rect.num_cols;
  }
  return out;
}

namespace {

bool Owns(const layers::Param& p, const RankView& v) {
  if (p.spec->split == layers::TpSplit::kReplicated && v.tp_rank != 0) return false;
  if (p.spec->name == kWordEmbedding && v.pp_rank != 0) return false;  // tied copy
  return true;
}

// The part of parameter p's local flat range [0, numel) that the moments
// cover, clipped to its stored rectangle: [*begin, *end).
void MomentRange(const layers::Param& p, const RankView& v, const Placement& pl, int64_t* begin,
                 int64_t* end) {
  *begin = std::max(p.offset, v.shard_begin) - p.offset;
  *end = std::min(p.offset + p.master.numel(), v.shard_end) - p.offset;
  *end = std::min(*end, pl.rect.flat_end);
  if (*end < *begin) *end = *begin;
}

}  // namespace

std::vector<Piece> PiecesToSave(const RankView& v, bool save_optimizer) {
  std::vector<Piece> pieces;
  const bool moments = save_optimizer && v.exp_avg != nullptr && v.exp_avg_sq != nullptr;
  for (const layers::Param& p : v.params->params()) {
    if (!Owns(p, v)) continue;
    const Placement pl = PlacementOf(p, v.model);
    if (v.dp_rank == 0 && pl.rect.numel() > 0) {
      pieces.push_back(Piece{p.spec->name, PARAM, pl.global_shape, pl.rect,
                             p.master.data<float>()});
    }
    if (!moments || (!v.distributed_optimizer && v.dp_rank != 0)) continue;
    int64_t begin, end;
    MomentRange(p, v, pl, &begin, &end);
    if (begin >= end) continue;
    Region r = pl.rect;
    r.flat_begin = begin;
    r.flat_end = end;
    const int64_t at = p.offset + begin - v.shard_begin;
    pieces.push_back(Piece{p.spec->name, EXP_AVG, pl.global_shape, r,
                           v.exp_avg->data<float>() + at});
    pieces.push_back(Piece{p.spec->name, EXP_AVG_SQ, pl.global_shape, r,
                           v.exp_avg_sq->data<float>() + at});
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
    const Placement pl = PlacementOf(p, v.model);
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
    int64_t begin, end;
    MomentRange(p, v, pl, &begin, &end);
    if (begin >= end) continue;
    Region r = pl.rect;
    r.flat_begin = begin;
    r.flat_end = end;
    const int64_t at = p.offset + begin - v.shard_begin;
    requests.push_back({p.spec->name, EXP_AVG, r, v.exp_avg->data<float>() + at});
    requests.push_back({p.spec->name, EXP_AVG_SQ, r, v.exp_avg_sq->data<float>() + at});
    moment_ranges.push_back({at, end - begin});
  }
  if (moments) {
    // Zero the gaps between the ranges read (not the whole buffers: that
    // would be a second pass over all of them).
    std::sort(moment_ranges.begin(), moment_ranges.end());
    for (core::Tensor* m : {v.exp_avg, v.exp_avg_sq}) {
      float* data = m->data<float>();
      const int64_t total = m->numel();
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
  for (const Field& f : fields) {
    if (f.saved != f.flags) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model config mismatch: ", f.flag, " is ", f.saved, " in checkpoint ", path, " but ",
          f.flags, " from the flags (resume with the flags the checkpoint was saved with, see ",
          path, "/manifest.txt)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace loom::checkpoint
