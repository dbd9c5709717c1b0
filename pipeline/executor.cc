#include "pipeline/executor.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "pipeline/layer_assignment.h"

namespace loom::pipeline {

using core::Tensor;
using layers::StageModel;

namespace {

using Key = std::pair<int, int>;  // (micro_batch, chunk)

absl::Status Prefix(int stage, const Action& a, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("stage ", stage, ": ", ToString(a), ": ", s.message()));
}

absl::Status CheckIds(const char* what, const Tensor& t, int64_t s, int64_t b, int m) {
  if (!t.defined() || t.dtype() != core::DType::kI32 || t.rank() != 2 || t.dim(0) != s ||
      t.dim(1) != b) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MicroBatchSource gave ", what, " ", t.defined() ? t.DebugString() : "(none)",
        " for micro-batch ", m, ", expected i32[", s, ", ", b,
        "] (--seq-length, --micro-batch-size)"));
  }
  return absl::OkStatus();
}

}  // namespace

Executor::Executor(const Schedule& schedule, StageModel* model, comm::Communicator* pp,
                   const ExecutorOptions& options, core::Shape boundary)
    : schedule_(schedule),
      model_(model),
      pp_(pp),
      options_(options),
      pp_rank_(pp ? pp->rank() : 0),
      p2p_(pp, schedule.options.vp, boundary, model->boundary_dtype(), model->device(),
           IsVShape(schedule.options.kind)) {}

absl::StatusOr<Executor> Executor::Create(const Schedule& schedule, StageModel* model,
                                          comm::Communicator* pp,
                                          const ExecutorOptions& options) {
  const int P = schedule.options.pp, v = schedule.options.vp, M = schedule.options.micro_batches;
  if (model == nullptr) return absl::InvalidArgumentError("pipeline executor: no model");
  if (P < 1 || v < 1 || static_cast<int>(schedule.stages.size()) != P) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline executor: the schedule has ", schedule.stages.size(), " stage lists for --pipeline-model-parallel-size ",
        P, "; build it with BuildSchedule"));
  }
  if (P > 1 && (pp == nullptr || pp->size() != P)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline executor: the schedule has --pipeline-model-parallel-size ", P,
        " but the pp communicator has ", pp ? pp->size() : 0,
        " ranks; pass ParallelGroups::pp of the same grid"));
  }
  if (P == 1 && pp != nullptr && pp->size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline executor: a 1-stage schedule with a pp communicator of ", pp->size(), " ranks"));
  }
  if (options.micro_batch_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline executor: --micro-batch-size ",
                                                   options.micro_batch_size, " must be >= 1"));
  }
  const int rank = pp ? pp->rank() : 0;
  const auto& chunks = model->chunks();
  if (static_cast<int>(chunks.size()) != v) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline executor, stage ", rank, ": the model holds ", chunks.size(),
        " chunk(s) but the schedule runs --virtual-pipeline-model-parallel-size ", v,
        " chunks per stage; create the model with one ChunkSpec per chunk (LayersOf)"));
  }
  for (int c = 0; c < v; ++c) {
    const int vs = VirtualStageOf(schedule.options, rank, c);
    const bool want_pre = vs == 0, want_post = vs == P * v - 1;
    if (chunks[c].pre_process != want_pre || chunks[c].post_process != want_post) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pipeline executor, stage ", rank, ": chunk ", c, " (virtual stage ", vs, " of ", P * v,
          ") has pre_process=", chunks[c].pre_process, " post_process=", chunks[c].post_process,
          ", expected pre_process=", want_pre, " post_process=", want_post));
    }
  }
  bool has_backward = false;
  for (const Action& a : schedule.stages[rank]) {
    has_backward |= IsBackward(a.kind);
    if (a.micro_batch < 0 || a.micro_batch >= M || a.chunk < 0 || a.chunk >= v) {
      return absl::InvalidArgumentError(absl::StrCat("pipeline executor, stage ", rank, ": ",
                                                     ToString(a), " outside M = ", M, ", v = ", v));
    }
    if (IsCompute(a.kind)) continue;
    const int own = VirtualStageOf(schedule.options, rank, a.chunk);
    const bool upstream = a.kind == ActionKind::kRecvActivation || a.kind == ActionKind::kSendGrad;
    const int other = upstream ? own - 1 : own + 1;
    if (other < 0 || other >= P * v || a.peer != PlacementOf(schedule.options, other).pp_rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pipeline executor, stage ", rank, ": ", ToString(a),
          " does not connect to the adjacent virtual stage ", other, " of ", P * v));
    }
  }
  if (has_backward == options.forward_only) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline executor, stage ", rank, ": ",
        options.forward_only ? "forward_only with a schedule that runs backwards (use "
                               "BuildForwardOnlySchedule)"
                             : "a training step needs a schedule with backwards (BuildSchedule)"));
  }
  LOOM_RETURN_IF_ERROR(CheckTagRange(M, P * v));
  const core::Shape boundary = model->BoundaryShape(options.micro_batch_size);
  Executor executor(schedule, model, pp, options, boundary);
  if (P > 1 && NeedsBufferedSends(schedule.options)) {
    LOOM_ASSIGN_OR_RETURN(std::unique_ptr<BufferedLinks> links,
                          BufferedLinks::Create(pp, schedule));
    executor.p2p_.UseBufferedLinks(std::move(links));
  }
  return executor;
}

