#include "checkpoint/export.h"

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/file_util.h"
#include "checkpoint/hf/safetensors.h"
#include "checkpoint/rank_state.h"
#include "checkpoint/reader.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace loom::checkpoint {
namespace {

struct Out {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// A float as the shortest decimal that reads back as it (1e-05, not
// 9.999999747378752e-06), for config.json.
double Decimal(float x) { return std::stod(absl::StrCat(x)); }

// [rows, cols] -> [cols, rows].
std::vector<float> Transpose(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) y[c * rows + r] = x[r * cols + c];
  }
  return y;
}

// Our qkv row of HF's c_attn output column j: j = part * h + head * d + dd,
// ours = head * 3d + part * d + dd.
int64_t QkvRow(int64_t j, int64_t h, int64_t heads) {
  const int64_t d = h / heads, part = j / h, within = j % h;
  return (within / d) * 3 * d + part * d + within % d;
}

// Writes `out_dir`/model.safetensors (floats as `dtype`) and config.json
// (`config` plus the torch_dtype that says which), both atomically.
absl::Status WriteHfFolder(const std::string& out_dir, const std::vector<hf::NamedTensor>& tensors,
                           hf::Dtype dtype, nlohmann::ordered_json config) {
  LOOM_RETURN_IF_ERROR(MakeDirs(out_dir));
  hf::WriteOptions options;
  options.float_dtype = dtype;
  LOOM_RETURN_IF_ERROR(
      hf::WriteSafetensors(JoinPath(out_dir, "model.safetensors"), tensors, options));
  config["torch_dtype"] = dtype == hf::Dtype::kBF16 ? "bfloat16" : "float32";
  return WriteFileAtomically(JoinPath(out_dir, "config.json"), config.dump(2) + "\n");
}

// Mixtral's default, for checkpoints older than their moe_aux_loss_coeff.
constexpr double kMixtralAuxLossCoef = 0.001;

