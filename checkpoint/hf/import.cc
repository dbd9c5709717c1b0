#include "checkpoint/hf/import.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/convert.h"
#include "checkpoint/file_util.h"
#include "checkpoint/rank_state.h"
#include "checkpoint/writer.h"
#include "core/status_macros.h"
#include "models/gpt/hf_tensor_map.h"

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

}  // namespace

layers::GptConfig GptConfigFromHf(const HfModelConfig& hf, int64_t seq_length) {
  layers::GptConfig c;
  static_cast<layers::GptArchitecture&>(c) = hf;  // the architecture, field for field
  c.seq_length = seq_length > 0 ? seq_length : std::min<int64_t>(hf.max_position_embeddings, 1024);
  // Mixtral: every layer MoE (hf_config), dropless (capacity 0).
  if (hf.moe()) c.moe_aux_loss_coeff = static_cast<float>(hf.moe_aux_loss_coeff);
  return c;
}

absl::StatusOr<std::vector<LoomTensor>> LoomTensorsFromHf(const HfModelConfig& hf,
                                                          const layers::GptConfig& c,
                                                          const TensorSet& tensors) {
  Source src(tensors, hf.path);
  LOOM_ASSIGN_OR_RETURN(const HfFamily family, HfFamilyOf(hf.model_type));
  // GPT-2's names as GPT2LMHeadModel saves them, or as GPT2Model does.
  const std::string gpt2_prefix = src.Has("transformer.wte.weight") ? "transformer." : "";
  const std::vector<HfMapEntry> table = HfTensorMap(family, c, gpt2_prefix);
  absl::Status covers = CheckCoversModel(table, c, hf.architecture);
  if (!covers.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(hf.path, ": ", covers.message()));
  }
  std::vector<LoomTensor> out;
  for (const HfMapEntry& e : table) {
    std::vector<std::vector<float>> parts;
    for (const HfTensorSpec& t : e.hf) {
      LOOM_ASSIGN_OR_RETURN(std::vector<float> x, src.Take(t.name, t.shape));
      parts.push_back(std::move(x));
    }
    LOOM_ASSIGN_OR_RETURN(std::vector<float> data, e.transform.ToLoom(std::move(parts)));
    out.push_back(LoomTensor{e.loom_name, e.loom_shape, std::move(data)});
  }
  // A tied model may still store lm_head: it must be the word embedding.
  if (c.tied_output_layer() && src.Has("lm_head.weight")) {
    LOOM_ASSIGN_OR_RETURN(std::vector<float> head, src.Take("lm_head.weight", {c.vocab_size, c.hidden_size}));
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
  const std::vector<layers::ParamSpec> specs = layers::ModelParamSpecs(model);
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
