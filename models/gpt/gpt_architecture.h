#ifndef LOOM_MODELS_GPT_GPT_ARCHITECTURE_H_
#define LOOM_MODELS_GPT_GPT_ARCHITECTURE_H_

// The GPT family's architecture: the fields that decide which function the
// model computes and the shapes of its parameters. Each is declared once, in
// LOOM_GPT_ARCHITECTURE_FIELDS below; from that one list come
//   - the members of GptArchitecture (and so of GptConfig),
//   - //train:gpt's flags (train/gpt_flags.cc),
//   - the checkpoint manifest's ModelConfig fields (checkpoint/model_config.cc,
//     by name through protobuf reflection),
//   - the comparison on resume and the "taken from the checkpoint" rule
//     (checkpoint/model_config.cc, train/gpt_flags.cc),
//   - the //train:gpt flags that stand for a Hugging Face config.json
//     (checkpoint/hf/hf_config.cc).
// Execution options (recomputation, grouped GEMMs, the compute dtype, MoE
// capacity and losses) stay in GptConfig: a checkpoint neither records nor
// compares them.

#include <cstdint>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/enum_names.h"

namespace loom::layers {

// --normalization.
enum class Normalization { kLayerNorm, kRMSNorm };
LOOM_ENUM_NAMES(Normalization, {Normalization::kLayerNorm, "LayerNorm"},
                {Normalization::kRMSNorm, "RMSNorm"})
// --position-embedding-type.
enum class PositionEmbedding { kLearnedAbsolute, kRope };
LOOM_ENUM_NAMES(PositionEmbedding, {PositionEmbedding::kLearnedAbsolute, "learned_absolute"},
                {PositionEmbedding::kRope, "rope"})

// X(type, member, default, flag, sense, applies, defining, help):
//   member   the GptArchitecture field.
//   flag     Megatron's flag without dashes, which is also the ModelConfig
//            field of the manifest (checkpoint/checkpoint.proto).
//   sense    Same, or Negate where the flag is the member's negation
//            (--disable-bias-linear sets add_bias_linear = false).
//   applies  whether the field is part of the model: Always, IfRope, IfMoe,
//            IfGqa, or Recorded (saved and taken on resume, never compared:
//            it does not change the function).
//   defining the expression (on the architecture) that is saved and
//            compared: the member, or its effective value where 0 means
//            "the default" (ffn(), max_positions(), query_groups()).
// Order: as //train:gpt's help and the Hugging Face flags list them.
#define LOOM_GPT_ARCHITECTURE_FIELDS(X)                                                        \
  X(int64_t, num_layers, 2, num_layers, Same, Always, num_layers, "Transformer layers")        \
  X(int64_t, hidden_size, 64, hidden_size, Same, Always, hidden_size, "Hidden size")           \
  X(int64_t, num_attention_heads, 4, num_attention_heads, Same, Always, num_attention_heads,   \
    "Attention heads")                                                                         \
  X(int64_t, ffn_hidden_size, 0, ffn_hidden_size, Same, Always, ffn(),                         \
    "MLP hidden size (0: 4 x hidden; with --swiglu int(8 x hidden / 3 / 64) x 64)")            \
  X(int64_t, seq_length, 32, seq_length, Same, Always, seq_length, "Tokens per sample")        \
  X(int64_t, max_position_embeddings, 0, max_position_embeddings, Same, Always,                \
    max_positions(), "Position table size (0: --seq-length)")                                  \
  X(int64_t, make_vocab_size_divisible_by, 128, make_vocab_size_divisible_by, Same, Recorded,  \
    make_vocab_size_divisible_by, "Pad the vocabulary to a multiple of this x TP")             \
  X(Normalization, normalization, Normalization::kLayerNorm, normalization, Same, Always,       \
    normalization, "LayerNorm | RMSNorm (weight only)")                                        \
  X(float, layernorm_epsilon, 1e-5f, norm_epsilon, Same, Always, layernorm_epsilon,            \
    "Epsilon of LayerNorm / RMSNorm")                                                          \
  X(PositionEmbedding, position_embedding_type, PositionEmbedding::kLearnedAbsolute,           \
    position_embedding_type, Same, Always, position_embedding_type,                            \
    "learned_absolute (a position table) | rope (rotary q and k, no position table)")          \
  X(float, rotary_base, 10000.0f, rotary_base, Same, IfRope, rotary_base, "RoPE base (theta)") \
  X(float, rotary_percent, 1.0f, rotary_percent, Same, IfRope, rotary_percent,                 \
    "Share of each head's dims RoPE rotates")                                                  \
  X(bool, swiglu, false, swiglu, Same, Always, swiglu,                                         \
    "SwiGLU MLP: silu(gate) * up (--ffn-hidden-size 0: int(8 x hidden / 3 / 64) x 64)")        \
  X(bool, group_query_attention, false, group_query_attention, Same, Always,                   \
    group_query_attention, "Grouped-query attention: --num-query-groups K/V heads")            \
  X(int64_t, num_query_groups, 1, num_query_groups, Same, IfGqa, query_groups(),               \
    "K/V heads with --group-query-attention (divides --num-attention-heads; TP divides it)")   \
  X(bool, untie_embeddings_and_output_weights, false, untie_embeddings_and_output_weights,     \
    Same, Always, untie_embeddings_and_output_weights,                                         \
    "A separate output-layer weight instead of the word embedding")                            \
  X(bool, add_bias_linear, true, disable_bias_linear, Negate, Always, add_bias_linear,         \
    "No biases in the attention and MLP linear layers")                                        \
  X(bool, add_qkv_bias, false, add_qkv_bias, Same, Always, add_qkv_bias,                       \
    "A bias on the query/key/value projection even with --disable-bias-linear (Qwen2)")        \
  X(int64_t, num_experts, 0, num_experts, Same, Always, num_experts,                           \
    "Experts per MoE layer (0: dense MLPs); needs --disable-bias-linear")                      \
  X(int64_t, moe_router_topk, 2, moe_router_topk, Same, IfMoe, moe_router_topk,                \
    "Experts per token")                                                                       \
  X(int64_t, moe_layer_freq, 1, moe_layer_freq, Same, IfMoe, moe_layer_freq,                   \
    "Layer l is an MoE layer when l % N == 0 (1: every layer)")

// The architecture's fields (defaults: GPT-2's) and what follows from them.
struct GptArchitecture {
#define LOOM_DECLARE_FIELD(type, member, default_value, ...) type member = default_value;
  LOOM_GPT_ARCHITECTURE_FIELDS(LOOM_DECLARE_FIELD)
#undef LOOM_DECLARE_FIELD
  int64_t vocab_size = 256;  // from the tokenizer, not a flag

