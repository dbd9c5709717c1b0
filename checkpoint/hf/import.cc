#include "checkpoint/hf/import.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/convert.h"
#include "checkpoint/file_util.h"
#include "checkpoint/rank_state.h"
#include "checkpoint/writer.h"
#include "core/status_macros.h"

namespace loom::checkpoint::hf {
namespace {

std::string ShapeString(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ", "), "]");
}

// The HF tensors by name, each taken at most once.
class Source {
 public:
  Source(const TensorSet& set, const std::string& dir) : dir_(dir) {
    for (const NamedTensor& t : set.tensors) by_name_[t.name] = &t;
  }
  bool Has(const std::string& name) const { return by_name_.count(name) > 0; }
  absl::StatusOr<std::vector<float>> Take(const std::string& name,
                                          const std::vector<int64_t>& shape) {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) {
      return absl::NotFoundError(
          absl::StrCat("Hugging Face model ", dir_, " has no tensor ", name));
    }
    if (it->second->shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Hugging Face tensor ", name, " in ", dir_, " has shape ", ShapeString(it->second->shape),
          " but the config.json makes it ", ShapeString(shape)));
    }
    taken_.insert(name);
    return it->second->ToF32();
  }
  // Tensors nobody took, other than buffers that hold no parameters.
  absl::Status CheckAllTaken() const {
    for (const auto& [name, t] : by_name_) {
      if (taken_.count(name)) continue;
      if (absl::EndsWith(name, ".attn.bias") || absl::EndsWith(name, ".attn.masked_bias") ||
          absl::EndsWith(name, "rotary_emb.inv_freq")) {
        continue;
      }
      return absl::InvalidArgumentError(absl::StrCat("Hugging Face tensor ", name, " in ", dir_,
                                                     " has no place in the Loom model"));
    }
    return absl::OkStatus();
  }

 private:
  std::string dir_;
  std::map<std::string, const NamedTensor*> by_name_;
  std::set<std::string> taken_;
};

std::vector<float> Transpose(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) y[c * rows + r] = x[r * cols + c];
  }
  return y;
}

}  // namespace

layers::GptConfig GptConfigFromHf(const HfModelConfig& hf, int64_t seq_length) {
  layers::GptConfig c;
  c.num_layers = hf.num_layers;
  c.hidden_size = hf.hidden_size;
  c.num_attention_heads = hf.num_attention_heads;
  c.ffn_hidden_size = hf.ffn_hidden_size;
  c.max_position_embeddings = hf.max_position_embeddings;
  c.seq_length = seq_length > 0 ? seq_length : std::min<int64_t>(hf.max_position_embeddings, 1024);
  c.vocab_size = hf.vocab_size;
  c.layernorm_epsilon = static_cast<float>(hf.norm_epsilon);
  c.normalization = hf.normalization;
  c.position_embedding_type = hf.position_embedding_type;
  c.rotary_base = static_cast<float>(hf.rotary_base);
  c.rotary_percent = static_cast<float>(hf.rotary_percent);
  c.swiglu = hf.swiglu;
  c.group_query_attention = hf.group_query_attention;
  if (hf.group_query_attention) c.num_query_groups = hf.num_query_groups;
  c.untie_embeddings_and_output_weights = hf.untie_embeddings_and_output_weights;
  c.add_bias_linear = hf.add_bias_linear;
  if (hf.num_experts > 0) {  // Mixtral: every layer MoE, dropless (capacity 0)
    c.num_experts = hf.num_experts;
    c.moe_router_topk = hf.moe_router_topk;
    c.moe_layer_freq = 1;
    c.moe_aux_loss_coeff = static_cast<float>(hf.moe_aux_loss_coeff);
  }
  return c;
}

