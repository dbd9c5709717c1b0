#ifndef LOOM_TRAIN_DATA_SFT_DATA_H_
#define LOOM_TRAIN_DATA_SFT_DATA_H_

// The loss masks of supervised fine-tuning data (loss_mask.h): the same
// splits and blends as the token ids, over each corpus's <prefix>_loss_mask
// twin. The twin has the ids' documents and sequence lengths, so its sample,
// shuffle and blending indices are the ids' own (they are computed from
// those and the seed): sample i of a mask split, read with SampleTokens, is
// the mask of sample i of the ids split, token for token.

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "train/data/blend.h"

namespace loom::train {

// A --data-path style value with each prefix replaced by its loss-mask twin
// (weights kept as written, so they normalise to the same doubles).
absl::StatusOr<std::string> LossMaskBlendValue(absl::string_view flag, absl::string_view value);

// BuildDataSplits(options) over the twins; `ids` are the splits of the ids
// themselves (from the same options). An error names the twin that is
// missing or does not match its corpus (another preprocess run).
absl::StatusOr<DataSplits> BuildLossMaskSplits(const DataSplitsOptions& options,
                                               const DataSplits& ids);

}  // namespace loom::train

#endif  // LOOM_TRAIN_DATA_SFT_DATA_H_
