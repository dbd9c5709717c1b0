#include "models/gpt/hf_tensor_map.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom::checkpoint::hf {
namespace {

int64_t Numel(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
}

std::string ShapeString(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ", "), "]");
}

}  // namespace

Transform::Transform(std::vector<int64_t> rows, int64_t width, bool transposed,
                     std::vector<int64_t> loom_row)
    : rows_(std::move(rows)),
      width_(width),
      transposed_(transposed),
      loom_row_(std::move(loom_row)) {}

Transform Transform::Copy(int64_t numel) { return Transform({1}, numel, false, {}); }

Transform Transform::Conv1D(int64_t in, int64_t out) {
  return Transform({out}, in, /*transposed=*/true, {});
}

Transform Transform::FusedQkv(const layers::GptConfig& c, bool weight) {
  const int64_t h = c.hidden_size, d = c.head_dim();
  std::vector<int64_t> loom_row(3 * h);
  for (int64_t j = 0; j < 3 * h; ++j) {
    const auto part = static_cast<layers::QkvPart>(j / h);
    loom_row[j] = layers::QkvWeightRow(c, part, (j % h) / d, j % d);
  }
  return Transform({3 * h}, weight ? h : 1, /*transposed=*/weight, std::move(loom_row));
}

Transform Transform::QkvProj(const layers::GptConfig& c, int64_t width) {
  const int64_t H = c.num_attention_heads, G = c.query_groups(), d = c.head_dim();
  std::vector<int64_t> loom_row;
  loom_row.reserve((H + 2 * G) * d);
  for (auto [part, heads] : {std::pair{layers::QkvPart::kQuery, H},
                             std::pair{layers::QkvPart::kKey, G},
                             std::pair{layers::QkvPart::kValue, G}}) {
    for (int64_t j = 0; j < heads; ++j) {
      for (int64_t e = 0; e < d; ++e) loom_row.push_back(layers::QkvWeightRow(c, part, j, e));
    }
  }
  return Transform({H * d, G * d, G * d}, width, false, std::move(loom_row));
}

Transform Transform::Stacked(std::vector<int64_t> rows, int64_t width) {
  return Transform(std::move(rows), width, false, {});
}

int64_t Transform::LoomRow(int part, int64_t row) const {
  int64_t base = 0;
  for (int p = 0; p < part; ++p) base += rows_[p];
  return loom_row_.empty() ? base + row : loom_row_[base + row];
}

int64_t Transform::loom_numel() const {
  return std::accumulate(rows_.begin(), rows_.end(), int64_t{0}) * width_;
}

absl::StatusOr<std::vector<float>> Transform::ToLoom(std::vector<std::vector<float>> hf) const {
  if (hf.size() != rows_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the map takes ", rows_.size(), " tensors, not ", hf.size()));
  }
  for (int p = 0; p < parts(); ++p) {
    if (static_cast<int64_t>(hf[p].size()) != rows_[p] * width_) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", p, " of the map has ",
                                                     hf[p].size(), " values, not ",
                                                     rows_[p] * width_));
    }
  }
  if (identity()) return std::move(hf[0]);
  std::vector<float> loom(loom_numel());
  int64_t base = 0;  // the first HF row of part p, counted over all parts
  for (int p = 0; p < parts(); ++p) {
    const std::vector<float>& x = hf[p];
    const int64_t rows = rows_[p];
    for (int64_t i = 0; i < rows; ++i) {
      float* to = loom.data() + (loom_row_.empty() ? base + i : loom_row_[base + i]) * width_;
      if (transposed_) {
        for (int64_t k = 0; k < width_; ++k) to[k] = x[k * rows + i];  // x: [width, rows]
      } else {
        std::copy(x.begin() + i * width_, x.begin() + (i + 1) * width_, to);
      }
    }
    base += rows;
  }
  return loom;
}

absl::StatusOr<std::vector<std::vector<float>>> Transform::ToHf(std::vector<float> loom) const {
  if (static_cast<int64_t>(loom.size()) != loom_numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the Loom tensor has ", loom.size(), " values, not ", loom_numel()));
  }
  std::vector<std::vector<float>> hf;
  if (identity()) {
    hf.push_back(std::move(loom));
    return hf;
  }
  int64_t base = 0;
  for (int p = 0; p < parts(); ++p) {
    const int64_t rows = rows_[p];
    std::vector<float> x(rows * width_);
    for (int64_t i = 0; i < rows; ++i) {
      const float* from =
          loom.data() + (loom_row_.empty() ? base + i : loom_row_[base + i]) * width_;
      if (transposed_) {
        for (int64_t k = 0; k < width_; ++k) x[k * rows + i] = from[k];
      } else {
        std::copy(from, from + width_, x.begin() + i * width_);
      }
    }
    hf.push_back(std::move(x));
    base += rows;
  }
  return hf;
}

