#include "models/gpt/gpt_model.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/ops/ops.h"
#include "core/status_macros.h"
#include "layers/mappings.h"

namespace loom::layers {

using core::Shape;
using core::Tensor;

namespace {

constexpr int64_t kEmbeddingLayer = -1;  // dropout stream of the embedding

int64_t Bytes(const Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }

// ids[i, j] = the global position of row i for x = [s_local, b, h]: this
// rank's rows of the sequence (SP: its block of them; CP: at its chunks'
// positions; packed documents: their position ids there), made on the host
// and moved to x's device.
absl::StatusOr<Tensor> PositionIds(const TpGroup& tp, const CpGroup& cp, const Tensor& x,
                                   const PackedDocuments* documents) {
  const int64_t s_local = x.dim(0), b = x.dim(1);
  LOOM_ASSIGN_OR_RETURN(Tensor ids, Tensor::Empty(Shape{s_local, b}, core::DType::kI32));
  int32_t* p = ids.data<int32_t>();
  for (const RowRun& run : ActivationRowRuns(tp, cp, s_local)) {
    for (int64_t i = 0; i < run.count; ++i) {
      const int64_t row = run.local_first + i;
      const int64_t g = run.global_first + i;
      for (int64_t j = 0; j < b; ++j) {
        p[row * b + j] = documents != nullptr && !documents->position.empty()
                             ? documents->position[j * documents->seq_len + g]
                             : static_cast<int32_t>(g);
      }
    }
  }
  if (x.device().is_cpu()) return ids;
  return ids.To(x.device());
}

}  // namespace

std::vector<BlockRun> RecomputePlan(const GptConfig& c, int64_t n) {
  std::vector<BlockRun> runs;
  const int64_t per = std::max<int64_t>(1, c.recompute_num_layers);
  for (int64_t i = 0; i < n;) {
    BlockRun r{i, 1, false};
    if (c.recompute_full() && c.recompute_method == RecomputeMethod::kUniform) {
      r = {i, std::min(per, n - i), true};
    } else if (c.recompute_full() && c.recompute_method == RecomputeMethod::kBlock) {
      r.recompute = i < c.recompute_num_layers;
    }
    runs.push_back(r);
    i += r.count;
  }
  return runs;
}

int64_t GptModel::Saved::ActivationBytes() const {
  int64_t n = Bytes(ids);
  for (const Tensor& t : recompute_inputs) n += Bytes(t);
  for (const auto& b : blocks) {
    n += Bytes(b.ln1.input) + Bytes(b.ln1.mean) + Bytes(b.ln1.rstd) + Bytes(b.ln2.input) +
         Bytes(b.ln2.mean) + Bytes(b.ln2.rstd) + Bytes(b.attention.qkv_in.input) +
         Bytes(b.attention.qkv) + Bytes(b.attention.lse) + Bytes(b.attention.probs) + Bytes(b.attention.proj_in.input) +
         Bytes(b.mlp.up_in.input) + Bytes(b.mlp.pre_gelu) + Bytes(b.mlp.down_in.input) +
         Bytes(b.attention.gather_ids) + Bytes(b.attention.table_ids) + b.moe.Bytes();
  }
  return n + Bytes(final_norm.input) + Bytes(output.input) + Bytes(loss.logits) +
         weight_grads.bytes();
}

absl::StatusOr<std::unique_ptr<GptModel>> GptModel::Create(const GptConfig& config, TpGroup tp) {
  return Create(config, tp, {ChunkSpec{0, config.num_layers, true, true}});
}

absl::StatusOr<std::unique_ptr<GptModel>> GptModel::Create(const GptConfig& config, TpGroup tp,
                                                           std::vector<ChunkSpec> chunks,
                                                           int64_t buffer_multiple) {
  return Create(config, tp, CpGroup{}, std::move(chunks), buffer_multiple);
}

absl::StatusOr<std::unique_ptr<GptModel>> GptModel::Create(const GptConfig& config, TpGroup tp,
                                                           CpGroup cp,
                                                           std::vector<ChunkSpec> chunks,
                                                           int64_t buffer_multiple, EpGroup ep) {
  LOOM_RETURN_IF_ERROR(
      ValidateLayout(config, tp.size(), tp.sequence_parallel, 1, 1, cp.size()));
  if (ep.parallel() && (!config.moe() || config.num_experts % ep.size() != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--expert-model-parallel-size (", ep.size(), ") must divide --num-experts (",
        config.num_experts, ")"));
  }
  if (cp.parallel() && !config.device.is_cpu()) {
    return absl::UnimplementedError(absl::StrCat(
        "--context-parallel-size ", cp.size(), " runs on --device=cpu only: the ring attention "
        "uses the CPU flash blocks (a device ring is not built yet)"));
  }
  std::unique_ptr<GptModel> m(new GptModel(config, tp, cp, ep, std::move(chunks)));
  m->padded_vocab_ =
      PaddedVocabSize(config.vocab_size, config.make_vocab_size_divisible_by, tp.size());
  std::vector<ParamSpec> specs;
  bool has_pre = false, has_post = false;
  for (const ChunkSpec& c : m->chunks_) {
    if (c.first_layer < 0 || c.num_layers < 0 || c.first_layer + c.num_layers > config.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("chunk layers [", c.first_layer, ", ",
                                                     c.first_layer + c.num_layers,
                                                     ") outside --num-layers ", config.num_layers));
    }
    has_pre |= c.pre_process;
    has_post |= c.post_process;
  }
  // Flat-buffer order: embedding, the layers in chunk order, final norm,
  // untied output layer. The tied output layer needs the token table too: a
  // last stage holds its own copy (same name, same initial values) and no
  // position table.
  const bool tied = config.tied_output_layer();
  if (has_pre || (has_post && tied)) {
    for (ParamSpec& s : EmbeddingParamSpecs(config, tp.size())) {
      if (has_pre || s.name == kWordEmbeddingName) specs.push_back(s);
    }
  }
  for (const ChunkSpec& c : m->chunks_) {
    for (int64_t l = c.first_layer; l < c.first_layer + c.num_layers; ++l) {
      for (ParamSpec& s : BlockParamSpecs(config, l, ep.shard())) specs.push_back(s);
    }
  }
  if (has_post) {
    for (ParamSpec& s : FinalNormParamSpecs(config)) specs.push_back(s);
    for (ParamSpec& s : OutputLayerParamSpecs(config, tp.size())) specs.push_back(s);
  }
  LOOM_ASSIGN_OR_RETURN(m->params_,
                        ParamBuffer::Create(std::move(specs), tp.rank(), tp.size(), config.seed,
                                            buffer_multiple, config.device, config.compute_dtype,
                                            config.allocate_gradients,
                                            config.allocate_parameters));
  m->word_embedding_ = m->params_.Find(kWordEmbeddingName);
  m->position_embedding_ = m->params_.Find(kPositionEmbeddingName);
  m->output_layer_weight_ = m->params_.Find(kOutputLayerName);
  m->has_pre_ = has_pre;
  if (has_post && !has_pre && tied) m->params_.at(m->word_embedding_).tied_copy = true;
  LOOM_RETURN_IF_ERROR(m->BuildLayers());
  return m;
}

