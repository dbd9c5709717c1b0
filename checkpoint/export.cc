#include "checkpoint/export.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/file_util.h"
#include "checkpoint/hf/safetensors.h"
#include "checkpoint/rank_state.h"
#include "checkpoint/reader.h"
#include "core/status_macros.h"
#include "models/gpt/hf_tensor_map.h"
#include "nlohmann/json.hpp"

namespace loom::checkpoint {
namespace {

// A float as the shortest decimal that reads back as it (1e-05, not
// 9.999999747378752e-06), for config.json.
double Decimal(float x) { return std::stod(absl::StrCat(x)); }

// The Hugging Face tensors of `family` (models/gpt/hf_tensor_map.h), each
// made from its Loom tensor in `reader`.
absl::StatusOr<std::vector<hf::NamedTensor>> HfTensors(CheckpointReader& reader,
                                                       hf::HfFamily family,
                                                       const std::string& what) {
  LOOM_ASSIGN_OR_RETURN(const layers::GptConfig c,
                        GptConfigFromProto(reader.manifest().model(),
                                           absl::StrCat(reader.path(), "/manifest.pb")));
  const std::vector<hf::HfMapEntry> table = hf::HfTensorMap(family, c);
  absl::Status covers = hf::CheckCoversModel(table, c, what);
  if (!covers.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        covers.message(), ": no Hugging Face architecture to export this checkpoint as"));
  }
  std::vector<hf::NamedTensor> tensors;
  for (const hf::HfMapEntry& e : table) {
    LOOM_ASSIGN_OR_RETURN(std::vector<float> x, reader.ReadGlobal(e.loom_name, PARAM));
    absl::StatusOr<std::vector<std::vector<float>>> parts = e.transform.ToHf(std::move(x));
    if (!parts.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint tensor ", e.loom_name, ": ", parts.status().message()));
    }
    for (size_t i = 0; i < e.hf.size(); ++i) {
      tensors.push_back(hf::NamedTensor::FromF32(e.hf[i].name, e.hf[i].shape, (*parts)[i]));
    }
  }
  return tensors;
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

// LlamaForCausalLM, MixtralForCausalLM for an MoE checkpoint whose every
// layer is MoE (the caller checks): the same names but block_sparse_moe for
// mlp, or Qwen2ForCausalLM for one with a QKV bias (--add-qkv-bias).
absl::Status ExportLlama(CheckpointReader& reader, const std::string& out_dir, hf::Dtype dtype) {
  LOOM_ASSIGN_OR_RETURN(const layers::GptConfig c,
                        GptConfigFromProto(reader.manifest().model(),
                                           absl::StrCat(reader.path(), "/manifest.pb")));
  const bool mixtral = c.moe(), qwen2 = c.add_qkv_bias;
  const char* architecture =
      mixtral ? "MixtralForCausalLM" : (qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM");
  const int64_t h = c.hidden_size, f = c.ffn(), V = c.vocab_size, H = c.num_attention_heads,
                G = c.query_groups(), d = c.head_dim();
  LOOM_ASSIGN_OR_RETURN(
      std::vector<hf::NamedTensor> tensors,
      HfTensors(reader, mixtral ? hf::HfFamily::kMixtral : hf::HfFamily::kLlama, architecture));
  nlohmann::ordered_json config = {
      {"architectures", {architecture}},
      {"model_type", mixtral ? "mixtral" : (qwen2 ? "qwen2" : "llama")},
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
  } else if (qwen2) {
    // Qwen2's q/k/v_proj always carry a bias, o_proj and the MLP none.
    config["use_sliding_window"] = false;
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
  LOOM_ASSIGN_OR_RETURN(const layers::GptConfig c,
                        GptConfigFromProto(m, absl::StrCat(reader->path(), "/manifest.pb")));
  const bool llama = c.rms_norm() && c.rope() && c.swiglu && !c.add_bias_linear &&
                     c.rotary_percent == 1.0f;
  if (c.moe() && c.add_qkv_bias) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", iter_dir, " is a mixture of experts (--num-experts=", c.num_experts,
        ") with --add-qkv-bias: no Hugging Face architecture (MixtralForCausalLM has no QKV "
        "bias) to export it as"));
  }
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
        "--disable-bias-linear; Qwen2 with --add-qkv-bias): no Hugging Face architecture to "
        "export it as"));
  }
  const int64_t h = m.hidden_size(), f = m.ffn_hidden_size(), heads = m.num_attention_heads();
  LOOM_ASSIGN_OR_RETURN(std::vector<hf::NamedTensor> tensors,
                        HfTensors(*reader, hf::HfFamily::kGpt2, "GPT2LMHeadModel"));
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