absl::StatusOr<HfFamily> HfFamilyOf(const std::string& model_type) {
  if (model_type == "gpt2") return HfFamily::kGpt2;
  if (model_type == "llama" || model_type == "mistral" || model_type == "qwen2") {
    return HfFamily::kLlama;
  }
  if (model_type == "mixtral") return HfFamily::kMixtral;
  return absl::InvalidArgumentError(
      absl::StrCat("model_type \"", model_type,
                   "\" has no Hugging Face tensor map (gpt2, llama, mistral, mixtral, qwen2)"));
}

std::vector<HfMapEntry> HfTensorMap(HfFamily family, const layers::GptConfig& c,
                                    const std::string& gpt2_prefix) {
  const int64_t h = c.hidden_size, f = c.ffn(), V = c.vocab_size, H = c.num_attention_heads,
                G = c.query_groups(), d = c.head_dim();
  std::vector<HfMapEntry> table;
  // An entry whose one HF tensor has the Loom tensor's shape and values.
  auto copy = [&](std::string ours, std::string theirs, std::vector<int64_t> shape) {
    const int64_t n = Numel(shape);
    table.push_back(HfMapEntry{std::move(ours), shape, {{std::move(theirs), shape}},
                               Transform::Copy(n)});
  };
  if (family == HfFamily::kGpt2) {
    const std::string& t = gpt2_prefix;
    // GPT-2's Conv1D: HF [in, out], Loom [out, in].
    auto conv = [&](std::string ours, std::string theirs, int64_t in, int64_t out) {
      table.push_back(HfMapEntry{std::move(ours), {out, in}, {{std::move(theirs), {in, out}}},
                                 Transform::Conv1D(in, out)});
    };
    copy(layers::kWordEmbeddingName, t + "wte.weight", {V, h});
    copy(layers::kPositionEmbeddingName, t + "wpe.weight", {c.max_positions(), h});
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const std::string q = absl::StrCat(t, "h.", i, ".");
      const layers::BlockParamNames n(i);
      copy(n.input_norm_weight, q + "ln_1.weight", {h});
      copy(n.input_norm_bias, q + "ln_1.bias", {h});
      table.push_back(HfMapEntry{n.qkv_weight,
                                 {(H + 2 * G) * d, h},
                                 {{q + "attn.c_attn.weight", {h, 3 * h}}},
                                 Transform::FusedQkv(c, /*weight=*/true)});
      table.push_back(HfMapEntry{n.qkv_bias,
                                 {(H + 2 * G) * d},
                                 {{q + "attn.c_attn.bias", {3 * h}}},
                                 Transform::FusedQkv(c, /*weight=*/false)});
      conv(n.dense_weight, q + "attn.c_proj.weight", h, h);
      copy(n.dense_bias, q + "attn.c_proj.bias", {h});
      copy(n.post_norm_weight, q + "ln_2.weight", {h});
      copy(n.post_norm_bias, q + "ln_2.bias", {h});
      conv(n.fc1_weight, q + "mlp.c_fc.weight", h, f);
      copy(n.fc1_bias, q + "mlp.c_fc.bias", {f});
      conv(n.fc2_weight, q + "mlp.c_proj.weight", f, h);
      copy(n.fc2_bias, q + "mlp.c_proj.bias", {h});
    }
    copy(layers::kFinalNormWeightName, t + "ln_f.weight", {h});
    copy(layers::kFinalNormBiasName, t + "ln_f.bias", {h});
    return table;
  }

  // Llama / Mistral / Mixtral / Qwen2: RMSNorm, RoPE, SwiGLU, no linear
  // biases but Qwen2's on q/k/v_proj (--add-qkv-bias).
  // A SwiGLU MLP (dense, or one Mixtral expert): [gate; up] -> dense_h_to_4h
  // [2, F·h], down -> dense_4h_to_h.
  auto swiglu = [&](const std::string& fc1, const std::string& fc2, const std::string& gate,
                    const std::string& up, const std::string& down) {
    table.push_back(HfMapEntry{fc1, {2, f * h}, {{gate, {f, h}}, {up, {f, h}}},
                               Transform::Stacked({f, f}, h)});
    copy(fc2, down, {h, f});
  };
  if (!c.tied_output_layer()) copy(layers::kOutputLayerName, "lm_head.weight", {V, h});
  copy(layers::kWordEmbeddingName, "model.embed_tokens.weight", {V, h});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string q = absl::StrCat("model.layers.", i, ".");
    const layers::BlockParamNames n(i);
    // attention.qkv.<kind> from self_attn.{q,k,v}_proj.<kind>: rows of
    // `width` values (the weight: h; a bias: 1).
    auto qkv_proj = [&](const std::string& ours, const std::string& kind, int64_t width) {
      auto shape = [&](int64_t rows) {
        return width == 1 ? std::vector<int64_t>{rows} : std::vector<int64_t>{rows, width};
      };
      table.push_back(HfMapEntry{ours,
                                 shape((H + 2 * G) * d),
                                 {{q + "self_attn.q_proj." + kind, shape(H * d)},
                                  {q + "self_attn.k_proj." + kind, shape(G * d)},
                                  {q + "self_attn.v_proj." + kind, shape(G * d)}},
                                 Transform::QkvProj(c, width)});
    };
    copy(n.input_norm_weight, q + "input_layernorm.weight", {h});
    qkv_proj(n.qkv_weight, "weight", h);
    if (c.qkv_bias()) qkv_proj(n.qkv_bias, "bias", 1);
    copy(n.dense_weight, q + "self_attn.o_proj.weight", {h, H * d});
    copy(n.post_norm_weight, q + "post_attention_layernorm.weight", {h});
    if (family == HfFamily::kMixtral) {
      // As save_pretrained writes it (transformers 5 fuses the experts in
      // memory only): w1 gate, w3 up, w2 down.
      const std::string m = q + "block_sparse_moe.";
      copy(n.router_weight, m + "gate.weight", {c.num_experts, h});
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const std::string x = absl::StrCat(m, "experts.", e, ".");
        swiglu(n.expert_fc1_weight(e), n.expert_fc2_weight(e), x + "w1.weight", x + "w3.weight",
               x + "w2.weight");
      }
    } else {
      swiglu(n.fc1_weight, n.fc2_weight, q + "mlp.gate_proj.weight", q + "mlp.up_proj.weight",
             q + "mlp.down_proj.weight");
    }
  }
  copy(layers::kFinalNormWeightName, "model.norm.weight", {h});
  return table;
}