absl::Status GptModel::BuildLayers() {
  const std::string prefix_of_layer = "layers.";
  auto handles_with_prefix = [&](const std::string& prefix) {
    std::vector<ParamHandle> out;
    for (size_t i = 0; i < params_.params().size(); ++i) {
      if (params_.params()[i].spec->name.rfind(prefix, 0) == 0) out.push_back({static_cast<int>(i)});
    }
    return out;
  };
  if (has_pre_) {
    embedding_.emplace(&params_.at(word_embedding_), tp_);
    std::vector<ParamHandle> unit = {word_embedding_};
    if (position_embedding_.valid()) unit.push_back(position_embedding_);
    units_.push_back({kEmbeddingUnit, unit});
  }
  for (const ChunkSpec& c : chunks_) {
    std::vector<std::unique_ptr<TransformerBlock>> blocks;
    for (int64_t l = c.first_layer; l < c.first_layer + c.num_layers; ++l) {
      blocks.push_back(std::make_unique<TransformerBlock>(&params_, config_, l, tp_, cp_, ep_));
      units_.push_back({l, handles_with_prefix(absl::StrCat(prefix_of_layer, l, "."))});
    }
    blocks_.push_back(std::move(blocks));
    runs_.push_back(RecomputePlan(config_, c.num_layers));
  }
  const ParamHandle norm_w = params_.Find(kFinalNormWeightName);
  const ParamHandle norm_b = params_.Find(kFinalNormBiasName);
  if (norm_w.valid()) {
    if (config_.rms_norm()) {
      final_norm_.emplace(LayerNorm::Rms(&params_.at(norm_w), config_.layernorm_epsilon));
    } else {
      final_norm_.emplace(&params_.at(norm_w), &params_.at(norm_b), config_.layernorm_epsilon);
    }
    // Output layer: logits = X·Eᵀ, column-parallel over the vocabulary, E the
    // word embedding (tied) or output_layer.weight.
    const ParamHandle out = config_.tied_output_layer() ? word_embedding_ : output_layer_weight_;
    output_layer_.emplace(&params_.at(out), nullptr, tp_);
    std::vector<ParamHandle> unit = {norm_w};
    if (norm_b.valid()) unit.push_back(norm_b);
    unit.push_back(out);
    units_.push_back({head_unit(), unit});
  }
  return absl::OkStatus();
}

