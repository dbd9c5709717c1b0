#include "checkpoint/hf/hf_config.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/file_util.h"
#include "checkpoint/hf/json_util.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace loom::checkpoint::hf {
namespace {

using nlohmann::json;

// Reads fields of one JSON object; every error names the file and the field.
class Fields {
 public:
  Fields(const json& j, std::string path, std::string prefix = "")
      : j_(j), path_(std::move(path)), prefix_(std::move(prefix)) {}

  bool Has(const std::string& key) const { return j_.contains(key); }
  // Present and not null.
  bool Set(const std::string& key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  const json& At(const std::string& key) const { return j_.at(key); }

  absl::Status Error(const std::string& key, const std::string& why) const {
    const std::string value = Has(key) ? j_.at(key).dump() : "(absent)";
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": ", prefix_, key, " = ", value, ": ", why));
  }

  // A positive integer; `fallback` when absent or null (< 0: required).
  absl::StatusOr<int64_t> Int(const std::string& key, int64_t fallback = -1) const {
    if (!Set(key)) {
      if (fallback >= 0) return fallback;
      return Error(key, "required");
    }
    const json& v = j_.at(key);
    if (v.is_number_unsigned() && v.get<uint64_t>() > 0 && v.get<uint64_t>() < (1ull << 62)) {
      return v.get<int64_t>();
    }
    return Error(key, "expected a positive integer");
  }

  absl::StatusOr<double> Number(const std::string& key, double fallback) const {
    if (!Set(key)) return fallback;
    const json& v = j_.at(key);
    if (!v.is_number() || !std::isfinite(v.get<double>())) return Error(key, "expected a number");
    return v.get<double>();
  }

  absl::StatusOr<bool> Bool(const std::string& key, bool fallback) const {
    if (!Set(key)) return fallback;
    const json& v = j_.at(key);
    if (!v.is_boolean()) return Error(key, "expected true or false");
    return v.get<bool>();
  }

  absl::StatusOr<std::string> String(const std::string& key, const std::string& fallback) const {
    if (!Set(key)) return fallback;
    const json& v = j_.at(key);
    if (!v.is_string()) return Error(key, "expected a string");
    return v.get<std::string>();
  }

  // The field must be absent, null, or `allowed`.
  absl::Status Must(const std::string& key, bool allowed, const std::string& why) const {
    if (!Set(key) || allowed) return absl::OkStatus();
    return Error(key, why);
  }

  const std::string& path() const { return path_; }

 private:
  const json& j_;
  std::string path_;
  std::string prefix_;
};

struct Arch {
  const char* architecture;
  const char* model_type;
};
constexpr Arch kArchs[] = {
    {"GPT2LMHeadModel", "gpt2"},
    {"LlamaForCausalLM", "llama"},
    {"MistralForCausalLM", "mistral"},
    {"MixtralForCausalLM", "mixtral"},
    {"Qwen2ForCausalLM", "qwen2"},
};

std::string Supported() {
  std::vector<std::string> names;
  for (const Arch& a : kArchs) names.push_back(a.architecture);
  return absl::StrJoin(names, ", ");
}

// Fields any family must not carry.
absl::Status CheckCommon(const Fields& f) {
  LOOM_RETURN_IF_ERROR(f.Must("quantization_config", false,
                              "quantized weights are not supported (Loom reads F32/BF16/F16)"));
  LOOM_ASSIGN_OR_RETURN(bool encoder_decoder, f.Bool("is_encoder_decoder", false));
  if (encoder_decoder) return f.Error("is_encoder_decoder", "encoder-decoder models are not supported");
  return absl::OkStatus();
}

