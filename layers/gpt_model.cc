#include "layers/gpt_model.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/ops/ops.h"
#include "core/status_macros.h"
#include "layers/mappings.h"

namespace loom::layers {

using core::Shape;
using core::Tensor;

namespace {

constexpr char kWordEmbedding[] = "embedding.word_embeddings.weight";
constexpr char kPositionEmbedding[] = "embedding.position_embeddings.weight";
constexpr int64_t kEmbeddingLayer = -1;  // dropout stream of the embedding

int64_t Bytes(const Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }

// ids[i, j] = s0 + i for x = [s_local, b, h]: the positions of this rank's
// rows of the sequence (s0 = rank · s_local under sequence parallelism),
// made on the host and moved to x's device.
absl::StatusOr<Tensor> PositionIds(const TpGroup& tp, const Tensor& x) {
  const int64_t s_local = x.dim(0), b = x.dim(1);
  const int64_t s0 = tp.sequence_parallel ? tp.rank() * s_local : 0;
  LOOM_ASSIGN_OR_RETURN(Tensor ids, Tensor::Empty(Shape{s_local, b}, core::DType::kI32));
  int32_t* p = ids.data<int32_t>();
  for (int64_t i = 0; i < s_local; ++i) {
    for (int64_t j = 0; j < b; ++j) p[i * b + j] = static_cast<int32_t>(s0 + i);
  }
  if (x.device().is_cpu()) return ids;
  return ids.To(x.device());
}

}  // namespace

int64_t GptModel::Saved::ActivationBytes() const {
  int64_t n = Bytes(ids);
  for (const auto& b : blocks) {
    n += Bytes(b.ln1.input) + Bytes(b.ln1.mean) + Bytes(b.ln1.rstd) + Bytes(b.ln2.input) +
         Bytes(b.ln2.mean) + Bytes(b.ln2.rstd) + Bytes(b.attention.qkv_in.input) +
         Bytes(b.attention.qkv) + Bytes(b.attention.probs) + Bytes(b.attention.proj_in.input) +
         Bytes(b.mlp.up_in.input) + Bytes(b.mlp.pre_gelu) + Bytes(b.mlp.down_in.input);
  }
  return n + Bytes(final_norm.input) + Bytes(output.input) + Bytes(loss.logits);
}

absl::StatusOr<std::unique_ptr<GptModel>> GptModel::Create(const GptConfig& config, TpGroup tp) {
  return Create(config, tp, {ChunkSpec{0, config.num_layers, true, true}});
}

absl::StatusOr<std::unique_ptr<GptModel>> GptModel::Create(const GptConfig& config, TpGroup tp,
                                                           std::vector<ChunkSpec> chunks,
                                                           int64_t buffer_multiple) {
  LOOM_RETURN_IF_ERROR(ValidateLayout(config, tp.size(), tp.sequence_parallel));
  std::unique_ptr<GptModel> m(new GptModel(config, tp, std::move(chunks)));
  m->padded_vocab_ =
      PaddedVocabSize(config.vocab_size, config.make_vocab_size_divisible_by, tp.size());
  std::vector<ParamSpec> specs;
  bool has_embedding = false, has_final_norm = false;
  for (const ChunkSpec& c : m->chunks_) {
    if (c.first_layer < 0 || c.num_layers < 0 || c.first_layer + c.num_layers > config.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("chunk layers [", c.first_layer, ", ",
                                                     c.first_layer + c.num_layers,
                                                     ") outside --num-layers ", config.num_layers));
    }
    // The tied output layer needs the token table too: a last stage holds its
    // own copy (same name, same initial values), whose gradient the trainer
    // all-reduces with the first stage's.
    if ((c.pre_process || c.post_process) && !has_embedding) {
      for (ParamSpec& s : EmbeddingParamSpecs(config, tp.size())) {
        // A stage without the input embedding needs no position table.
        if (c.pre_process || s.name == kWordEmbedding) specs.push_back(s);
      }
      has_embedding = true;
    }
    for (int64_t l = c.first_layer; l < c.first_layer + c.num_layers; ++l) {
      for (ParamSpec& s : BlockParamSpecs(config, l)) specs.push_back(s);
    }
    if (c.post_process && !has_final_norm) {
      for (ParamSpec& s : FinalNormParamSpecs(config)) specs.push_back(s);
      has_final_norm = true;
    }
  }
  LOOM_ASSIGN_OR_RETURN(m->params_,
                        ParamBuffer::Create(std::move(specs), tp.rank(), tp.size(), config.seed,
                                            buffer_multiple, config.device, config.compute_dtype));
  for (const ChunkSpec& c : m->chunks_) {
    std::vector<std::unique_ptr<TransformerBlock>> blocks;
    for (int64_t l = c.first_layer; l < c.first_layer + c.num_layers; ++l) {
      blocks.push_back(std::make_unique<TransformerBlock>(&m->params_, config, l, tp));
    }
    m->blocks_.push_back(std::move(blocks));
  }
  return m;
}