  // Megatron's default with --swiglu keeps the MLP's parameter count near 8h²:
  // int(4h · 2/3 / 64) · 64.
  int64_t ffn() const {
    if (ffn_hidden_size > 0) return ffn_hidden_size;
    return swiglu ? (4 * hidden_size * 2 / 3) / 64 * 64 : 4 * hidden_size;
  }
  int64_t max_positions() const {
    return max_position_embeddings > 0 ? max_position_embeddings : seq_length;
  }
  bool rms_norm() const { return normalization == Normalization::kRMSNorm; }
  bool rope() const { return position_embedding_type == PositionEmbedding::kRope; }
  bool learned_positions() const { return !rope(); }
  bool tied_output_layer() const { return !untie_embeddings_and_output_weights; }
  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  // K/V heads: --num-query-groups with --group-query-attention, else one per head.
  int64_t query_groups() const {
    return group_query_attention ? num_query_groups : num_attention_heads;
  }
  // Leading dims of each head that RoPE rotates: int(head_dim · --rotary-percent).
  int64_t rotary_dim() const {
    return static_cast<int64_t>(static_cast<double>(head_dim()) * rotary_percent);
  }
  bool moe() const { return num_experts > 0; }
  bool moe_layer(int64_t layer) const { return moe() && layer % moe_layer_freq == 0; }
  // The query/key/value projection has a bias: all linear layers do, or only it (Qwen2).
  bool qkv_bias() const { return add_bias_linear || add_qkv_bias; }
};

// One field's value, in the flag's sense (disable_bias_linear, not add_bias_linear);
// an enum's value is its spelling ("RMSNorm"), as the flag and the manifest hold it.
using FieldValue = std::variant<int64_t, float, bool, std::string>;

template <class T>
FieldValue ToFieldValue(const T& v) {
  if constexpr (std::is_enum_v<T>) {
    return FieldValue(std::string(core::EnumName(v)));
  } else {
    return FieldValue(std::in_place_type<T>, v);
  }
}
// The value of `v` as a T; an enum's spelling must be one of its choices
// (else an error naming `flag`: a manifest written by another Loom, or edited).
template <class T>
absl::Status FromFieldValue(const FieldValue& v, absl::string_view flag, T* out) {
  if constexpr (std::is_enum_v<T>) {
    absl::StatusOr<T> e = core::ParseEnum<T>(std::get<std::string>(v), flag);
    if (!e.ok()) return e.status();
    *out = *e;
  } else {
    *out = std::get<T>(v);
  }
  return absl::OkStatus();
}
// An enum's spellings; empty for the other types.
template <class T>
std::vector<std::string> ChoicesOf() {
  std::vector<std::string> names;
  if constexpr (std::is_enum_v<T>) {
    for (const auto& s : Spellings(T{})) names.emplace_back(s.name);
  }
  return names;
}

// One row of LOOM_GPT_ARCHITECTURE_FIELDS, for code that walks them.
struct ArchitectureField {
  absl::string_view flag;  // "num_layers": the flag without dashes, the ModelConfig field
  absl::string_view help;
  bool compared;          // false: Recorded
  bool (*applies)(const GptArchitecture&);
  FieldValue (*get)(const GptArchitecture&);       // the member, in the flag's sense
  FieldValue (*defining)(const GptArchitecture&);  // the saved and compared value
  // Fails only for an enum's spelling that is none of its choices.
  absl::Status (*set)(GptArchitecture&, const FieldValue&);
  std::vector<std::string> choices;  // an enum's spellings; empty otherwise