absl::Status ParseGpt2(const Fields& f, HfModelConfig& c) {
  LOOM_ASSIGN_OR_RETURN(c.num_layers, f.Int("n_layer"));
  LOOM_ASSIGN_OR_RETURN(c.hidden_size, f.Int("n_embd"));
  LOOM_ASSIGN_OR_RETURN(c.num_attention_heads, f.Int("n_head"));
  LOOM_ASSIGN_OR_RETURN(c.vocab_size, f.Int("vocab_size"));
  LOOM_ASSIGN_OR_RETURN(c.max_position_embeddings, f.Int("n_positions"));
  LOOM_ASSIGN_OR_RETURN(c.ffn_hidden_size, f.Int("n_inner", 4 * c.hidden_size));
  if (c.hidden_size % c.num_attention_heads != 0) {
    return f.Error("n_head", absl::StrCat("does not divide n_embd = ", c.hidden_size));
  }
  c.num_query_groups = c.num_attention_heads;
  LOOM_ASSIGN_OR_RETURN(c.hidden_act, f.String("activation_function", "gelu_new"));
  // All tanh approximations of GELU, which is what Loom computes.
  if (c.hidden_act != "gelu_new" && c.hidden_act != "gelu_pytorch_tanh" &&
      c.hidden_act != "gelu_fast") {
    return f.Error("activation_function",
                   "Loom's GPT-2 uses the tanh GELU (gelu_new, gelu_pytorch_tanh, gelu_fast)");
  }
  LOOM_ASSIGN_OR_RETURN(const double epsilon, f.Number("layer_norm_epsilon", 1e-5));
  c.layernorm_epsilon = static_cast<float>(epsilon);
  LOOM_ASSIGN_OR_RETURN(bool scale, f.Bool("scale_attn_weights", true));
  if (!scale) return f.Error("scale_attn_weights", "Loom always scales attention by 1/sqrt(d)");
  LOOM_ASSIGN_OR_RETURN(bool by_layer, f.Bool("scale_attn_by_inverse_layer_idx", false));
  if (by_layer) return f.Error("scale_attn_by_inverse_layer_idx", "not supported");
  LOOM_ASSIGN_OR_RETURN(bool cross, f.Bool("add_cross_attention", false));
  if (cross) return f.Error("add_cross_attention", "not supported");
  LOOM_ASSIGN_OR_RETURN(bool tie, f.Bool("tie_word_embeddings", true));
  c.untie_embeddings_and_output_weights = !tie;
  c.normalization = layers::Normalization::kLayerNorm;
  c.position_embedding_type = layers::PositionEmbedding::kLearnedAbsolute;
  c.swiglu = false;
  c.add_bias_linear = true;
  return absl::OkStatus();
}

absl::Status ParseRope(const Fields& f, HfModelConfig& c) {
  LOOM_RETURN_IF_ERROR(f.Must("rope_scaling", false, "RoPE scaling is not supported"));
  LOOM_ASSIGN_OR_RETURN(double base, f.Number("rope_theta", 10000.0));
  LOOM_ASSIGN_OR_RETURN(double percent, f.Number("partial_rotary_factor", 1.0));
  if (f.Set("rope_parameters")) {  // transformers 5
    const json& rp = f.At("rope_parameters");
    if (!rp.is_object()) return f.Error("rope_parameters", "expected an object");
    const Fields r(rp, f.path(), "rope_parameters.");
    LOOM_ASSIGN_OR_RETURN(std::string type, r.String("rope_type", ""));
    if (type.empty()) {
      LOOM_ASSIGN_OR_RETURN(type, r.String("type", "default"));
    }
    if (type != "default") {
      return r.Error(r.Has("rope_type") ? "rope_type" : "type",
                     "only unscaled RoPE (\"default\") is supported");
    }
    for (auto it = rp.begin(); it != rp.end(); ++it) {
      const std::string& k = it.key();
      if (k != "rope_type" && k != "type" && k != "rope_theta" && k != "partial_rotary_factor") {
        return r.Error(k, "not supported with default RoPE");
      }
    }
    LOOM_ASSIGN_OR_RETURN(base, r.Number("rope_theta", base));
    LOOM_ASSIGN_OR_RETURN(percent, r.Number("partial_rotary_factor", percent));
    if (!(base > 0)) return r.Error("rope_theta", "must be positive");
    if (!(percent > 0 && percent <= 1)) {
      return r.Error("partial_rotary_factor", "must be in (0, 1]");
    }
  }
  if (!(base > 0)) return f.Error("rope_theta", "must be positive");
  if (!(percent > 0 && percent <= 1)) {
    return f.Error("partial_rotary_factor", "must be in (0, 1]");
  }
  c.rotary_base = static_cast<float>(base);
  c.rotary_percent = static_cast<float>(percent);
  const double rotary_dims = percent * static_cast<double>(c.head_dim());
  if (rotary_dims != std::floor(rotary_dims) || static_cast<int64_t>(rotary_dims) % 2 != 0) {
    return f.Error(f.Has("partial_rotary_factor") ? "partial_rotary_factor" : "rope_parameters",
                   absl::StrCat("rotary dimensions ", rotary_dims, " of head_dim ", c.head_dim(),
                                " must be an even integer"));
  }
  return absl::OkStatus();
}

