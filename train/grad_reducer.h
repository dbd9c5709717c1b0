#ifndef LOOM_TRAIN_GRAD_REDUCER_H_
#define LOOM_TRAIN_GRAD_REDUCER_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "comm/comm.h"
#include "layers/gpt_model.h"

namespace loom::train {

// --overlap-grad-reduce: averages gradients over the data-parallel group
// while the backward is still running. Each transformer layer's parameters
// are one contiguous bucket of the flat gradient buffer; when the layer's
// last backward of the step has run (the M-th call of the model's layer hook),
// its all-reduce starts asynchronously. Finish() reduces what is left (the
// embeddings and final LayerNorm, whose gradients are complete only at the
// end of the step) and waits for everything.
//
// Gradients of one tensor are averaged over DP once, whichever order the
// other reductions (TP sums under SP, the tied-embedding sum) come in: they
// are all linear, so the trainer runs those after Finish().
class OverlappedGradReducer {
 public:
  // Installs the hook on `model`; `dp` may be null or of size 1 (no-op).
  OverlappedGradReducer(layers::GptModel* model, comm::Communicator* dp, int64_t micro_batches);
  ~OverlappedGradReducer();

  // (Re)installs the model hook (the trainer removes it during evaluation).
  void Install();
  void OnLayerBackward(int64_t layer);
  // Reduces the rest of the buffer and waits for every bucket.
  absl::Status Finish();

  int64_t buckets_started_early() const { return early_; }

 private:
  layers::GptModel* model_;
  comm::Communicator* dp_;
  int64_t micro_batches_;
  std::map<int64_t, int64_t> calls_;                 // layer -> backward calls this step
  std::vector<std::pair<int64_t, int64_t>> reduced_;  // ranges started
  std::vector<comm::WorkPtr> works_;
  absl::Status first_error_;
  int64_t early_ = 0;
};

}  // namespace loom::train

#endif  // LOOM_TRAIN_GRAD_REDUCER_H_
