#ifndef LOOM_LAYERS_STAGE_MODEL_H_
#define LOOM_LAYERS_STAGE_MODEL_H_

// StageModel: what one pipeline rank's model chunks offer to the schedule
// executor (//pipeline:executor), the gradient sync
// (//distributed:gradient_sync), the trainer and the checkpoint (the
// ParamBuffer). A model family implements it (GptModel is the GPT family's);
// those packages see only this interface.
//
// The model only computes: Forward and Backward of one chunk for one
// micro-batch, gradients accumulated into params(). Every reduction across
// ranks (DP, the sequence-parallel sum over TP, the tied parameter across
// pipeline stages) is GradientSync's, a UnitObserver of the model.

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "layers/attention.h"
#include "layers/params.h"
#include "layers/tp_group.h"

namespace loom::layers {

// A contiguous run of layers held by one pipeline stage (a "model chunk";
// interleaved schedules give a stage several). The first chunk of the model
// also takes the token ids (GPT: the token + learned position embedding); the
// last also computes the loss (GPT: final norm, output layer, cross-entropy).
struct ChunkSpec {
  int64_t first_layer = 0;
  int64_t num_layers = 0;
  bool pre_process = true;   // input: token ids i32[s, b]
  bool post_process = true;  // output: the loss
};

// Parameter units, in the order a forward reads them: what data parallelism
// buckets and waits on (//distributed:gradient_sync). GPT's unit ids:
//   kEmbeddingUnit        token (+ position) embedding (a pre_process chunk)
//   0 .. num_layers - 1   transformer layer l (global index)
//   num_layers            the head: final norm + the output layer (the word
//                         embedding when tied, else output_layer.weight)
// Another family numbers its own, in forward order.
inline constexpr int64_t kEmbeddingUnit = -1;
struct ParamUnit {
  int64_t id = 0;
  std::vector<ParamHandle> params;  // read by its forward, accumulated by its backward
};

// Progress callbacks, for data parallelism to overlap its communication with
// the computation. An error stops the forward or backward that called it.
// Follows a model's progress unit by unit (ParamUnit ids): data
// parallelism waits on a unit's parameter gather and starts its gradient
// reduction here, the profiler draws per-layer spans, a sharded optimizer
// would gather and free a unit's parameters. Each forward of a unit is
// BeforeForward .. AfterForward, each backward BeforeBackward ..
// AfterBackward; a recomputed unit's forward runs again inside its
// backward, after its BeforeBackward (no forward events: the unit is
// already in its backward). A split backward (SplitsBackward) sends a unit's
// BeforeBackward in BackwardInput and its AfterBackward in BackwardWeight,
// once its weight gradients are in. Before-events reach observers in the order they
// were added, after-events in the reverse order, so an observer added later
// nests inside one added earlier (the profiler's layer spans inside
// GradientSync's waits). An error stops the model and is its error.
class UnitObserver {
 public:
  virtual ~UnitObserver() = default;
  virtual absl::Status BeforeForward(int64_t unit);
  virtual absl::Status AfterForward(int64_t unit);
  virtual absl::Status BeforeBackward(int64_t unit);
  virtual absl::Status AfterBackward(int64_t unit);
};
enum class UnitEvent { kBeforeForward, kAfterForward, kBeforeBackward, kAfterBackward };

class StageModel {
 public:
  // What one forward of one chunk keeps for its backward, one per in-flight
  // micro-batch; each family defines its own (GptModel::Saved). Callers hold
  // it by NewActivations()'s pointer and never look inside.
  class Activations {
   public:
    virtual ~Activations() = default;
    // Bytes of the tensors it keeps, for memory accounting.
    virtual int64_t ActivationBytes() const = 0;
    // After a post_process forward whose `loss` was null: the loss as it
    // stays on the model's device, for LossOf (a tensor shares its storage:
    // it may be kept after this Activations is released). Undefined elsewhere.
    virtual core::Tensor DeviceLoss() const = 0;

   protected:
    Activations() = default;
    Activations(const Activations&) = default;
    Activations(Activations&&) = default;
    Activations& operator=(const Activations&) = default;
    Activations& operator=(Activations&&) = default;
  };

  virtual ~StageModel() = default;
  StageModel(const StageModel&) = delete;
  StageModel& operator=(const StageModel&) = delete;

  // This rank's chunks, in the order of their virtual stages.
  virtual const std::vector<ChunkSpec>& chunks() const = 0;
  // An empty record for one Forward of any chunk.
  virtual std::unique_ptr<Activations> NewActivations() const = 0;