absl::Status ParseLlama(const Fields& f, HfModelConfig& c) {
  LOOM_ASSIGN_OR_RETURN(c.num_layers, f.Int("num_hidden_layers"));
  LOOM_ASSIGN_OR_RETURN(c.hidden_size, f.Int("hidden_size"));
  LOOM_ASSIGN_OR_RETURN(c.num_attention_heads, f.Int("num_attention_heads"));
  LOOM_ASSIGN_OR_RETURN(c.ffn_hidden_size, f.Int("intermediate_size"));
  LOOM_ASSIGN_OR_RETURN(c.vocab_size, f.Int("vocab_size"));
  LOOM_ASSIGN_OR_RETURN(c.max_position_embeddings, f.Int("max_position_embeddings"));
  LOOM_ASSIGN_OR_RETURN(c.num_query_groups, f.Int("num_key_value_heads", c.num_attention_heads));
  if (c.hidden_size % c.num_attention_heads != 0) {
    return f.Error("num_attention_heads",
                   absl::StrCat("does not divide hidden_size = ", c.hidden_size));
  }
  if (c.num_attention_heads % c.num_query_groups != 0) {
    return f.Error("num_key_value_heads", absl::StrCat("does not divide num_attention_heads = ",
                                                       c.num_attention_heads));
  }
  c.group_query_attention = c.num_query_groups != c.num_attention_heads;
  if (f.Set("head_dim")) {
    LOOM_ASSIGN_OR_RETURN(int64_t head_dim, f.Int("head_dim"));
    if (head_dim != c.head_dim()) {
      return f.Error("head_dim", absl::StrCat("Loom needs hidden_size / num_attention_heads = ",
                                              c.head_dim()));
    }
  }
  LOOM_ASSIGN_OR_RETURN(c.hidden_act, f.String("hidden_act", "silu"));
  if (c.hidden_act != "silu") return f.Error("hidden_act", "Loom's SwiGLU MLP needs silu");
  LOOM_ASSIGN_OR_RETURN(bool attention_bias, f.Bool("attention_bias", false));
  if (attention_bias) return f.Error("attention_bias", "biases in Llama attention are not supported");
  LOOM_ASSIGN_OR_RETURN(bool mlp_bias, f.Bool("mlp_bias", false));
  if (mlp_bias) return f.Error("mlp_bias", "biases in the Llama MLP are not supported");
  LOOM_ASSIGN_OR_RETURN(const double epsilon, f.Number("rms_norm_eps", 1e-6));
  c.layernorm_epsilon = static_cast<float>(epsilon);
  LOOM_RETURN_IF_ERROR(ParseRope(f, c));
  // Mistral: a sliding window that covers the whole context is full attention.
  if (f.Set("sliding_window")) {
    LOOM_ASSIGN_OR_RETURN(bool use, f.Bool("use_sliding_window", true));
    LOOM_ASSIGN_OR_RETURN(int64_t window, f.Int("sliding_window"));
    if (use && window < c.max_position_embeddings) {
      return f.Error("sliding_window",
                     absl::StrCat("sliding-window attention shorter than max_position_embeddings = ",
                                  c.max_position_embeddings, " is not supported"));
    }
  }
  LOOM_ASSIGN_OR_RETURN(bool tie, f.Bool("tie_word_embeddings", false));
  c.untie_embeddings_and_output_weights = !tie;
  c.normalization = layers::Normalization::kRMSNorm;
  c.position_embedding_type = layers::PositionEmbedding::kRope;
  c.swiglu = true;
  c.add_bias_linear = false;
  return absl::OkStatus();
}

// Mixtral's MoE fields, on top of ParseLlama (HF's defaults when absent).
absl::Status ParseMixtral(const Fields& f, HfModelConfig& c) {
  LOOM_ASSIGN_OR_RETURN(c.num_experts, f.Int("num_local_experts", 8));
  LOOM_ASSIGN_OR_RETURN(c.moe_router_topk, f.Int("num_experts_per_tok", 2));
  if (c.moe_router_topk > c.num_experts) {
    return f.Error("num_experts_per_tok",
                   absl::StrCat("more than num_local_experts = ", c.num_experts));
  }
  // Training-time noise on the MoE input that Loom's router does not add.
  LOOM_ASSIGN_OR_RETURN(double jitter, f.Number("router_jitter_noise", 0.0));
  if (jitter != 0) return f.Error("router_jitter_noise", "router jitter is not supported");
  LOOM_ASSIGN_OR_RETURN(c.moe_aux_loss_coeff, f.Number("router_aux_loss_coef", 0.001));
  if (c.moe_aux_loss_coeff < 0) return f.Error("router_aux_loss_coef", "must be >= 0");
  return absl::OkStatus();
}

