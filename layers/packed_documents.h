#ifndef LOOM_LAYERS_PACKED_DOCUMENTS_H_
#define LOOM_LAYERS_PACKED_DOCUMENTS_H_

// The documents packed into one micro-batch's sequences (Megatron's
// --reset-position-ids and --reset-attention-mask; train/data/packing.h
// derives them from the EOD tokens). The tables cover the GLOBAL sequence of
// every batch row, [b, seq_len] row-major, so a context-parallel rank looks
// its rows up at their global positions, and a ring block compares its
// queries' document starts with the global positions of the keys it meets.
// The tables are host arrays; a device's kernels read doc_start from the
// copy DeviceDocStart makes there once per micro-batch (the GPU paths run
// only with --allow-unproven-gpu-packing until a device run proves them).

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "core/status_macros.h"
#include "core/tensor.h"

namespace loom::layers {

// Device copies of a host i32 table, one per device, each made on first use
// and kept while the owner lives (thread-safe: the pipeline's stages may ask
// at once; a pointer handed out stays valid). Copying the owner starts an
// empty cache, as the copy's tables may then change.
class DeviceTableCache {
 public:
  DeviceTableCache() = default;
  DeviceTableCache(const DeviceTableCache&) {}
  DeviceTableCache& operator=(const DeviceTableCache&) {
    std::lock_guard<std::mutex> lock(mu_);
    copies_.clear();
    return *this;
  }

  // `host` on `device`; null for the CPU or an empty table.
  absl::StatusOr<const int32_t*> Get(const std::vector<int32_t>& host, core::Device device) const {
    if (host.empty() || device.is_cpu()) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    for (const core::Tensor& t : copies_) {
      if (t.device() == device) return t.data<int32_t>();
    }
    core::Tensor staged, copy;
    LOOM_ASSIGN_OR_RETURN(staged, core::Tensor::Empty(
                                      core::Shape{static_cast<int64_t>(host.size())},
                                      core::DType::kI32));
    std::copy(host.begin(), host.end(), staged.data<int32_t>());
    LOOM_ASSIGN_OR_RETURN(copy, staged.To(device));
    copies_.push_back(copy);
    return copy.data<int32_t>();
  }

 private:
  mutable std::mutex mu_;
  mutable std::vector<core::Tensor> copies_;
};

struct PackedDocuments {
  int64_t seq_len = 0;  // global s
  int64_t batch = 0;    // b
  // position[bi * seq_len + i]: the position id of token i of row bi (the
  // learned position table's row, RoPE's angle). Empty: i.
  std::vector<int32_t> position;
  // doc_start[bi * seq_len + i]: the first position of token i's document;
  // query i attends to keys doc_start..i only. Empty: causal over the row.
  std::vector<int32_t> doc_start;
  // loss_weight[bi * seq_len + i]: the weight of token i's loss in the mean
  // over the s·b tokens (--eod-mask-loss: mask · s·b / sum of the mask, so
  // that mean, and under CP the ranks' mean of their means, is Megatron's
  // masked mean). Empty: 1. Copied to the loss's device by GptModel.
  std::vector<float> loss_weight;

  // doc_start on `device` (AttentionDropout::device_doc_start): copied on
  // the first call and kept with the tables, so once per micro-batch however
  // many layers, recomputations and backward passes read it. Null on the CPU
  // or without document starts.
  absl::StatusOr<const int32_t*> DeviceDocStart(core::Device device) const {
    return doc_start_on_device_.Get(doc_start, device);
  }

  DeviceTableCache doc_start_on_device_;
};

}  // namespace loom::layers

#endif  // LOOM_LAYERS_PACKED_DOCUMENTS_H_
