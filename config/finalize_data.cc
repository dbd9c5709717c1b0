#include <utility>

#include "absl/strings/str_cat.h"
#include "config/finalize.h"
#include "core/status_macros.h"
#include "train/data/blend.h"
#include "train/data/sft_data.h"

namespace loom::train::finalize {
namespace {

// --sft reads a corpus's loss-mask twin beside it (train/data/loss_mask.h).
absl::Status Sft(const TrainConfig& c) {
  if (!c.sft) return absl::OkStatus();
  if (c.mock_data || (c.data_path.empty() && c.train_data_path.empty() &&
                      c.valid_data_path.empty())) {
    return absl::InvalidArgumentError(
        "--sft trains on conversations written by preprocess_data --sft: give their prefix "
        "with --data-path (or --train-data-path / --valid-data-path)");
  }
  for (const auto& [flag, value] : {std::pair<const char*, const std::string&>{"--data-path", c.data_path},
                                    {"--train-data-path", c.train_data_path},
                                    {"--valid-data-path", c.valid_data_path}}) {
    if (value.empty()) continue;
    LOOM_ASSIGN_OR_RETURN(std::string masks, LossMaskBlendValue(flag, value));
    LOOM_ASSIGN_OR_RETURN(BlendSpec blend, ParseBlend(flag, masks));
    absl::Status s = CheckBlendFiles(flag, blend);
    if (!s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--sft: ", s.message(), " (the loss mask preprocess_data --sft writes beside the ids)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Data(const TrainConfig& c) {
  const struct {
    const char* flag;
    const std::string& value;
  } per_split[] = {{"--train-data-path", c.train_data_path},
                   {"--valid-data-path", c.valid_data_path},
                   {"--test-data-path", c.test_data_path}};
  bool any_per_split = false;
  for (const auto& s : per_split) any_per_split = any_per_split || !s.value.empty();
  if (c.mock_data && (!c.data_path.empty() || any_per_split)) {
    return absl::InvalidArgumentError(
        "--mock-data trains on synthetic documents: give it no --data-path or "
        "--train/valid/test-data-path");
  }
  if (!c.data_path.empty() && any_per_split) {
    return absl::InvalidArgumentError(
        "--data-path (one blend, split by --split) or --train-data-path / --valid-data-path / "
        "--test-data-path (one per split), not both");
  }
  if (any_per_split && c.train_data_path.empty() && !c.skip_train && c.train_iters > 0) {
    return absl::InvalidArgumentError(
        "--valid-data-path / --test-data-path without --train-data-path: training needs "
        "--train-data-path (or --skip-train to evaluate only)");
  }
  // Packed documents: the CPU kernels take the document tables; the GPU's
  // (attention with document starts, RoPE at position ids, per-token loss
  // weights) are tested against them but not yet proven on a device, so
  // they run only when asked for (docs/DEVICE_CHECK.md).
  const std::pair<const char*, bool> packing[] = {
      {"--reset-position-ids", c.reset_position_ids},
      {"--reset-attention-mask", c.reset_attention_mask},
      {"--eod-mask-loss", c.eod_mask_loss},
      {"--sft", c.sft}};
  for (const auto& [flag, on] : packing) {
    if (on && c.device != DeviceKind::kCpu && !c.allow_unproven_gpu_packing) {
      return absl::UnimplementedError(absl::StrCat(
          flag, " is not supported with --device=", core::EnumName(c.device),
          " yet: its GPU kernels have not been proven by a device run (docs/DEVICE_CHECK.md); "
          "use --device=cpu, or --allow-unproven-gpu-packing to run them anyway"));
    }
  }
  // Every list parses and every corpus has its .idx and .bin, before any work.
  if (!c.data_path.empty()) {
    LOOM_ASSIGN_OR_RETURN(BlendSpec blend, ParseBlend("--data-path", c.data_path));
    LOOM_RETURN_IF_ERROR(CheckBlendFiles("--data-path", blend));
  }
  for (const auto& s : per_split) {
    if (s.value.empty()) continue;
    LOOM_ASSIGN_OR_RETURN(BlendSpec blend, ParseBlend(s.flag, s.value));
    LOOM_RETURN_IF_ERROR(CheckBlendFiles(s.flag, blend));
  }
  return Sft(c);
}

}  // namespace loom::train::finalize