// Qwen2, on top of ParseLlama: q/k/v_proj always carry a bias (o_proj and
// the MLP none: Loom's --add-qkv-bias). Sliding-window layers are refused.
absl::Status ParseQwen2(const Fields& f, HfModelConfig& c) {
  c.add_qkv_bias = true;
  LOOM_ASSIGN_OR_RETURN(bool sliding, f.Bool("use_sliding_window", false));
  if (sliding) return f.Error("use_sliding_window", "sliding-window attention is not supported");
  if (f.Set("layer_types")) {
    const json& types = f.At("layer_types");
    if (!types.is_array()) return f.Error("layer_types", "expected a list");
    for (const json& t : types) {
      if (t != "full_attention") {
        return f.Error("layer_types", "only full_attention layers are supported");
      }
    }
  }
  return absl::OkStatus();
}

// The shortest decimal that reads back as x, integers in full (1000000, not
// StrCat's 1e+06, which also rounds to 6 digits).
std::string Num(double x) {
  if (x == std::floor(x) && std::fabs(x) < 1e15) return absl::StrCat(static_cast<int64_t>(x));
  for (int digits = 6;; ++digits) {
    const std::string s = absl::StrFormat("%.*g", digits, x);
    if (digits >= 17 || std::stod(s) == x) return s;
  }
}

}  // namespace

absl::StatusOr<HfModelConfig> ParseHfConfig(const std::string& text, const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(json j, ParseJsonStrict(text, path, "config"));
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": bad config JSON: not an object"));
  }
  const Fields f(j, path);
  HfModelConfig c;
  c.path = path;
  if (!f.Set("architectures") || !f.At("architectures").is_array() ||
      f.At("architectures").size() != 1 || !f.At("architectures")[0].is_string()) {
    return f.Error("architectures", absl::StrCat("expected one of [\"", Supported(), "\"]"));
  }
  c.architecture = f.At("architectures")[0].get<std::string>();
  const Arch* arch = nullptr;
  for (const Arch& a : kArchs) {
    if (c.architecture == a.architecture) arch = &a;
  }
  if (arch == nullptr) {
    return f.Error("architectures", absl::StrCat("unknown architecture; supported: ", Supported()));
  }
  LOOM_ASSIGN_OR_RETURN(c.model_type, f.String("model_type", arch->model_type));
  if (c.model_type != arch->model_type) {
    return f.Error("model_type",
                   absl::StrCat("does not match architecture ", c.architecture, " (expected \"",
                                arch->model_type, "\")"));
  }
  LOOM_RETURN_IF_ERROR(CheckCommon(f));
  LOOM_ASSIGN_OR_RETURN(c.dtype, f.String("dtype", ""));
  if (c.dtype.empty()) {
    LOOM_ASSIGN_OR_RETURN(c.dtype, f.String("torch_dtype", ""));
  }
  if (c.model_type == "gpt2") {
    LOOM_RETURN_IF_ERROR(ParseGpt2(f, c));
  } else {
    LOOM_RETURN_IF_ERROR(ParseLlama(f, c));
    if (c.model_type == "mixtral") LOOM_RETURN_IF_ERROR(ParseMixtral(f, c));
    if (c.model_type == "qwen2") LOOM_RETURN_IF_ERROR(ParseQwen2(f, c));
  }
  if (!(c.layernorm_epsilon > 0)) {
    return f.Error(c.model_type == "gpt2" ? "layer_norm_epsilon" : "rms_norm_eps",
                   "must be positive");
  }
  return c;
}

absl::StatusOr<HfModelConfig> ReadHfConfig(const std::string& path) {
  const std::string file = IsDirectory(path) ? JoinPath(path, "config.json") : path;
  absl::StatusOr<std::string> text = ReadFile(file);
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) {
      return absl::NotFoundError(absl::StrCat(file, ": no such file"));
    }
    return text.status();
  }
  return ParseHfConfig(*text, file);
}

std::vector<std::string> GptFlags(const HfModelConfig& c) {
  std::vector<std::string> flags;
  for (const layers::ArchitectureField& f : layers::ArchitectureFields()) {
    // Chosen at import, not in a config.json.
    if (f.flag == "seq_length" || f.flag == "make_vocab_size_divisible_by") continue;
    if (!f.applies(c)) continue;
    const layers::FieldValue v = f.get(c);
    if (const bool* on = std::get_if<bool>(&v)) {
      if (*on) flags.push_back(f.dashed());
    } else if (v != layers::ZeroLike(v)) {  // --num-experts=0 is a dense model: no flag
      flags.push_back(absl::StrCat(f.dashed(), "=", layers::FieldValueString(v)));
    }
  }
  if (c.moe() && c.moe_aux_loss_coeff > 0) {
    flags.push_back(absl::StrCat("--moe-aux-loss-coeff=", Num(c.moe_aux_loss_coeff)));
  }
  return flags;
}

std::string GptFlagsString(const HfModelConfig& c) { return absl::StrJoin(GptFlags(c), " "); }

}  // namespace loom::checkpoint::hf