absl::StatusOr<std::vector<LoomTensor>> LoomTensorsFromHf(const HfModelConfig& hf,
                                                          const layers::GptConfig& c,
                                                          const TensorSet& tensors) {
  Source src(tensors, hf.path);
  std::vector<LoomTensor> out;
  const int64_t h = c.hidden_size, f = c.ffn(), V = c.vocab_size, H = c.num_attention_heads,
                G = c.query_groups(), d = c.head_dim();
  auto put = [&](std::string name, std::vector<int64_t> shape, std::vector<float> data) {
    out.push_back(LoomTensor{std::move(name), std::move(shape), std::move(data)});
  };
  auto copy = [&](const std::string& hf_name, const std::string& ours,
                  std::vector<int64_t> shape) -> absl::Status {
    LOOM_ASSIGN_OR_RETURN(std::vector<float> x, src.Take(hf_name, shape));
    put(ours, shape, std::move(x));
    return absl::OkStatus();
  };
  if (hf.model_type == "gpt2") {
    const std::string t = src.Has("transformer.wte.weight") ? "transformer." : "";
    // Conv1D [in, out] -> Loom [out, in].
    auto conv = [&](const std::string& hf_name, const std::string& ours, int64_t in,
                    int64_t outs) -> absl::Status {
      LOOM_ASSIGN_OR_RETURN(std::vector<float> x, src.Take(hf_name, {in, outs}));
      put(ours, {outs, in}, Transpose(x, in, outs));
      return absl::OkStatus();
    };
    LOOM_RETURN_IF_ERROR(copy(t + "wte.weight", layers::kWordEmbeddingName, {V, h}));
    LOOM_RETURN_IF_ERROR(
        copy(t + "wpe.weight", layers::kPositionEmbeddingName, {c.max_positions(), h}));
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const std::string q = absl::StrCat(t, "h.", i, "."), p = absl::StrCat("layers.", i, ".");
      LOOM_RETURN_IF_ERROR(copy(q + "ln_1.weight", p + "input_layernorm.weight", {h}));
      LOOM_RETURN_IF_ERROR(copy(q + "ln_1.bias", p + "input_layernorm.bias", {h}));
      LOOM_ASSIGN_OR_RETURN(std::vector<float> cw, src.Take(q + "attn.c_attn.weight", {h, 3 * h}));
      LOOM_ASSIGN_OR_RETURN(std::vector<float> cb, src.Take(q + "attn.c_attn.bias", {3 * h}));
      std::vector<float> w(3 * h * h), b(3 * h);
      for (int64_t j = 0; j < 3 * h; ++j) {
        // HF column j = part * h + head * d + e -> our row head * 3d + part * d + e.
        const int64_t part = j / h, within = j % h;
        const int64_t row = (within / d) * 3 * d + part * d + within % d;
        b[row] = cb[j];
        for (int64_t k = 0; k < h; ++k) w[row * h + k] = cw[k * 3 * h + j];
      }
      put(p + "attention.qkv.weight", {3 * h, h}, std::move(w));
      put(p + "attention.qkv.bias", {3 * h}, std::move(b));
      LOOM_RETURN_IF_ERROR(conv(q + "attn.c_proj.weight", p + "attention.dense.weight", h, h));
      LOOM_RETURN_IF_ERROR(copy(q + "attn.c_proj.bias", p + "attention.dense.bias", {h}));
      LOOM_RETURN_IF_ERROR(copy(q + "ln_2.weight", p + "post_attention_layernorm.weight", {h}));
      LOOM_RETURN_IF_ERROR(copy(q + "ln_2.bias", p + "post_attention_layernorm.bias", {h}));
      LOOM_RETURN_IF_ERROR(conv(q + "mlp.c_fc.weight", p + "mlp.dense_h_to_4h.weight", h, f));
      LOOM_RETURN_IF_ERROR(copy(q + "mlp.c_fc.bias", p + "mlp.dense_h_to_4h.bias", {f}));
      LOOM_RETURN_IF_ERROR(conv(q + "mlp.c_proj.weight", p + "mlp.dense_4h_to_h.weight", f, h));
      LOOM_RETURN_IF_ERROR(copy(q + "mlp.c_proj.bias", p + "mlp.dense_4h_to_h.bias", {h}));
    }
    LOOM_RETURN_IF_ERROR(copy(t + "ln_f.weight", layers::kFinalNormWeightName, {h}));
    LOOM_RETURN_IF_ERROR(copy(t + "ln_f.bias", layers::kFinalNormBiasName, {h}));
  } else {
    // Llama / Mistral / Mixtral: RMSNorm, RoPE, SwiGLU, no biases (hf_config
    // refuses others). A SwiGLU MLP (dense, or one Mixtral expert): [gate; up]
    // -> dense_h_to_4h [2, F·h], down -> dense_4h_to_h.
    auto swiglu = [&](const std::string& gate_name, const std::string& up_name,
                      const std::string& down_name, const std::string& ours) -> absl::Status {
      LOOM_ASSIGN_OR_RETURN(std::vector<float> gate, src.Take(gate_name, {f, h}));
      LOOM_ASSIGN_OR_RETURN(std::vector<float> up, src.Take(up_name, {f, h}));
      gate.insert(gate.end(), up.begin(), up.end());
      put(ours + "dense_h_to_4h.weight", {2, f * h}, std::move(gate));
      return copy(down_name, ours + "dense_4h_to_h.weight", {h, f});
    };
    if (!c.tied_output_layer()) {
      LOOM_RETURN_IF_ERROR(copy("lm_head.weight", layers::kOutputLayerName, {V, h}));
    }
    LOOM_RETURN_IF_ERROR(copy("model.embed_tokens.weight", layers::kWordEmbeddingName, {V, h}));
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const std::string q = absl::StrCat("model.layers.", i, "."),
                        p = absl::StrCat("layers.", i, ".");
      LOOM_RETURN_IF_ERROR(copy(q + "input_layernorm.weight", p + "input_layernorm.weight", {h}));
      LOOM_ASSIGN_OR_RETURN(std::vector<float> wq,
                            src.Take(q + "self_attn.q_proj.weight", {H * d, h}));
      LOOM_ASSIGN_OR_RETURN(std::vector<float> wk,
                            src.Take(q + "self_attn.k_proj.weight", {G * d, h}));
      LOOM_ASSIGN_OR_RETURN(std::vector<float> wv,
                            src.Take(q + "self_attn.v_proj.weight", {G * d, h}));
      std::vector<float> w((H + 2 * G) * d * h);
      for (auto [part, from, count] : {std::tuple{layers::QkvPart::kQuery, &wq, H},
                                       std::tuple{layers::QkvPart::kKey, &wk, G},
                                       std::tuple{layers::QkvPart::kValue, &wv, G}}) {
        for (int64_t j = 0; j < count; ++j) {
          for (int64_t e = 0; e < d; ++e) {
            const int64_t to = layers::QkvWeightRow(c, part, j, e);
            std::copy(from->begin() + (j * d + e) * h, from->begin() + (j * d + e + 1) * h,
                      w.begin() + to * h);
          }
        }
      }
      put(p + "attention.qkv.weight", {(H + 2 * G) * d, h}, std::move(w));
      LOOM_RETURN_IF_ERROR(
          copy(q + "self_attn.o_proj.weight", p + "attention.dense.weight", {h, H * d}));
      LOOM_RETURN_IF_ERROR(
          copy(q + "post_attention_layernorm.weight", p + "post_attention_layernorm.weight", {h}));
      if (c.moe_layer(i)) {
        // Mixtral as save_pretrained writes it (transformers 5 fuses the
        // experts in memory only): w1 gate, w3 up, w2 down.
        const std::string m = q + "block_sparse_moe.";
        LOOM_RETURN_IF_ERROR(
            copy(m + "gate.weight", p + "mlp.router.weight", {c.num_experts, h}));
        for (int64_t e = 0; e < c.num_experts; ++e) {
          const std::string x = absl::StrCat(m, "experts.", e, ".");
          LOOM_RETURN_IF_ERROR(swiglu(x + "w1.weight", x + "w3.weight", x + "w2.weight",
                                      absl::StrCat(p, "mlp.experts.", e, ".")));
        }
      } else {
        LOOM_RETURN_IF_ERROR(swiglu(q + "mlp.gate_proj.weight", q + "mlp.up_proj.weight",
                                    q + "mlp.down_proj.weight", p + "mlp."));
      }
    }
    LOOM_RETURN_IF_ERROR(copy("model.norm.weight", layers::kFinalNormWeightName, {h}));
  }
  // A tied model may still store lm_head: it must be the word embedding.
  if (c.tied_output_layer() && src.Has("lm_head.weight")) {
    LOOM_ASSIGN_OR_RETURN(std::vector<float> head, src.Take("lm_head.weight", {V, h}));
    for (const LoomTensor& t : out) {
      if (t.name == layers::kWordEmbeddingName && t.data != head) {
        return absl::InvalidArgumentError(
            absl::StrCat("Hugging Face tensor lm_head.weight in ", hf.path,
                         " differs from the word embedding, but the config.json ties them "
                         "(tie_word_embeddings)"));
      }
    }
  }
  LOOM_RETURN_IF_ERROR(src.CheckAllTaken());
  return out;
}