std::vector<int64_t> StoredShape(const layers::ParamSpec& spec) {
  std::vector<int64_t> shape;
  for (int i = 0; i < spec.global_shape.rank(); ++i) shape.push_back(spec.global_shape.dim(i));
  if (spec.unpadded_rows > 0) shape[0] = spec.unpadded_rows;
  return shape;
}

absl::Status CheckCoversModel(const std::vector<HfMapEntry>& table,
                              const layers::GptConfig& config, const std::string& what) {
  std::map<std::string, const HfMapEntry*> by_name;
  for (const HfMapEntry& e : table) {
    if (!by_name.emplace(e.loom_name, &e).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("the ", what, " tensor map names ", e.loom_name, " twice"));
    }
    const Transform& t = e.transform;
    bool fits = static_cast<int>(e.hf.size()) == t.parts() && t.loom_numel() == Numel(e.loom_shape);
    for (int p = 0; fits && p < t.parts(); ++p) fits = Numel(e.hf[p].shape) == t.rows(p) * t.width();
    if (!fits) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the ", what, " tensor map's shapes of ", e.loom_name, " ", ShapeString(e.loom_shape),
          " do not fit its transform (this model cannot be that architecture)"));
    }
  }
  const std::vector<layers::ParamSpec> specs = layers::ModelParamSpecs(config);
  for (const layers::ParamSpec& spec : specs) {
    auto it = by_name.find(spec.name);
    if (it == by_name.end()) {
      return absl::InvalidArgumentError(absl::StrCat("the model's parameter ", spec.name,
                                                     " has no place in ", what, "'s tensors"));
    }
    if (it->second->loom_shape != StoredShape(spec)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the ", what, " tensor map makes ", spec.name, " ",
          ShapeString(it->second->loom_shape), " but the model has ",
          ShapeString(StoredShape(spec))));
    }
    by_name.erase(it);
  }
  if (!by_name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("the ", what, " tensor map's ",
                                                   by_name.begin()->first,
                                                   " is no parameter of the model"));
  }
  return absl::OkStatus();
}

}  // namespace loom::checkpoint::hf
