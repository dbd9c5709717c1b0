#include "checkpoint/export.h"

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

}  // namespace

absl::Status ExportSafetensors(const std::string& iter_dir, const std::string& out_dir) {
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(iter_dir));
  const ModelConfig& m = reader->manifest().model();
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

  // safetensors (F32): u64 header length, JSON header, then the raw data.
  std::vector<hf::NamedTensor> tensors;
  tensors.reserve(outs.size());
  for (const Out& o : outs) tensors.push_back(hf::NamedTensor::FromF32(o.name, o.shape, o.data));
  LOOM_RETURN_IF_ERROR(MakeDirs(out_dir));
  LOOM_RETURN_IF_ERROR(hf::WriteSafetensors(JoinPath(out_dir, "model.safetensors"), tensors));

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
      {"layer_norm_epsilon", m.layernorm_epsilon()},
      {"initializer_range", m.init_method_std()},
      {"resid_pdrop", 0.0},
      {"embd_pdrop", 0.0},
      {"attn_pdrop", 0.0},
      {"tie_word_embeddings", true},
      {"torch_dtype", "float32"},
  };
  return WriteFileAtomically(JoinPath(out_dir, "config.json"), config.dump(2) + "\n");
}

}  // namespace loom::checkpoint
