#include "train/data/sft_data.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "train/data/loss_mask.h"

namespace loom::train {

absl::StatusOr<std::string> LossMaskBlendValue(absl::string_view flag, absl::string_view value) {
  if (value.empty()) return std::string();
  absl::StatusOr<BlendSpec> spec = ParseBlend(flag, value);
  if (!spec.ok()) return spec.status();
  if (spec->weights.empty()) return LossMaskPrefix(spec->prefixes[0]);
  std::vector<std::string> entries =
      absl::StrSplit(value, absl::ByAnyChar(" \t\n"), absl::SkipEmpty());
  for (size_t i = 1; i < entries.size(); i += 2) entries[i] = LossMaskPrefix(entries[i]);
  return absl::StrJoin(entries, " ");
}

absl::StatusOr<DataSplits> BuildLossMaskSplits(const DataSplitsOptions& options,
                                               const DataSplits& ids) {
  DataSplitsOptions o = options;
  for (auto [flag, value] : {std::pair{"--data-path", &o.data_path},
                             std::pair{"--train-data-path", &o.train_data_path},
                             std::pair{"--valid-data-path", &o.valid_data_path}}) {
    absl::StatusOr<std::string> masks = LossMaskBlendValue(flag, *value);
    if (!masks.ok()) return masks.status();
    *value = *masks;
  }
  absl::StatusOr<DataSplits> out = BuildDataSplits(o);
  if (!out.ok()) {
    return absl::Status(out.status().code(),
                        absl::StrCat("--sft: the loss masks (<prefix>_loss_mask, written by "
                                     "preprocess_data --sft): ",
                                     out.status().message()));
  }
  if (out->corpora.size() != ids.corpora.size()) {
    return absl::InternalError("--sft: the loss masks open a different number of corpora");
  }
  for (size_t k = 0; k < ids.corpora.size(); ++k) {
    const IndexedDataset& a = *ids.corpora[k];
    const IndexedDataset& m = *out->corpora[k];
    if (a.sequence_lengths() != m.sequence_lengths() || a.document_index() != m.document_index()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--sft: corpus ", k, "'s loss mask has other documents or lengths than its token ids (",
          a.num_documents(), " documents, ", a.total_tokens(), " tokens against ",
          m.num_documents(), ", ", m.total_tokens(),
          "): write both with one preprocess_data --sft run"));
    }
  }
  return out;
}

}  // namespace loom::train