Shape GptModel::BoundaryShape(int64_t micro_batch_size) const {
  const int64_t local = local_seq_length();  // this CP rank's two chunks
  const int64_t s = tp_.sequence_parallel && tp_.parallel() ? local / tp_.size() : local;
  return Shape{s, micro_batch_size, config_.hidden_size};
}

core::DType GptModel::boundary_dtype() const {
  return config_.device.is_cpu() ? core::DType::kF32 : config_.compute_dtype;
}

absl::StatusOr<Tensor> GptModel::Forward(int c, const Tensor& input, const Tensor& targets,
                                         const DropoutStream& dropout, Activations* activations,
                                         double* loss) {
  if (c < 0 || c >= static_cast<int>(chunks_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("GptModel: no chunk ", c));
  }
  Saved* const saved = dynamic_cast<Saved*>(activations);
  if (saved == nullptr) {
    return absl::InvalidArgumentError(
        "GptModel::Forward: the activations are not a GptModel::Saved (use NewActivations())");
  }
  const ChunkSpec& chunk = chunks_[c];
  Tensor x = input;
  if (chunk.pre_process) {
    if (input.rank() != 2 || input.dim(0) != local_seq_length()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GptModel: token ids ", input.DebugString(), ", expected i32[", local_seq_length(),
          ", b] (--seq-length", cp_.parallel() ? " / --context-parallel-size" : "", ")"));
    }
    LOOM_RETURN_IF_ERROR(Notify(UnitEvent::kBeforeForward, kEmbeddingUnit));
    LOOM_ASSIGN_OR_RETURN(x, embedding_->Forward(input, &saved->embedding));  // [s(/p), b, h]
    if (position_embedding_.valid()) {
      // Position embeddings of this rank's rows of the sequence: a lookup of
      // the position table at ids s0 + i, added (runs on x's device). RoPE
      // has no table: the attention rotates q and k instead.
      LOOM_ASSIGN_OR_RETURN(Tensor positions,
                            PositionIds(tp_, cp_, x, dropout.documents.get()));
      LOOM_ASSIGN_OR_RETURN(Tensor pos_rows, Tensor::Empty(x.shape(), x.dtype(), x.device()));
      LOOM_RETURN_IF_ERROR(
          core::ops::EmbeddingForward(positions, params_.at(position_embedding_).value, &pos_rows));
      LOOM_RETURN_IF_ERROR(core::ops::Add(x, pos_rows, &x));
    }
    LOOM_RETURN_IF_ERROR(
        HiddenDropout(&x, dropout, DropoutSite(dropout.stream, kEmbeddingLayer, 0), tp_, cp_,
                     false));
    LOOM_RETURN_IF_ERROR(Notify(UnitEvent::kAfterForward, kEmbeddingUnit));
  }
  saved->blocks.resize(blocks_[c].size());
  saved->recompute_inputs.resize(blocks_[c].size());
  for (const BlockRun& run : runs_[c]) {
    // A recomputed run keeps its input only; each block's Saved is dropped
    // as soon as the next block has run.
    if (run.recompute) saved->recompute_inputs[run.first] = x;
    for (int64_t i = run.first; i < run.first + run.count; ++i) {
      LOOM_RETURN_IF_ERROR(Notify(UnitEvent::kBeforeForward, chunk.first_layer + i));
      TransformerBlock::Saved scratch;
      LOOM_ASSIGN_OR_RETURN(
          x, blocks_[c][i]->Forward(x, dropout, run.recompute ? &scratch : &saved->blocks[i]));
      LOOM_RETURN_IF_ERROR(Notify(UnitEvent::kAfterForward, chunk.first_layer + i));
    }
  }
  if (!chunk.post_process) return x;

  LOOM_RETURN_IF_ERROR(Notify(UnitEvent::kBeforeForward, head_unit()));
  LOOM_ASSIGN_OR_RETURN(x, final_norm_->Forward(x, &saved->final_norm));
  LOOM_ASSIGN_OR_RETURN(Tensor logits, output_layer_->Forward(x, &saved->output));  // [s, b, V/p]
  LOOM_RETURN_IF_ERROR(loss_.ForwardOnDevice(logits, targets, &saved->loss));
  LOOM_RETURN_IF_ERROR(WeighLoss(dropout.documents.get(), saved));
  LOOM_RETURN_IF_ERROR(Notify(UnitEvent::kAfterForward, head_unit()));
  if (loss != nullptr) {
    LOOM_ASSIGN_OR_RETURN(*loss, LossOf(saved->DeviceLoss()));
  }
  return Tensor();
}

