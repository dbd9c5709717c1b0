#include "train/grad_reducer.h"

#include <algorithm>

#include "core/status_macros.h"

namespace loom::train {

OverlappedGradReducer::OverlappedGradReducer(layers::GptModel* model, comm::Communicator* dp,
                                             int64_t micro_batches)
    : model_(model), dp_(dp), micro_batches_(micro_batches) {
  Install();
}

void OverlappedGradReducer::Install() {
  model_->set_layer_grad_hook([this](int64_t layer) { OnLayerBackward(layer); });
}

OverlappedGradReducer::~OverlappedGradReducer() { model_->set_layer_grad_hook(nullptr); }

void OverlappedGradReducer::OnLayerBackward(int64_t layer) {
  if (dp_ == nullptr || dp_->size() == 1) return;
  if (++calls_[layer] != micro_batches_) return;  // not the step's last backward yet
  const auto [begin, end] = model_->LayerRange(layer);
  if (begin < 0) return;
  auto slice = model_->params().flat_grads().Narrow(begin, end - begin);
  if (!slice.ok()) {
    if (first_error_.ok()) first_error_ = slice.status();
    return;
  }
  works_.push_back(dp_->AllReduce(*slice, comm::ReduceOp::kAvg));
  reduced_.emplace_back(begin, end);
  ++early_;
}

absl::Status OverlappedGradReducer::Finish() {
  absl::Status status = first_error_;
  first_error_ = absl::OkStatus();
  if (dp_ != nullptr && dp_->size() > 1) {
    // Everything not yet started: the gaps between the layer buckets.
    std::sort(reduced_.begin(), reduced_.end());
    const int64_t n = model_->params().flat_grads().numel();
    int64_t at = 0;
    std::vector<std::pair<int64_t, int64_t>> rest;
    for (const auto& [b, e] : reduced_) {
      if (b > at) rest.emplace_back(at, b);
      at = std::max(at, e);
    }
    if (at < n) rest.emplace_back(at, n);
    for (const auto& [b, e] : rest) {
      auto slice = model_->params().flat_grads().Narrow(b, e - b);
      if (!slice.ok()) return slice.status();
      works_.push_back(dp_->AllReduce(*slice, comm::ReduceOp::kAvg));
    }
    absl::Status waited = comm::WaitAllOnStream(works_);
    if (status.ok()) status = waited;
  }
  works_.clear();
  reduced_.clear();
  calls_.clear();
  return status;
}

}  // namespace loom::train