  std::string dashed() const;  // "--num-layers"
};
const std::vector<ArchitectureField>& ArchitectureFields();
// The field of that flag (underscores or dashes, with or without "--"); null if none.
const ArchitectureField* FindArchitectureField(absl::string_view flag);

// "64", "1e-05", "1000000", "true", "RMSNorm": floats as the shortest decimal
// that reads back as them.
std::string FieldValueString(const FieldValue& v);
// The zero of v's type (0, 0.0f, false, ""): what a field that does not
// apply reads as, and what an absent proto field holds.
FieldValue ZeroLike(const FieldValue& v);
// A value of f's type that differs from v (true for false, the next choice
// of an enum, x + 3 for a number): what the tests set to prove a field is
// read, saved and compared through its row.
FieldValue DifferentValue(const ArchitectureField& f, const FieldValue& v);
// The value compared on resume: the defining value where the field applies,
// else its zero (a dense model's router top-k does not matter).
FieldValue ComparedValue(const ArchitectureField& f, const GptArchitecture& a);

// The vocabulary for the "sense" column.
template <class T>
T Same(T v) {
  return v;
}
inline bool Negate(bool v) { return !v; }
// The "applies" column.
inline bool Always(const GptArchitecture&) { return true; }
inline bool Recorded(const GptArchitecture&) { return true; }
inline bool IfRope(const GptArchitecture& a) { return a.rope(); }
inline bool IfMoe(const GptArchitecture& a) { return a.moe(); }
inline bool IfGqa(const GptArchitecture& a) { return a.group_query_attention; }
// Which of them are compared on resume (all but Recorded).
inline constexpr bool kComparedAlways = true, kComparedRecorded = false, kComparedIfRope = true,
                      kComparedIfMoe = true, kComparedIfGqa = true;

}  // namespace loom::layers

#endif  // LOOM_MODELS_GPT_GPT_ARCHITECTURE_H_