absl::Status GptModel::WeighLoss(const PackedDocuments* documents, Saved* saved) const {
  saved->loss_weight = saved->weighted_sums = Tensor();
  if (documents == nullptr || documents->loss_weight.empty()) return absl::OkStatus();
  const Tensor& sums = saved->loss.sums;  // [2, s·b], rows in [s, b] order
  const int64_t b = documents->batch, n = sums.dim(1), s = n / b;
  if (s * cp_.size() != documents->seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GptModel: a loss mask for [", b, " rows, ", documents->seq_len,
        " positions] does not fit the loss rows ", sums.DebugString()));
  }
  // Made on the host, then on the loss's device (one copy per micro-batch).
  Tensor host;
  LOOM_ASSIGN_OR_RETURN(host, Tensor::Empty(Shape{n}, core::DType::kF32));
  float* w = host.data<float>();
  for (const RowRun& run : ActivationRowRuns(TpGroup{}, cp_, s)) {
    for (int64_t i = 0; i < run.count; ++i) {
      for (int64_t j = 0; j < b; ++j) {
        w[(run.local_first + i) * b + j] =
            documents->loss_weight[j * documents->seq_len + run.global_first + i];
      }
    }
  }
  const core::Device device = sums.device();
  if (device.is_cpu()) {
    saved->loss_weight = host;
  } else {
    LOOM_ASSIGN_OR_RETURN(saved->loss_weight, host.To(device));
  }
  LOOM_ASSIGN_OR_RETURN(saved->weighted_sums, Tensor::Empty(Shape{3, n}, core::DType::kF32, device));
  LOOM_ASSIGN_OR_RETURN(Tensor ws_sums, saved->weighted_sums.Narrow(0, 2));
  LOOM_ASSIGN_OR_RETURN(Tensor ws_weight, saved->weighted_sums.Narrow(2, 1));
  LOOM_RETURN_IF_ERROR(core::ops::Copy(sums, &ws_sums));
  return core::ops::Copy(saved->loss_weight, &ws_weight);
}

