#ifndef LOOM_PIPELINE_ACTION_H_
#define LOOM_PIPELINE_ACTION_H_

#include <string>

namespace loom::pipeline {

// One step in a pipeline stage's ordered action list.
//
// Compute actions run one model chunk on one micro-batch. Communication actions move the
// tensor that crosses a stage boundary; `chunk` is always the chunk *on this stage* the
// tensor belongs to:
//   kSendActivation(m, c): sends the output of this stage's Forward(m, c)   to `peer`.
//   kRecvActivation(m, c): receives the input of this stage's Forward(m, c) from `peer`.
//   kSendGrad(m, c):       sends the input grad made by Backward(m, c)      to `peer`.
//   kRecvGrad(m, c):       receives the output grad Backward(m, c) needs    from `peer`.
// (With a split backward, read BackwardInput for Backward: it makes the input grad and
// consumes the output grad.)
//
// Split backward (zero-bubble schedules, Qi et al. 2024): Backward(m, c) may instead run as
//   kBackwardInput(m, c)  ("I", torch's name; the paper's B): the input gradient only, the
//                         critical path to the previous stage; needs Forward(m, c) and the
//                         output grad, like Backward;
//   kBackwardWeight(m, c) ("W"): the weight gradients of (m, c); needs BackwardInput(m, c) on the
//                         same stage, earlier in the list, and may be deferred arbitrarily
//                         (nothing else depends on it). A (m, c) runs either Backward or the pair
//                         BackwardInput + BackwardWeight, never both; its activations are held
//                         until Backward or BackwardWeight ends.
// Every send on the channel (src -> dst) is matched, in order, with the receive of the same
// rank on that channel. A maximal run of consecutive communication actions in a list is one
// *batch*: an executor issues it as one batched isend/irecv and waits for all of it.
enum class ActionKind {
  kForward,
  kBackward,
  kSendActivation,
  kRecvActivation,
  kSendGrad,
  kRecvGrad,
  kBackwardInput,   // split backward: input gradient (B in Qi et al.)
  kBackwardWeight,  // split backward: weight gradient (W), deferrable
};

struct Action {
  ActionKind kind = ActionKind::kForward;
  int micro_batch = 0;  // 0 .. M-1
  int chunk = 0;        // model chunk on this stage, 0 .. v-1
  int peer = -1;        // pp rank of the other side; -1 for compute actions

  bool operator==(const Action& o) const {
    return kind == o.kind && micro_batch == o.micro_batch && chunk == o.chunk && peer == o.peer;
  }
  bool operator!=(const Action& o) const { return !(*this == o); }
};

inline bool IsCompute(ActionKind k) {
  return k == ActionKind::kForward || k == ActionKind::kBackward ||
         k == ActionKind::kBackwardInput || k == ActionKind::kBackwardWeight;
}
// Backward, BackwardInput or BackwardWeight.
inline bool IsBackward(ActionKind k) {
  return k == ActionKind::kBackward || k == ActionKind::kBackwardInput ||
         k == ActionKind::kBackwardWeight;
}
inline bool IsSend(ActionKind k) {
  return k == ActionKind::kSendActivation || k == ActionKind::kSendGrad;
}
inline bool IsRecv(ActionKind k) {
  return k == ActionKind::kRecvActivation || k == ActionKind::kRecvGrad;
}
// A send or receive of an activation's gradient (the backward's direction).
inline bool CarriesGrad(ActionKind k) {
  return k == ActionKind::kSendGrad || k == ActionKind::kRecvGrad;
}

inline Action Forward(int micro_batch, int chunk) {
  return {ActionKind::kForward, micro_batch, chunk, -1};
}
inline Action Backward(int micro_batch, int chunk) {
  return {ActionKind::kBackward, micro_batch, chunk, -1};
}

inline Action BackwardInput(int micro_batch, int chunk) {
  return {ActionKind::kBackwardInput, micro_batch, chunk, -1};
}
inline Action BackwardWeight(int micro_batch, int chunk) {
  return {ActionKind::kBackwardWeight, micro_batch, chunk, -1};
}

// Compact form used by the text format: "F3.1" (micro-batch 3, chunk 1), "B3.1", "I3.1"
// (BackwardInput), "W3.1" (BackwardWeight),
// "SA3.1>2" (send activation to stage 2), "RA3.1<0", "SG3.1>0", "RG3.1<2".
std::string ToShortString(const Action& a);
// Long form for error messages: "RecvGrad(micro-batch 3, chunk 1) from stage 2".
std::string ToString(const Action& a);

}  // namespace loom::pipeline

#endif  // LOOM_PIPELINE_ACTION_H_