absl::StatusOr<Tensor> GptModel::Forward(int c, const Tensor& input, const Tensor& targets,
                                         const DropoutStream& dropout, Saved* saved,
                                         double* loss) const {
  if (c < 0 || c >= static_cast<int>(chunks_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("GptModel: no chunk ", c));
  }
  const ChunkSpec& chunk = chunks_[c];
  Tensor x = input;
  if (chunk.pre_process) {
    if (input.rank() != 2 || input.dim(0) != config_.seq_length) {
      return absl::InvalidArgumentError(absl::StrCat("GptModel: token ids ", input.DebugString(),
                                                     ", expected i32[", config_.seq_length,
                                                     ", b] (--seq-length)"));
    }
    Param* word = const_cast<Param*>(&params_.at(kWordEmbedding));
    const Param& pos = params_.at(kPositionEmbedding);
    VocabParallelEmbedding embedding(word, tp_);
    LOOM_ASSIGN_OR_RETURN(x, embedding.Forward(input, &saved->embedding));  // [s(/p), b, h]
    // Position embeddings of this rank's rows of the sequence: a lookup of
    // the position table at ids s0 + i, added (runs on x's device).
    LOOM_ASSIGN_OR_RETURN(Tensor positions, PositionIds(tp_, x));
    LOOM_ASSIGN_OR_RETURN(Tensor pos_rows, Tensor::Empty(x.shape(), x.dtype(), x.device()));
    LOOM_RETURN_IF_ERROR(core::ops::EmbeddingForward(positions, pos.value, &pos_rows));
    LOOM_RETURN_IF_ERROR(core::ops::Add(x, pos_rows, &x));
    LOOM_RETURN_IF_ERROR(
        HiddenDropout(&x, dropout, DropoutSite(dropout.stream, kEmbeddingLayer, 0), tp_, false));
  }
  saved->blocks.resize(blocks_[c].size());
  for (size_t i = 0; i < blocks_[c].size(); ++i) {
    LOOM_ASSIGN_OR_RETURN(x, blocks_[c][i]->Forward(x, dropout, &saved->blocks[i]));
  }
  if (!chunk.post_process) return x;

  LayerNorm final_norm(const_cast<Param*>(&params_.at("final_layernorm.weight")),
                       const_cast<Param*>(&params_.at("final_layernorm.bias")),
                       config_.layernorm_epsilon);
  LOOM_ASSIGN_OR_RETURN(x, final_norm.Forward(x, &saved->final_norm));
  // Tied output layer: logits = X·Eᵀ, column-parallel over the vocabulary.
  ColumnParallelLinear output(const_cast<Param*>(&params_.at(kWordEmbedding)), nullptr, tp_);
  LOOM_ASSIGN_OR_RETURN(Tensor logits, output.Forward(x, &saved->output));  // [s, b, V/p]
  VocabParallelCrossEntropy ce(tp_, config_.vocab_size);
  LOOM_RETURN_IF_ERROR(ce.ForwardOnDevice(logits, targets, &saved->loss));
  if (loss != nullptr) {
    LOOM_ASSIGN_OR_RETURN(*loss, LossOf(saved->loss.sums));
  }
  return Tensor();
}

absl::StatusOr<double> GptModel::LossOf(const Tensor& loss_sums) {
  return VocabParallelCrossEntropy::MeanLoss(loss_sums);
}

