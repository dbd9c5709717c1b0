#ifndef LOOM_PIPELINE_P2P_H_
#define LOOM_PIPELINE_P2P_H_

// Point-to-point between pipeline stages over the collective interface
// (comm/comm.h), Megatron's p2p_communication: one run of consecutive
// communication actions of a schedule becomes ONE BatchSendRecv.
//
// Messages are matched by tag, not by arrival order: with P = 2 (and on the
// wrap-around link of interleaved schedules) activations and grads travel
// between the same pair of ranks in different orders. The tag names
//   (is_grad, micro_batch, consumer virtual stage)
// which is unique within a step, so any posting order matches.
//
// Shapes are agreed once from the model config, never sent with a message:
// every boundary tensor is BoundaryShape's [s/cp (/tp under sequence
// parallelism), b, h], in the dtype and on the device the caller gives
// StageP2P: the executor passes the activations' dtype, which is the model's
// compute dtype on a GPU (bf16 under --bf16) but always f32 on the CPU, where
// --bf16 changes only the GEMMs' operands (layers/params.h, gemm_value).
// Receive buffers are allocated by the caller (AllocateBoundary) and must stay
// alive until Exchange returns.

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/comm.h"
#include "core/shape.h"
#include "core/tensor.h"
#include "layers/tp_group.h"
#include "models/gpt/gpt_config.h"
#include "pipeline/action.h"
#include "pipeline/layer_assignment.h"

namespace loom::pipeline {

// The shape of every activation / grad crossing a stage boundary:
// [s / tp if sequence parallel else s, micro_batch_size, hidden_size] with
// s = seq_length / cp (a context-parallel rank's two chunks). The GPT
// family's boundary: GptModel::BoundaryShape is the same formula, and the
// executor takes its model's (StageModel::BoundaryShape).
core::Shape BoundaryShape(const layers::GptConfig& config, const layers::TpGroup& tp,
                          int64_t micro_batch_size, int cp = 1);

// The virtual stage that consumes the tensor moved by communication action `a`
// of stage `pp_rank` (P = pp): activations flow to virtual stage +1, grads to -1;
// a receive's consumer is the receiving (pp_rank, a.chunk) itself. `v_shape`:
// zbv's placement (chunk 0 of stage r is virtual stage r, chunk 1 is 2P − 1 − r;
// schedule.h's VirtualStageOf), else Megatron's c·P + r.
int ConsumerVirtualStage(const Action& a, int pp, int pp_rank, bool v_shape = false);

// tag = (micro_batch · num_virtual_stages + consumer_virtual_stage) · 2 + is_grad.
int MessageTag(bool is_grad, int micro_batch, int consumer_virtual_stage, int num_virtual_stages);

// OK iff every tag of a step with `micro_batches` micro-batches and P·v virtual
// stages stays below comm::kMaxTag; the error names --micro-batches and the stages.
absl::Status CheckTagRange(int micro_batches, int num_virtual_stages);

// Buffered sends for the schedules that need them (NeedsBufferedSends: the V of zbv and
// dualpipev, interleaved with G > P). Under the communicator's contract a send may complete only
// once its receive is posted, and a BatchSendRecv holds back the ops issued after it; those
// schedules' lists deadlock then (a stage's batch with a lone send waits for a peer that waits
// in its own batch). So every (sender, receiver, kind) link of the schedule gets its own
// two-rank communicator split from pp: a send in flight holds back only later sends on its own
// link, which its receiver takes in the same order (per link, activations and gradients each
// move in micro-batch order); the stage waits for its receives, and for its sends only at the
// end of the step. That is the simulator's eager mode with tagged channels.
class BufferedLinks {
 public:
  // Collective over pp (every stage calls it with the same schedule): one Split per link.
  static absl::StatusOr<std::unique_ptr<BufferedLinks>> Create(comm::Communicator* pp,
                                                               const Schedule& schedule);
  // The link's communicator (rank 0 the sender, rank 1 the receiver); null if the schedule
  // has no such link.
  comm::Communicator* Link(int src, int dst, bool is_grad) const;
  int size() const { return static_cast<int>(links_.size()); }

 private:
  std::map<std::tuple<int, int, bool>, std::unique_ptr<comm::Communicator>> links_;
};

// One stage's end of the pipeline links.
class StageP2P {
 public:
  // `pp`: the pipeline-parallel communicator (rank = pp_rank, size = P); may be
  // null when P = 1, where only empty batches are legal. `vp`: chunks per stage.
  // `boundary`: BoundaryShape(...) of this rank; `dtype`/`device`: those of
  // the activations crossing it.
  // `v_shape`: the schedule places chunks in zbv's V (tags follow the placement).
  StageP2P(comm::Communicator* pp, int vp, core::Shape boundary,
           core::DType dtype = core::DType::kF32, core::Device device = core::Device::CPU(),
           bool v_shape = false);

  int pp_rank() const { return pp_ ? pp_->rank() : 0; }
  int pp_size() const { return pp_ ? pp_->size() : 1; }
  const core::Shape& boundary_shape() const { return boundary_; }

  // A fresh tensor of boundary_shape() (activation dtype and device), for a receive.
  absl::StatusOr<core::Tensor> AllocateBoundary() const;

  // One leg of a batch: a send's payload or a receive's (preallocated) buffer.
  struct Leg {
    Action action;  // kSend*/kRecv*, with its peer
    core::Tensor tensor;
  };

  // Posts all legs as one BatchSendRecv and waits for all of it (the
  // communicator's timeout applies). Shapes and dtypes are checked before
  // anything is posted. Errors name the stage and the batch's actions:
  //   "stage 1: RecvGrad(micro-batch 3, chunk 0) from stage 2: <comm status>".
  // With buffered links: each leg on its link; waits for the receives only, the
  // sends (their tensors kept) finish in the background (FinishSends).
  absl::Status Exchange(const std::vector<Leg>& legs);

  // Buffered sends over these links from now on (NeedsBufferedSends).
  void UseBufferedLinks(std::unique_ptr<BufferedLinks> links) { links_ = std::move(links); }
  bool buffered() const { return links_ != nullptr; }
  // Waits for every send still in flight; the executor calls it at the end of a step.
  absl::Status FinishSends();

 private:
  comm::Communicator* pp_;
  int vp_;
  core::Shape boundary_;
  core::DType dtype_;
  core::Device device_;
  bool v_shape_ = false;
  std::unique_ptr<BufferedLinks> links_;
  struct PendingSend {
    comm::WorkPtr work;
    core::Tensor tensor;  // kept until the send is done
    std::string what;     // "SendGrad(micro-batch 3, chunk 0) to stage 2"
  };
  std::vector<PendingSend> pending_;
};

// "RecvGrad(micro-batch 3, chunk 0) from stage 2, SendActivation(...) to stage 2".
std::string DescribeBatch(const std::vector<StageP2P::Leg>& legs);

}  // namespace loom::pipeline

#endif  // LOOM_PIPELINE_P2P_H_