// LlamaForCausalLM, or MixtralForCausalLM for an MoE checkpoint whose every
// layer is MoE (the caller checks): the same names but block_sparse_moe for mlp.
absl::Status ExportLlama(CheckpointReader& reader, const std::string& out_dir, hf::Dtype dtype) {
  const layers::GptConfig c = GptConfigFromProto(reader.manifest().model());
  const bool mixtral = c.moe();
  const int64_t h = c.hidden_size, f = c.ffn(), V = c.vocab_size, H = c.num_attention_heads,
                G = c.query_groups(), d = c.head_dim();
  std::vector<hf::NamedTensor> tensors;
  auto get = [&](const std::string& name) { return reader.ReadGlobal(name, PARAM); };
  auto put = [&](const std::string& name, std::vector<int64_t> shape,
                 const std::vector<float>& x) {
    tensors.push_back(hf::NamedTensor::FromF32(name, std::move(shape), x));
  };
  auto copy = [&](const std::string& ours, const std::string& hf_name,
                  std::vector<int64_t> shape) -> absl::Status {
    LOOM_ASSIGN_OR_RETURN(std::vector<float> x, get(ours));
    put(hf_name, std::move(shape), x);
    return absl::OkStatus();
  };
  // A SwiGLU MLP (dense, or one expert): dense_h_to_4h's two rows are gate and up.
  auto swiglu = [&](const std::string& ours, const std::string& gate_name,
                    const std::string& up_name, const std::string& down_name) -> absl::Status {
    LOOM_ASSIGN_OR_RETURN(std::vector<float> gu, get(ours + "dense_h_to_4h.weight"));
    put(gate_name, {f, h}, std::vector<float>(gu.begin(), gu.begin() + f * h));
    put(up_name, {f, h}, std::vector<float>(gu.begin() + f * h, gu.end()));
    return copy(ours + "dense_4h_to_h.weight", down_name, {h, f});
  };
  if (!c.tied_output_layer()) {
    LOOM_RETURN_IF_ERROR(copy(layers::kOutputLayerName, "lm_head.weight", {V, h}));
  }
  LOOM_RETURN_IF_ERROR(copy(layers::kWordEmbeddingName, "model.embed_tokens.weight", {V, h}));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrCat("layers.", i, "."),
                      q = absl::StrCat("model.layers.", i, ".");
    LOOM_RETURN_IF_ERROR(copy(p + "input_layernorm.weight", q + "input_layernorm.weight", {h}));
    LOOM_ASSIGN_OR_RETURN(std::vector<float> w, get(p + "attention.qkv.weight"));
    std::vector<float> wq(H * d * h), wk(G * d * h), wv(G * d * h);
    for (auto [part, to, count] : {std::tuple{layers::QkvPart::kQuery, &wq, H},
                                   std::tuple{layers::QkvPart::kKey, &wk, G},
                                   std::tuple{layers::QkvPart::kValue, &wv, G}}) {
      for (int64_t j = 0; j < count; ++j) {
        for (int64_t e = 0; e < d; ++e) {
          const int64_t from = layers::QkvWeightRow(c, part, j, e);
          std::copy(w.begin() + from * h, w.begin() + (from + 1) * h,
                    to->begin() + (j * d + e) * h);
        }
      }
    }
    put(q + "self_attn.q_proj.weight", {H * d, h}, wq);
    put(q + "self_attn.k_proj.weight", {G * d, h}, wk);
    put(q + "self_attn.v_proj.weight", {G * d, h}, wv);
    LOOM_RETURN_IF_ERROR(
        copy(p + "attention.dense.weight", q + "self_attn.o_proj.weight", {h, H * d}));
    LOOM_RETURN_IF_ERROR(copy(p + "post_attention_layernorm.weight",
                              q + "post_attention_layernorm.weight", {h}));
    if (mixtral) {
      const std::string m = q + "block_sparse_moe.";
      LOOM_RETURN_IF_ERROR(copy(p + "mlp.router.weight", m + "gate.weight", {c.num_experts, h}));
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const std::string x = absl::StrCat(m, "experts.", e, ".");
        LOOM_RETURN_IF_ERROR(swiglu(absl::StrCat(p, "mlp.experts.", e, "."), x + "w1.weight",
                                    x + "w3.weight", x + "w2.weight"));
      }
    } else {
      LOOM_RETURN_IF_ERROR(swiglu(p + "mlp.", q + "mlp.gate_proj.weight", q + "mlp.up_proj.weight",
                                  q + "mlp.down_proj.weight"));
    }
  }
  LOOM_RETURN_IF_ERROR(copy(layers::kFinalNormWeightName, "model.norm.weight", {h}));
  nlohmann::ordered_json config = {
      {"architectures", {mixtral ? "MixtralForCausalLM" : "LlamaForCausalLM"}},
      {"model_type", mixtral ? "mixtral" : "llama"},
      {"vocab_size", V},
      {"hidden_size", h},
      {"intermediate_size", f},
      {"num_hidden_layers", c.num_layers},
      {"num_attention_heads", H},
      {"num_key_value_heads", G},
      {"head_dim", d},
      {"max_position_embeddings", c.max_positions()},
      {"hidden_act", "silu"},
      {"rms_norm_eps", Decimal(c.layernorm_epsilon)},
      {"rope_theta", Decimal(c.rotary_base)},
      {"attention_dropout", 0.0},
      {"initializer_range", Decimal(c.init_method_std)},
      {"tie_word_embeddings", c.tied_output_layer()},
  };
  if (mixtral) {
    // Loom's routing is Mixtral's; the capacity factor is not recorded, and
    // Mixtral is dropless. Null: older transformers default to a 4096 window.
    config["num_local_experts"] = c.num_experts;
    config["num_experts_per_tok"] = c.moe_router_topk;
    config["router_aux_loss_coef"] = reader.manifest().model().has_moe_aux_loss_coeff()
                                         ? Decimal(c.moe_aux_loss_coeff)
                                         : kMixtralAuxLossCoef;
    config["router_jitter_noise"] = 0.0;
    config["output_router_logits"] = false;
    config["sliding_window"] = nullptr;
  } else {
    config["attention_bias"] = false;
    config["mlp_bias"] = false;
  }
  return WriteHfFolder(out_dir, tensors, dtype, std::move(config));
}

}  // namespace