absl::StatusOr<Tensor> GptModel::Backward(int c, const Tensor& dy, float dloss,
                                          const DropoutStream& dropout, const Saved& saved) const {
  const ChunkSpec& chunk = chunks_[c];
  Tensor d = dy;
  if (chunk.post_process) {
    VocabParallelCrossEntropy ce(tp_, config_.vocab_size);
    LOOM_ASSIGN_OR_RETURN(Tensor dlogits, ce.Backward(saved.loss, dloss));
    ColumnParallelLinear output(const_cast<Param*>(&params_.at(kWordEmbedding)), nullptr, tp_);
    LOOM_ASSIGN_OR_RETURN(d, output.Backward(dlogits, saved.output));
    LayerNorm final_norm(const_cast<Param*>(&params_.at("final_layernorm.weight")),
                         const_cast<Param*>(&params_.at("final_layernorm.bias")),
                         config_.layernorm_epsilon);
    LOOM_ASSIGN_OR_RETURN(d, final_norm.Backward(d, saved.final_norm));
  }
  if (!d.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptModel::Backward of chunk ", c, ": no output gradient given"));
  }
  for (size_t i = blocks_[c].size(); i-- > 0;) {
    LOOM_ASSIGN_OR_RETURN(d, blocks_[c][i]->Backward(d, dropout, saved.blocks[i]));
    if (layer_grad_hook_) layer_grad_hook_(chunks_[c].first_layer + static_cast<int64_t>(i));
  }
  if (!chunk.pre_process) return d;

  LOOM_RETURN_IF_ERROR(
      HiddenDropout(&d, dropout, DropoutSite(dropout.stream, kEmbeddingLayer, 0), tp_, true));
  Param* pos = const_cast<Param*>(&params_.at(kPositionEmbedding));
  LOOM_ASSIGN_OR_RETURN(Tensor positions, PositionIds(tp_, d));
  LOOM_RETURN_IF_ERROR(core::ops::EmbeddingBackward(positions, d, &pos->grad));
  VocabParallelEmbedding embedding(const_cast<Param*>(&params_.at(kWordEmbedding)), tp_);
  LOOM_RETURN_IF_ERROR(embedding.Backward(d, saved.embedding));
  return Tensor();
}

absl::StatusOr<Tensor> GptModel::GatherLogits(const Saved& saved) const {
  if (!saved.loss.logits.defined()) {
    return absl::FailedPreconditionError("GatherLogits: no post-process forward was saved");
  }
  LOOM_ASSIGN_OR_RETURN(Tensor full, GatherLastDim(tp_, saved.loss.logits));  // [s, b, Vpad]
  const int64_t s = full.dim(0), b = full.dim(1), vp = full.dim(2), v = config_.vocab_size;
  // Drop the padded vocabulary columns on the host (tests and generation only).
  LOOM_ASSIGN_OR_RETURN(Tensor host, full.To(core::Device::CPU()));
  LOOM_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(Shape{s, b, v}, host.dtype()));
  const size_t row_bytes = static_cast<size_t>(v) * core::DTypeSize(host.dtype());
  const size_t padded_row_bytes = static_cast<size_t>(vp) * core::DTypeSize(host.dtype());
  for (int64_t r = 0; r < s * b; ++r) {
    std::memcpy(static_cast<char*>(out.raw_data()) + r * row_bytes,
                static_cast<const char*>(host.raw_data()) + r * padded_row_bytes, row_bytes);
  }
  if (out.dtype() == core::DType::kF32) return out;
  LOOM_ASSIGN_OR_RETURN(Tensor f32, Tensor::Empty(out.shape(), core::DType::kF32));
  LOOM_RETURN_IF_ERROR(core::ops::Convert(out, &f32));  // bf16 logits, for the caller in f32
  return f32;
}

std::pair<int64_t, int64_t> GptModel::LayerRange(int64_t layer) const {
  const std::string prefix = absl::StrCat("layers.", layer, ".");
  int64_t begin = -1, end = -1;
  for (const Param& p : params_.params()) {
    if (p.spec->name.rfind(prefix, 0) != 0) continue;
    begin = begin < 0 ? p.offset : std::min(begin, p.offset);
    end = std::max(end, p.offset + p.value.numel());
  }
  return {begin, end};
}

absl::Status GptModel::ReduceSequenceParallelGrads() {
  if (!tp_.sequence_parallel || !tp_.parallel()) return absl::OkStatus();
  std::vector<comm::WorkPtr> works;
  for (Param& p : params_.params()) {
    if (p.spec->sequence_parallel_grad) works.push_back(tp_.comm->AllReduce(p.grad, comm::ReduceOp::kSum));
  }
  return comm::WaitAllOnStream(works);
}

}  // namespace loom::layers