  // Forward of chunk `c`. Input: token ids i32[s, b] for a pre_process chunk
  // (s: local_seq_length()), else BoundaryShape(b)'s tensor. Returns a
  // BoundaryShape(b) tensor, or for a post_process chunk an empty tensor
  // with *loss set (the micro-batch's mean loss; `targets` i32[s, b] is used
  // only there). `loss` may be null: then the loss stays on the device in
  // saved->DeviceLoss() (see LossOf), and the host does not wait for the
  // forward's kernels. `saved`: a NewActivations() record of this model.
  // Notifies BeforeForward / AfterForward around each unit it runs.
  virtual absl::StatusOr<core::Tensor> Forward(int c, const core::Tensor& input,
                                               const core::Tensor& targets,
                                               const DropoutStream& dropout,
                                               Activations* saved, double* loss) = 0;
  // The mean loss of a post_process forward whose `loss` was null, from its
  // saved->DeviceLoss() (waits for the forward's kernels).
  virtual absl::StatusOr<double> LossOf(const core::Tensor& device_loss) const = 0;
  // Backward of chunk `c` from the Activations its Forward filled: `dy` is
  // the gradient of its output (ignored for a post_process chunk, which
  // starts from `dloss`, the weight of this micro-batch's mean loss). Returns
  // the gradient of the input (BoundaryShape(b)), or an empty tensor for a
  // pre_process chunk. Gradients accumulate into params(); notifies
  // BeforeBackward before a unit's backward (and its recomputed forward)
  // reads its parameters, AfterBackward once its gradients are accumulated.
  virtual absl::StatusOr<core::Tensor> Backward(int c, const core::Tensor& dy, float dloss,
                                                const DropoutStream& dropout,
                                                const Activations& saved) = 0;

  // Split backward (zero-bubble pipeline schedules, pipeline/action.h): whether this model
  // can run Backward as BackwardInput (the input gradient only, returned as Backward returns
  // it) followed, possibly much later, by BackwardWeight (the parameter gradients, accumulated
  // into params() as Backward does), with Backward's results. `saved` carries what the weight
  // half needs between the two. Default: no; the pipeline executor then runs the full
  // Backward at BackwardInput and nothing at BackwardWeight: the same numbers, but none of the
  // bubble the split saves.
  virtual bool SplitsBackward() const { return false; }
  virtual absl::StatusOr<core::Tensor> BackwardInput(int c, const core::Tensor& dy, float dloss,
                                                     const DropoutStream& dropout,
                                                     Activations& saved) {
    (void)c, (void)dy, (void)dloss, (void)dropout, (void)saved;
    return absl::UnimplementedError("this StageModel does not split its backward");
  }
  virtual absl::Status BackwardWeight(int c, const DropoutStream& dropout, Activations& saved) {
    (void)c, (void)dropout, (void)saved;
    return absl::UnimplementedError("this StageModel does not split its backward");
  }

  // Rows of this rank's token ids and targets (GPT: --seq-length /
  // --context-parallel-size).
  virtual int64_t local_seq_length() const = 0;
  // The activation (and its gradient) crossing a pipeline-stage boundary for
  // `micro_batch_size` sequences: its shape, dtype and device (also where the
  // losses live).
  virtual core::Shape BoundaryShape(int64_t micro_batch_size) const = 0;
  virtual core::DType boundary_dtype() const = 0;
  virtual core::Device device() const = 0;

  // All of this rank's parameters, in one ParamBuffer.
  virtual ParamBuffer& params() = 0;
  virtual const ParamBuffer& params() const = 0;
  // This rank's parameter units, in forward order.
  virtual const std::vector<ParamUnit>& units() const = 0;
  // The unit of the output layer (the first that a backward runs), for the
  // trainer's timers.
  virtual int64_t head_unit() const = 0;
  // A parameter that the first and the last pipeline stage both hold (GPT:
  // the word embedding tied to the output layer; on a last stage that does
  // not also hold the first, a Param::tied_copy), whose two gradients
  // GradientSync sums over the embedding group when tied_word_embedding().
  // Invalid where this rank holds none.
  virtual ParamHandle word_embedding() const = 0;
  virtual bool tied_word_embedding() const = 0;
  // A post_process forward's logits over the whole vocabulary, [s, b, V]
  // (unpadded) as f32 on the host, from the Activations that forward filled:
  // what text generation samples from. Unimplemented for a family that is no
  // language model.
  virtual absl::StatusOr<core::Tensor> GatherLogits(const Activations& saved) const;

  // The tensor-parallel group: under sequence parallelism GradientSync sums
  // the gradients of the ParamSpec::sequence_parallel_grad parameters over it
  // (AllReduceSequenceParallelGrads).
  virtual const TpGroup& tp() const = 0;

  // Observers of the units' progress (not owned; each added once, removed
  // before it goes).
  void AddObserver(UnitObserver* observer);
  void RemoveObserver(UnitObserver* observer);
  const std::vector<UnitObserver*>& observers() const { return observers_; }

 protected:
  StageModel() = default;
  // What a family calls around each unit: `event` to every observer in the
  // order above; the first error stops it.
  absl::Status Notify(UnitEvent event, int64_t unit) const;

 private:
  std::vector<UnitObserver*> observers_;
};

// Under sequence parallelism, all-reduces (sum) over TP the gradients of the
// replicated parameters that saw only s/p rows (ParamSpec::
// sequence_parallel_grad: LayerNorm, row-parallel bias, position embedding),
// restricted to the flat ranges `ranges` of the buffer (every TP rank passes
// the same ranges: their buffers have one layout). A no-op without SP.
// Collective over TP.
absl::Status AllReduceSequenceParallelGrads(const TpGroup& tp, ParamBuffer* params,
                                            const std::vector<std::pair<int64_t, int64_t>>& ranges);

}  // namespace loom::layers

#endif  // LOOM_LAYERS_STAGE_MODEL_H_