absl::StatusOr<StepResult> Executor::RunStep(const MicroBatchSource& source) {
  const int P = schedule_.options.pp, v = schedule_.options.vp, M = schedule_.options.micro_batches;
  const int me = pp_rank_;
  const int64_t s = model_->local_seq_length(), b = options_.micro_batch_size;
  const auto& chunks = model_->chunks();
  const std::vector<Action>& actions = schedule_.stages[me];

  std::map<int, MicroBatch> batches;     // fetched, until the last backward of m here
  std::map<int, int> backwards_done;     // per micro-batch, of v chunks
  // Forward done, backward not yet.
  std::map<Key, std::unique_ptr<StageModel::Activations>> saved;
  std::map<Key, Tensor> outputs;         // forward outputs awaiting SendActivation
  std::map<Key, Tensor> inputs;          // received activations awaiting Forward
  std::map<Key, Tensor> input_grads;     // backward results awaiting SendGrad
  std::map<Key, Tensor> output_grads;    // received grads awaiting Backward
  std::map<Key, int64_t> saved_bytes;
  std::vector<int> live(v, 0);
  StepResult result;
  result.peak_live_saved.assign(v, 0);
  int64_t bytes = 0;
  std::vector<Tensor> loss_sums(M);  // per micro-batch, on the model's device; set by its forward
  // Split backward: the model runs BackwardInput/BackwardWeight (else the full Backward at I).
  const bool split = model_->SplitsBackward();
  std::set<Key> input_done;  // BackwardInput ran, BackwardWeight not yet
  auto vs_of = [&](int chunk) { return VirtualStageOf(schedule_.options, me, chunk); };

  auto get_batch = [&](int m) -> absl::StatusOr<const MicroBatch*> {
    auto it = batches.find(m);
    if (it != batches.end()) return &it->second;
    absl::StatusOr<MicroBatch> mb = source(m);
    if (!mb.ok()) {
      return absl::Status(mb.status().code(), absl::StrCat("MicroBatchSource(", m, "): ",
                                                           mb.status().message()));
    }
    return &batches.emplace(m, *std::move(mb)).first->second;
  };

  auto forward = [&](const Action& a) -> absl::Status {
    const Key key{a.micro_batch, a.chunk};
    const layers::ChunkSpec& spec = chunks[a.chunk];
    LOOM_ASSIGN_OR_RETURN(const MicroBatch* mb, get_batch(a.micro_batch));
    Tensor input;
    if (spec.pre_process) {
      LOOM_RETURN_IF_ERROR(CheckIds("ids", mb->ids, s, b, a.micro_batch));
      input = mb->ids;
    } else {
      // From a receive, or (zbv's turn of the V) the previous virtual stage's output here.
      const StageChunk prev = PlacementOf(schedule_.options, vs_of(a.chunk) - 1);
      std::map<Key, Tensor>& from = prev.pp_rank == me ? outputs : inputs;
      auto it = from.find(prev.pp_rank == me ? Key{a.micro_batch, prev.chunk} : key);
      if (it == from.end()) {
        return absl::InternalError("the schedule runs it before receiving its input activation");
      }
      input = std::move(it->second);
      from.erase(it);
    }
    if (spec.post_process) LOOM_RETURN_IF_ERROR(CheckIds("targets", mb->targets, s, b, a.micro_batch));
    if (saved.count(key)) return absl::InternalError("the schedule runs this forward twice");
    StageModel::Activations& record = *(saved[key] = model_->NewActivations());
    // The loss stays on the device until the step ends: reading it back here
    // would make the host wait for every micro-batch's forward on a GPU.
    absl::StatusOr<Tensor> out =
        model_->Forward(a.chunk, input, mb->targets, mb->dropout, &record, nullptr);
    if (!out.ok()) {
      saved.erase(key);
      return out.status();
    }
    if (spec.post_process) {
      loss_sums[a.micro_batch] = record.DeviceLoss();
    } else {
      if (out->shape() != p2p_.boundary_shape()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "output ", out->DebugString(), ", expected ", p2p_.boundary_shape().ToString(),
            " (--seq-length (/tp under SP), --micro-batch-size, --hidden-size)"));
      }
      outputs[key] = *std::move(out);
    }
    const int64_t n = record.ActivationBytes();
    result.peak_activation_bytes = std::max(result.peak_activation_bytes, bytes + n);
    result.peak_live_saved[a.chunk] = std::max(result.peak_live_saved[a.chunk], live[a.chunk] + 1);
    if (options_.forward_only) {  // nothing will read these activations again
      saved.erase(key);
      if (a.chunk == v - 1) batches.erase(a.micro_batch);
      return absl::OkStatus();
    }
    saved_bytes[key] = n;
    bytes += n;
    ++live[a.chunk];
    return absl::OkStatus();
  };

  // Frees (micro-batch, chunk)'s activations once nothing of its backward is left.
  auto release = [&](const Key& key) -> absl::Status {
    saved.erase(key);
    bytes -= saved_bytes[key];
    saved_bytes.erase(key);
    --live[key.second];
    if (++backwards_done[key.first] == v) batches.erase(key.first);
    return absl::OkStatus();
  };

  auto backward = [&](const Action& a) -> absl::Status {
    const Key key{a.micro_batch, a.chunk};
    const layers::ChunkSpec& spec = chunks[a.chunk];
    auto rec = saved.find(key);
    if (rec == saved.end()) return absl::InternalError("the schedule runs it before its forward");
    LOOM_ASSIGN_OR_RETURN(const MicroBatch* mb, get_batch(a.micro_batch));
    Tensor dy;
    if (!spec.post_process) {
      // From a receive, or (zbv's turn of the V) the next virtual stage's input grad here.
      const StageChunk next = PlacementOf(schedule_.options, vs_of(a.chunk) + 1);
      std::map<Key, Tensor>& from = next.pp_rank == me ? input_grads : output_grads;
      auto it = from.find(next.pp_rank == me ? Key{a.micro_batch, next.chunk} : key);
      if (it == from.end()) {
        return absl::InternalError("the schedule runs it before receiving its output gradient");
      }
      dy = std::move(it->second);
      from.erase(it);
    }
    // BackwardInput of a model that splits its backward keeps the record for BackwardWeight;
    // of one that cannot, it runs the full Backward (BackwardWeight is then a no-op).
    const bool keep = a.kind == ActionKind::kBackwardInput && split;
    absl::StatusOr<Tensor> grad =
        keep ? model_->BackwardInput(a.chunk, dy, options_.loss_scale, mb->dropout, *rec->second)
             : model_->Backward(a.chunk, dy, options_.loss_scale, mb->dropout, *rec->second);
    if (!grad.ok()) return grad.status();
    Tensor dx = *std::move(grad);
    if (a.kind == ActionKind::kBackwardInput) input_done.insert(key);
    if (!spec.pre_process) {
      if (dx.shape() != p2p_.boundary_shape()) {
        return absl::InvalidArgumentError(absl::StrCat("input gradient ", dx.DebugString(),
                                                       ", expected ",
                                                       p2p_.boundary_shape().ToString()));
      }
      input_grads[key] = std::move(dx);
    }
    if (keep) return absl::OkStatus();
    return release(key);
  };

  // BackwardWeight: the parameter gradients of a split backward, then the record goes.
  auto weight = [&](const Action& a) -> absl::Status {
    const Key key{a.micro_batch, a.chunk};
    if (input_done.erase(key) == 0) {
      return absl::InternalError("the schedule runs it before its BackwardInput");
    }
    if (!split) return absl::OkStatus();  // the full Backward ran at BackwardInput
    auto rec = saved.find(key);
    if (rec == saved.end()) return absl::InternalError("its activations are gone");
    LOOM_ASSIGN_OR_RETURN(const MicroBatch* mb, get_batch(a.micro_batch));
    LOOM_RETURN_IF_ERROR(model_->BackwardWeight(a.chunk, mb->dropout, *rec->second));
    return release(key);
  };

  for (size_t i = 0; i < actions.size();) {
    const Action& a = actions[i];
    ActionObserver* const observer = options_.observer;
    if (IsCompute(a.kind)) {
      if (observer) observer->Begin(&a, 1);
      absl::Status st = a.kind == ActionKind::kForward          ? forward(a)
                        : a.kind == ActionKind::kBackwardWeight ? weight(a)
                                                                : backward(a);
      if (!st.ok()) return Prefix(me, a, st);
      if (observer) observer->End(&a, 1);
      ++i;
      continue;
    }
    // A maximal run of communication actions: one batch.
    size_t batch_end = i;
    while (batch_end < actions.size() && !IsCompute(actions[batch_end].kind)) ++batch_end;
    const int batch_size = static_cast<int>(batch_end - i);
    if (observer) observer->Begin(&a, batch_size);
    std::vector<StageP2P::Leg> legs;
    for (; i < actions.size() && !IsCompute(actions[i].kind); ++i) {
      const Action& c = actions[i];
      const Key key{c.micro_batch, c.chunk};
      Tensor t;
      if (IsSend(c.kind)) {
        std::map<Key, Tensor>& from = c.kind == ActionKind::kSendActivation ? outputs : input_grads;
        auto it = from.find(key);
        if (it == from.end()) {
          return Prefix(me, c, absl::InternalError("the schedule sends it before computing it"));
        }
        t = it->second;
      } else {
        LOOM_ASSIGN_OR_RETURN(t, p2p_.AllocateBoundary());
      }
      legs.push_back({c, t});
    }
    LOOM_RETURN_IF_ERROR(p2p_.Exchange(legs));
    for (const StageP2P::Leg& leg : legs) {
      const Key key{leg.action.micro_batch, leg.action.chunk};
      switch (leg.action.kind) {
        case ActionKind::kSendActivation: outputs.erase(key); break;
        case ActionKind::kSendGrad: input_grads.erase(key); break;
        case ActionKind::kRecvActivation: inputs[key] = leg.tensor; break;
        case ActionKind::kRecvGrad: output_grads[key] = leg.tensor; break;
        default: break;
      }
    }
    if (observer) observer->End(&a, batch_size);
  }

  LOOM_RETURN_IF_ERROR(p2p_.FinishSends());  // buffered links: the step's last sends
  if (!saved.empty() || !outputs.empty() || !inputs.empty() || !input_grads.empty() ||
      !output_grads.empty() || !input_done.empty()) {
    return absl::InternalError(absl::StrCat(
        "stage ", me, ": the schedule ended with ", saved.size(), " forwards without backward, ",
        input_done.size(), " BackwardInput without BackwardWeight, ",
        outputs.size() + input_grads.size(), " unsent and ", inputs.size() + output_grads.size(),
        " unused received tensors"));
  }

  // Losses live on the stage holding the last virtual stage (post_process chunk).
  const bool has_loss_chunk = chunks[v - 1].post_process;
  if (has_loss_chunk) {
    result.losses.assign(M, 0.0);
    for (int m = 0; m < M; ++m) {
      if (!loss_sums[m].defined()) {
        return absl::InternalError(absl::StrCat("stage ", me, ": no forward of micro-batch ", m,
                                                " through the last chunk"));
      }
      LOOM_ASSIGN_OR_RETURN(result.losses[m], model_->LossOf(loss_sums[m]));
    }
    double sum = 0;
    for (double l : result.losses) sum += l;
    result.mean_loss = M > 0 ? sum / M : 0.0;
  }
  if (P > 1 && options_.broadcast_loss) {
    // A plain collective on pp: collectives match by their place among the
    // communicator's collectives, whatever point-to-point traffic the stages
    // issued before (comm/comm.h, POINT TO POINT).
    LOOM_ASSIGN_OR_RETURN(Tensor host, Tensor::Empty(core::Shape{1}, core::DType::kF64));
    host.data<double>()[0] = result.mean_loss;
    LOOM_ASSIGN_OR_RETURN(Tensor t, host.To(model_->device()));  // NCCL moves device memory
    // The root holds the last virtual stage: P − 1, or stage 0 in zbv's V.
    const int root = PlacementOf(schedule_.options, P * v - 1).pp_rank;
    absl::Status st = pp_->Broadcast(t, root)->WaitOnStream();
    if (!st.ok()) {
      return absl::Status(st.code(), absl::StrCat("stage ", me,
                                                  ": broadcast of the mean loss from stage ",
                                                  root, ": ", st.message()));
    }
    LOOM_ASSIGN_OR_RETURN(host, t.To(core::Device::CPU()));
    result.mean_loss = host.data<double>()[0];
  }
  return result;
}

}  // namespace loom::pipeline