absl::Status ImportHuggingFace(const ImportOptions& o) {
  if (o.hf_dir.empty()) return absl::InvalidArgumentError("--hf-dir is required");
  if (o.save_dir.empty()) return absl::InvalidArgumentError("--save is required");
  if (!IsDirectory(o.hf_dir)) {
    return absl::NotFoundError(absl::StrCat("--hf-dir=", o.hf_dir, ": no such folder"));
  }
  LOOM_ASSIGN_OR_RETURN(HfModelConfig hf, ReadHfConfig(JoinPath(o.hf_dir, "config.json")));
  const layers::GptConfig model = GptConfigFromHf(hf, o.seq_length);
  // The target layout, before anything is read or written.
  if (o.target_tp < 1 || o.target_pp < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--target-tensor-parallel-size=", o.target_tp,
                     " and --target-pipeline-parallel-size=", o.target_pp, " must be at least 1"));
  }
  absl::Status layout = layers::ValidateLayout(model, o.target_tp, false, o.target_pp, 1);
  if (!layout.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--target-tensor-parallel-size=", o.target_tp,
                                                   " --target-pipeline-parallel-size=", o.target_pp,
                                                   " do not fit the model in ", hf.path, ": ",
                                                   layout.message()));
  }
  LOOM_ASSIGN_OR_RETURN(TensorSet set, ReadSafetensorsDir(o.hf_dir, ReadOptions{.to_f32 = true}));
  LOOM_ASSIGN_OR_RETURN(std::vector<LoomTensor> loom, LoomTensorsFromHf(hf, model, set));
  set = TensorSet();  // free the HF copy

  // Every parameter of the model (layout 1x1), from the Loom tensors.
  std::map<std::string, const LoomTensor*> by_name;
  for (const LoomTensor& t : loom) by_name[t.name] = &t;
  std::vector<layers::ParamSpec> specs = layers::EmbeddingParamSpecs(model, 1);
  for (int64_t i = 0; i < model.num_layers; ++i) {
    for (auto& s : layers::BlockParamSpecs(model, i)) specs.push_back(s);
  }
  for (auto& s : layers::FinalNormParamSpecs(model)) specs.push_back(s);
  for (auto& s : layers::OutputLayerParamSpecs(model, 1)) specs.push_back(s);
  if (specs.size() != loom.size()) {
    return absl::InternalError(
        absl::StrCat("import made ", loom.size(), " tensors but the model has ", specs.size()));
  }
  std::vector<Piece> pieces;
  for (const layers::ParamSpec& spec : specs) {
    auto it = by_name.find(spec.name);
    if (it == by_name.end()) {
      return absl::InternalError(absl::StrCat("import made no tensor ", spec.name));
    }
    std::vector<int64_t> shape;
    for (int i = 0; i < spec.global_shape.rank(); ++i) shape.push_back(spec.global_shape.dim(i));
    Shard whole;
    MatrixDims(shape, &whole.rows, &whole.cols);
    const Placement pl = PlacementOf(spec, whole);
    if (pl.global_shape != it->second->shape ||
        pl.rect.numel() != static_cast<int64_t>(it->second->data.size())) {
      return absl::InternalError(absl::StrCat("import made ", spec.name, " with shape ",
                                              ShapeString(it->second->shape), " but Loom has ",
                                              ShapeString(pl.global_shape)));
    }
    pieces.push_back(Piece{spec.name, PARAM, pl.global_shape, pl.rect, it->second->data.data()});
  }

  Manifest manifest;
  manifest.set_format_version(kFormatVersion);
  manifest.set_created_by(absl::StrCat(
      "loom //checkpoint:import from ", hf.path, " (", hf.architecture,
      "); //train:gpt flags: ", GptFlagsString(hf), " --seq-length=", model.seq_length));
  *manifest.mutable_model() = ModelConfigProto(model);
  TrainingState* training = manifest.mutable_training();
  training->set_iteration(0);
  training->set_has_optimizer_state(false);
  Layout* l = manifest.mutable_layout();
  l->set_tensor_parallel(1);
  l->set_pipeline_parallel(1);
  l->set_data_parallel(1);
  l->set_virtual_pipeline(1);
  l->set_world_size(1);
  l->set_schedule("1f1b");

  // Layout 1x1 straight into save_dir, or into a staging folder that the
  // converter reshards into save_dir (each step atomic).
  const bool reshard = o.target_tp != 1 || o.target_pp != 1;
  const std::string stage = reshard ? o.save_dir + ".import_1x1" : o.save_dir;
  if (reshard) LOOM_RETURN_IF_ERROR(RemoveTree(stage));
  LOOM_RETURN_IF_ERROR(BeginCheckpoint(stage, 0));
  LOOM_ASSIGN_OR_RETURN(
      ShardReport report,
      WriteShardFile(JoinPath(TmpDirFor(stage, 0), ShardFileName(0, 1)), 0, pieces));
  LOOM_RETURN_IF_ERROR(MergeReports({report}, &manifest));
  LOOM_RETURN_IF_ERROR(CommitCheckpoint(stage, manifest, /*keep_last=*/0));
  if (!reshard) return absl::OkStatus();
  absl::Status s = ConvertCheckpoint(FinalDirFor(stage, 0), o.save_dir, o.target_tp, o.target_pp);
  absl::Status r = RemoveTree(stage);
  LOOM_RETURN_IF_ERROR(s);
  return r;
}

}  // namespace loom::checkpoint::hf
