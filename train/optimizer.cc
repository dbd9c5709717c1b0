#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/ops/ops.h"
#include "core/status_macros.h"

namespace loom::train {

using core::Shape;
using core::Tensor;

namespace {

int Size(comm::Communicator* c) { return c ? c->size() : 1; }
int Rank(comm::Communicator* c) { return c ? c->rank() : 0; }

// f32 zeros on `device` (optimizer state lives with the parameters).
absl::StatusOr<Tensor> ZerosOn(int64_t n, core::Device device) {
  LOOM_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(Shape{n}, core::DType::kF32, device));
  LOOM_RETURN_IF_ERROR(core::ops::Zero(&t));
  return t;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(layers::ParamBuffer* params,
                                                            const OptimizerConfig& config,
                                                            const OptimizerGroups& groups) {
  std::unique_ptr<Optimizer> o(new Optimizer(params, config, groups));
  const int64_t n = params->padded_numel();
  const int dp = Size(groups.dp);
  if (config.distributed) {
    if (n % dp != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--use-distributed-optimizer: the parameter buffer (", n,
          " elements) is not padded to a multiple of the data-parallel size ", dp));
    }
    o->shard_begin_ = Rank(groups.dp) * (n / dp);
    o->shard_end_ = o->shard_begin_ + n / dp;
    LOOM_ASSIGN_OR_RETURN(o->shard_grads_, ZerosOn(n / dp, params->device()));
  } else {
    o->shard_end_ = n;
  }
  const int64_t len = std::max<int64_t>(o->shard_end_ - o->shard_begin_, 1);
  LOOM_ASSIGN_OR_RETURN(o->m_, ZerosOn(len, params->device()));
  LOOM_ASSIGN_OR_RETURN(o->v_, ZerosOn(len, params->device()));
  o->BuildRuns();
  return o;
}

void Optimizer::BuildRuns() {
  // Parameters sit back to back in the flat buffer (ParamBuffer), in order.
  auto add = [](std::vector<Run>* runs, int64_t begin, int64_t end, bool wd) {
    if (!runs->empty() && runs->back().end == begin && runs->back().weight_decay == wd) {
      runs->back().end = end;
    } else {
      runs->push_back({begin, end, wd});
    }
  };
  for (const layers::Param& p : params_->params()) {
    const int64_t begin = p.offset, end = p.offset + p.grad.numel();
    if (Counted(p)) add(&norm_runs_, begin, end, /*wd=*/false);
    add(&update_runs_, begin, end, p.spec->weight_decay);
  }
}

bool Optimizer::Counted(const layers::Param& p) const {
  if (p.spec->split == layers::TpSplit::kReplicated && Rank(groups_.tp) != 0) return false;
  if (!groups_.count_word_embedding && p.spec->name == "embedding.word_embeddings.weight") {
    return false;
  }
  return true;
}

absl::StatusOr<double> Optimizer::ReduceGradients(bool already_averaged) {
  const Tensor& grads = params_->flat_grads();
  const int64_t n = grads.numel();
  comm::Communicator* dp = groups_.dp;
  if (already_averaged && config_.distributed) {
    return absl::InvalidArgumentError(
        "--overlap-grad-reduce with --use-distributed-optimizer is not supported yet: the "
        "distributed optimizer reduce-scatters the whole buffer at the end of the step");
  }
  if (Size(dp) > 1 && !already_averaged) {
    if (config_.distributed) {
      LOOM_RETURN_IF_ERROR(dp->ReduceScatter(grads, shard_grads_, comm::ReduceOp::kAvg)->WaitOnStream());
    } else {
      // Buckets, all in flight at once, so the transfer of one overlaps the
      // reduction of the next inside the backend.
      const int64_t bucket = std::max<int64_t>(1, config_.bucket_bytes / 4);
      std::vector<comm::WorkPtr> works;
      for (int64_t start = 0; start < n; start += bucket) {
        LOOM_ASSIGN_OR_RETURN(Tensor part, grads.Narrow(start, std::min(bucket, n - start)));
        works.push_back(dp->AllReduce(part, comm::ReduceOp::kAvg));
      }
      LOOM_RETURN_IF_ERROR(comm::WaitAllOnStream(works));
    }
  } else if (config_.distributed) {
    shard_grads_ = grads;
  }
  // Sum of squares of what this rank owns, each parameter counted once.
  double sq = 0;
  for (const Run& run : norm_runs_) {
    const int64_t begin = std::max(run.begin, shard_begin_);
    const int64_t end = std::min(run.end, shard_end_);
    if (begin >= end) continue;
    const Tensor& src = config_.distributed ? shard_grads_ : grads;
    const int64_t base = config_.distributed ? shard_begin_ : 0;
    LOOM_ASSIGN_OR_RETURN(Tensor part, src.Narrow(begin - base, end - begin));
    LOOM_ASSIGN_OR_RETURN(double s, core::ops::SumSquares(part));
    sq += s;
  }
  if (config_.distributed) {
    LOOM_RETURN_IF_ERROR(comm::AllReduceScalar(dp, comm::ReduceOp::kSum, &sq));
  }
  LOOM_RETURN_IF_ERROR(comm::AllReduceScalar(groups_.tp, comm::ReduceOp::kSum, &sq));
  LOOM_RETURN_IF_ERROR(comm::AllReduceScalar(groups_.pp, comm::ReduceOp::kSum, &sq));
  last_norm_ = std::sqrt(sq);
  return last_norm_;
}

absl::Status Optimizer::Step(float lr) {
  ++step_;
  float scale = 1.0f;
  if (config_.clip_grad > 0 && last_norm_ > config_.clip_grad) {
    scale = static_cast<float>(config_.clip_grad / (last_norm_ + 1e-6));
  }
  const Tensor& values = params_->flat_values();
  const Tensor& grads = config_.distributed ? shard_grads_ : params_->flat_grads();
  const int64_t grad_base = config_.distributed ? shard_begin_ : 0;
  for (const Run& run : update_runs_) {
    const int64_t begin = std::max(run.begin, shard_begin_);
    const int64_t end = std::min(run.end, shard_end_);
    if (begin >= end) continue;
    core::ops::AdamWOptions opts;
    opts.lr = lr;
    opts.beta1 = config_.beta1;
    opts.beta2 = config_.beta2;
    opts.eps = config_.eps;
    opts.weight_decay = run.weight_decay ? config_.weight_decay : 0.0f;
    opts.grad_scale = scale;
    LOOM_ASSIGN_OR_RETURN(Tensor value, values.Narrow(begin, end - begin));
    LOOM_ASSIGN_OR_RETURN(Tensor grad, grads.Narrow(begin - grad_base, end - begin));
    LOOM_ASSIGN_OR_RETURN(Tensor m, m_.Narrow(begin - shard_begin_, end - begin));
    LOOM_ASSIGN_OR_RETURN(Tensor v, v_.Narrow(begin - shard_begin_, end - begin));
    LOOM_RETURN_IF_ERROR(core::ops::AdamWStep(&value, grad, &m, &v, step_, opts));
  }
  if (config_.distributed && Size(groups_.dp) > 1) {
    // In-place all-gather: this rank's shard sits at its slot of the buffer.
    LOOM_ASSIGN_OR_RETURN(Tensor shard, values.Narrow(shard_begin_, shard_end_ - shard_begin_));
    LOOM_RETURN_IF_ERROR(groups_.dp->AllGather(shard, values)->WaitOnStream());
  }
  return params_->SyncComputeCopy();  // the bf16 weights the next step computes with
}

}  // namespace loom::train