absl::Status ExportSafetensors(const std::string& iter_dir, const std::string& out_dir,
                               hf::Dtype dtype) {
  if (dtype != hf::Dtype::kF32 && dtype != hf::Dtype::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype=", hf::DtypeName(dtype), ": only f32 and bf16 are written"));
  }
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(iter_dir));
  const ModelConfig& m = reader->manifest().model();
  const layers::GptConfig c = GptConfigFromProto(m);
  const bool llama = c.rms_norm() && c.rope() && c.swiglu && !c.add_bias_linear &&
                     c.rotary_percent == 1.0f;
  if (c.moe()) {
    // Mixtral: Llama's architecture with every MLP a mixture of SwiGLU experts.
    if (!llama) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint ", iter_dir, " is a mixture of experts (--num-experts=", c.num_experts,
          ") but not Llama's architecture (RMSNorm, rope with --rotary-percent=1, --swiglu, "
          "--disable-bias-linear): no Hugging Face architecture (MixtralForCausalLM) to export "
          "it as"));
    }
    if (c.moe_layer_freq != 1 && c.num_layers > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint ", iter_dir, " has --moe-layer-freq=", c.moe_layer_freq,
          " (dense layers between MoE layers), but MixtralForCausalLM makes every layer MoE: "
          "no Hugging Face architecture to export it as"));
    }
    return ExportLlama(*reader, out_dir, dtype);
  }
  const bool gpt2 = !c.rms_norm() && !c.rope() && !c.swiglu && c.add_bias_linear &&
                    c.tied_output_layer() && !c.group_query_attention;
  if (llama) return ExportLlama(*reader, out_dir, dtype);
  if (!gpt2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", iter_dir, " is neither GPT-2 (LayerNorm, learned_absolute, GELU, biases, "
        "tied) nor Llama (RMSNorm, rope with --rotary-percent=1, --swiglu, "
        "--disable-bias-linear): no Hugging Face architecture to export it as"));
  }
  const int64_t h = m.hidden_size(), f = m.ffn_hidden_size(), heads = m.num_attention_heads();
  std::vector<Out> outs;
  auto get = [&](const std::string& name) { return reader->ReadGlobal(name, PARAM); };
  auto copy = [&](const std::string& ours, const std::string& hf,
                  std::vector<int64_t> shape) -> absl::Status {
    LOOM_ASSIGN_OR_RETURN(std::vector<float> x, get(ours));
    outs.push_back(Out{"transformer." + hf, std::move(shape), std::move(x)});
    return absl::OkStatus();
  };
  auto transposed = [&](const std::string& ours, const std::string& hf, int64_t rows,
                        int64_t cols) -> absl::Status {
    LOOM_ASSIGN_OR_RETURN(std::vector<float> x, get(ours));
    outs.push_back(Out{"transformer." + hf, {cols, rows}, Transpose(x, rows, cols)});
    return absl::OkStatus();
  };
  LOOM_RETURN_IF_ERROR(copy(layers::kWordEmbeddingName, "wte.weight", {m.vocab_size(), h}));
  LOOM_RETURN_IF_ERROR(copy(layers::kPositionEmbeddingName, "wpe.weight",
                            {m.max_position_embeddings(), h}));
  for (int64_t i = 0; i < m.num_layers(); ++i) {
    const std::string p = absl::StrCat("layers.", i, "."), q = absl::StrCat("h.", i, ".");
    LOOM_RETURN_IF_ERROR(copy(p + "input_layernorm.weight", q + "ln_1.weight", {h}));
    LOOM_RETURN_IF_ERROR(copy(p + "input_layernorm.bias", q + "ln_1.bias", {h}));
    LOOM_ASSIGN_OR_RETURN(std::vector<float> w, get(p + "attention.qkv.weight"));  // [3h, h]
    LOOM_ASSIGN_OR_RETURN(std::vector<float> b, get(p + "attention.qkv.bias"));    // [3h]
    std::vector<float> cw(3 * h * h), cb(3 * h);
    for (int64_t j = 0; j < 3 * h; ++j) {
      const int64_t row = QkvRow(j, h, heads);
      cb[j] = b[row];
      for (int64_t k = 0; k < h; ++k) cw[k * 3 * h + j] = w[row * h + k];  // [h, 3h]
    }
    outs.push_back(Out{"transformer." + q + "attn.c_attn.weight", {h, 3 * h}, std::move(cw)});
    outs.push_back(Out{"transformer." + q + "attn.c_attn.bias", {3 * h}, std::move(cb)});
    LOOM_RETURN_IF_ERROR(transposed(p + "attention.dense.weight", q + "attn.c_proj.weight", h, h));
    LOOM_RETURN_IF_ERROR(copy(p + "attention.dense.bias", q + "attn.c_proj.bias", {h}));
    LOOM_RETURN_IF_ERROR(copy(p + "post_attention_layernorm.weight", q + "ln_2.weight", {h}));
    LOOM_RETURN_IF_ERROR(copy(p + "post_attention_layernorm.bias", q + "ln_2.bias", {h}));
    LOOM_RETURN_IF_ERROR(transposed(p + "mlp.dense_h_to_4h.weight", q + "mlp.c_fc.weight", f, h));
    LOOM_RETURN_IF_ERROR(copy(p + "mlp.dense_h_to_4h.bias", q + "mlp.c_fc.bias", {f}));
    LOOM_RETURN_IF_ERROR(transposed(p + "mlp.dense_4h_to_h.weight", q + "mlp.c_proj.weight", h, f));
    LOOM_RETURN_IF_ERROR(copy(p + "mlp.dense_4h_to_h.bias", q + "mlp.c_proj.bias", {h}));
  }
  LOOM_RETURN_IF_ERROR(copy(layers::kFinalNormWeightName, "ln_f.weight", {h}));
  LOOM_RETURN_IF_ERROR(copy(layers::kFinalNormBiasName, "ln_f.bias", {h}));

  std::vector<hf::NamedTensor> tensors;
  tensors.reserve(outs.size());
  for (const Out& o : outs) tensors.push_back(hf::NamedTensor::FromF32(o.name, o.shape, o.data));
  nlohmann::ordered_json config = {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", m.vocab_size()},
      {"n_positions", m.max_position_embeddings()},
      {"n_ctx", m.max_position_embeddings()},
      {"n_embd", h},
      {"n_layer", m.num_layers()},
      {"n_head", heads},
      {"n_inner", f},
      {"activation_function", "gelu_new"},  // tanh approximation, as core/cpu computes it
      {"layer_norm_epsilon", Decimal(m.norm_epsilon())},
      {"initializer_range", Decimal(m.init_method_std())},
      {"resid_pdrop", 0.0},
      {"embd_pdrop", 0.0},
      {"attn_pdrop", 0.0},
      {"tie_word_embeddings", true},
  };
  return WriteHfFolder(out_dir, tensors, dtype, std::move(config));
}

}  // namespace loom::checkpoint