namespace {

// dlogits [s, b, V/p] with row r (of the s·b) times weight[r], in place: on
// the CPU in f32; on a device through the combine of one "expert" per row
// (MoeCombineForward: y_r = weight_r · dlogits_r, the product in f32 rounded
// once to dlogits' dtype), kWeighRows rows at a time into a scratch copied
// back, so the weighing holds those rows more, not a second dlogits.
constexpr int64_t kWeighRows = 1024;

absl::Status WeighRows(const Tensor& weight, Tensor* dlogits) {
  const int64_t rows = weight.numel(), v = dlogits->numel() / rows;
  if (dlogits->device().is_cpu()) {
    float* g = dlogits->data<float>();
    for (int64_t r = 0; r < rows; ++r) {
      const float w = weight.data<float>()[r];
      for (int64_t j = 0; j < v; ++j) g[r * v + j] *= w;
    }
    return absl::OkStatus();
  }
  const core::Device device = dlogits->device();
  const int64_t chunk = std::min(rows, kWeighRows);
  LOOM_ASSIGN_OR_RETURN(Tensor ids, Tensor::Empty(Shape{chunk, 1}, core::DType::kI32));
  for (int64_t r = 0; r < chunk; ++r) ids.data<int32_t>()[r] = static_cast<int32_t>(r);
  LOOM_ASSIGN_OR_RETURN(ids, ids.To(device));
  LOOM_ASSIGN_OR_RETURN(const Tensor g, dlogits->Reshape(Shape{rows, v}));
  LOOM_ASSIGN_OR_RETURN(const Tensor w, weight.Reshape(Shape{rows, 1}));
  LOOM_ASSIGN_OR_RETURN(const Tensor scratch, Tensor::Empty(Shape{chunk, v}, g.dtype(), device));
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    LOOM_ASSIGN_OR_RETURN(Tensor part, g.Narrow(r0, n));
    LOOM_ASSIGN_OR_RETURN(const Tensor prob, w.Narrow(r0, n));
    LOOM_ASSIGN_OR_RETURN(const Tensor row, ids.Narrow(0, n));
    LOOM_ASSIGN_OR_RETURN(Tensor weighed, scratch.Narrow(0, n));
    LOOM_RETURN_IF_ERROR(core::ops::MoeCombineForward(part, prob, row, &weighed));
    LOOM_RETURN_IF_ERROR(core::ops::Copy(weighed, &part));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<double> GptModel::LossOf(const Tensor& loss_sums) const {
  return VocabParallelCrossEntropy::MeanLoss(loss_sums);
}

absl::StatusOr<Tensor> GptModel::Backward(int c, const Tensor& dy, float dloss,
                                          const DropoutStream& dropout,
                                          const Activations& activations) {
  const Saved* const saved = dynamic_cast<const Saved*>(&activations);
  if (saved == nullptr) {
    return absl::InvalidArgumentError(
        "GptModel::Backward: the activations are not a GptModel::Saved (use NewActivations())");
  }
  return BackwardChunk(c, dy, dloss, dropout, *saved, nullptr);
}

absl::StatusOr<Tensor> GptModel::BackwardInput(int c, const Tensor& dy, float dloss,
                                               const DropoutStream& dropout,
                                               Activations& activations) {
  Saved* const saved = dynamic_cast<Saved*>(&activations);
  if (saved == nullptr) {
    return absl::InvalidArgumentError(
        "GptModel::BackwardInput: the activations are not a GptModel::Saved");
  }
  if (saved->weight_grads_pending) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GptModel::BackwardInput of chunk ", c, " twice without its BackwardWeight"));
  }
  LOOM_ASSIGN_OR_RETURN(Tensor dx,
                        BackwardChunk(c, dy, dloss, dropout, *saved, &saved->weight_grads));
  saved->weight_grads_pending = true;
  return dx;
}

absl::Status GptModel::BackwardWeight(int c, const DropoutStream& dropout,
                                      Activations& activations) {
  (void)dropout;  // the weight gradients draw no masks: BackwardInput applied them
  Saved* const saved = dynamic_cast<Saved*>(&activations);
  if (saved == nullptr) {
    return absl::InvalidArgumentError(
        "GptModel::BackwardWeight: the activations are not a GptModel::Saved");
  }
  if (!saved->weight_grads_pending) {
    return absl::FailedPreconditionError(
        absl::StrCat("GptModel::BackwardWeight of chunk ", c, " before its BackwardInput"));
  }
  saved->weight_grads_pending = false;
  // Unit by unit in the backward's order: its deferred GEMMs, then its
  // AfterBackward (its gradients are all in: GradientSync may reduce them).
  return saved->weight_grads.Run(
      [this](int64_t unit) { return Notify(UnitEvent::kAfterBackward, unit); });
}

absl::Status GptModel::UnitBackwardDone(int64_t unit, WeightGradStore* defer) const {
  if (defer == nullptr) return Notify(UnitEvent::kAfterBackward, unit);
  defer->EndUnit(unit);
  return absl::OkStatus();
}

absl::StatusOr<Tensor> GptModel::BackwardChunk(int c, const Tensor& dy, float dloss,
                                               const DropoutStream& dropout, const Saved& saved,
                                               WeightGradStore* defer) {
  if (c < 0 || c >= static_cast<int>(chunks_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("GptModel: no chunk ", c));
  }
  // The layers' weight-gradient GEMMs go into `defer` (a split backward's
  // BackwardInput) or run now (null).
  DeferWeightGrads scope(defer);
  const ChunkSpec& chunk = chunks_[c];
  Tensor d = dy;
  if (chunk.post_process) {
    LOOM_RETURN_IF_ERROR(Notify(UnitEvent::kBeforeBackward, head_unit()));
    LOOM_ASSIGN_OR_RETURN(Tensor dlogits, loss_.Backward(saved.loss, dloss));
    if (saved.loss_weight.defined()) {  // each row's share of the mean
      LOOM_RETURN_IF_ERROR(WeighRows(saved.loss_weight, &dlogits));
    }
    LOOM_ASSIGN_OR_RETURN(d, output_layer_->Backward(dlogits, saved.output));
    LOOM_ASSIGN_OR_RETURN(d, final_norm_->Backward(d, saved.final_norm));
    LOOM_RETURN_IF_ERROR(UnitBackwardDone(head_unit(), defer));
  }
  if (!d.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptModel::Backward of chunk ", c, ": no output gradient given"));
  }
  for (auto run = runs_[c].rbegin(); run != runs_[c].rend(); ++run) {
    if (!run->recompute) {
      LOOM_RETURN_IF_ERROR(Notify(UnitEvent::kBeforeBackward, chunk.first_layer + run->first));
      LOOM_ASSIGN_OR_RETURN(
          d, blocks_[c][run->first]->Backward(d, dropout, saved.blocks[run->first], dloss));
      LOOM_RETURN_IF_ERROR(UnitBackwardDone(chunk.first_layer + run->first, defer));
      continue;
    }
    // Full recomputation: the run's forward again from its kept input, the
    // same dropout stream drawing the same masks, then its backward; each
    // block's Saved goes as soon as its backward has run.
    if (saved.recompute_inputs.size() != blocks_[c].size() ||
        !saved.recompute_inputs[run->first].defined()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "GptModel::Backward of chunk ", c, ": no kept input for recomputed layers [",
          chunk.first_layer + run->first, ", ", chunk.first_layer + run->first + run->count,
          ") (a Saved from a forward with another recomputation setting?)"));
    }
    // Every unit of the run is in its backward from here: the recomputed
    // forward reads all their parameters.
    for (int64_t k = run->count; k-- > 0;) {
      LOOM_RETURN_IF_ERROR(Notify(UnitEvent::kBeforeBackward, chunk.first_layer + run->first + k));
    }
    std::vector<TransformerBlock::Saved> again(run->count);
    Tensor x = saved.recompute_inputs[run->first];
    for (int64_t k = 0; k < run->count; ++k) {
      LOOM_ASSIGN_OR_RETURN(x, blocks_[c][run->first + k]->Forward(x, dropout, &again[k]));
    }
    x = Tensor();  // the run's output: not needed by its backward
    for (int64_t k = run->count; k-- > 0;) {
      LOOM_ASSIGN_OR_RETURN(d, blocks_[c][run->first + k]->Backward(d, dropout, again[k], dloss));
      again[k] = TransformerBlock::Saved();
      LOOM_RETURN_IF_ERROR(UnitBackwardDone(chunk.first_layer + run->first + k, defer));
    }
  }
  if (!chunk.pre_process) return d;

  LOOM_RETURN_IF_ERROR(Notify(UnitEvent::kBeforeBackward, kEmbeddingUnit));
  LOOM_RETURN_IF_ERROR(
      HiddenDropout(&d, dropout, DropoutSite(dropout.stream, kEmbeddingLayer, 0), tp_, cp_,
                     true));
  if (position_embedding_.valid()) {
    LOOM_ASSIGN_OR_RETURN(Tensor positions, PositionIds(tp_, cp_, d, dropout.documents.get()));
    LOOM_RETURN_IF_ERROR(
        core::ops::EmbeddingBackward(positions, d, &params_.at(position_embedding_).grad));
  }
  // The word table's gradient (a scatter-add: the embedding's weight
  // gradient) now or at BackwardWeight, after the output layer's, in the
  // fused backward's order for a tied embedding. With SP its all-gather of d
  // then runs at BackwardWeight (every TP rank runs the same W).
  LOOM_RETURN_IF_ERROR(WeightGradStore::RunOrDefer(
      [this, d, ids = saved.embedding]() { return embedding_->Backward(d, ids); },
      static_cast<int64_t>(d.nbytes())));
  LOOM_RETURN_IF_ERROR(UnitBackwardDone(kEmbeddingUnit, defer));
  return Tensor();
}

absl::StatusOr<Tensor> GptModel::GatherLogits(const Activations& activations) const {
  const Saved& saved = static_cast<const Saved&>(activations);  // NewActivations() made it
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

}  // namespace loom::layers
