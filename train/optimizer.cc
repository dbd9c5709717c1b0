#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/memory_stats.h"
#include "core/ops/kernel_choice.h"
#include "core/ops/ops.h"
#include "core/status_macros.h"

namespace loom::train {

using core::Shape;
using core::Tensor;

namespace {

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
                                                            const OptimizerGroups& groups,
                                                            std::vector<FlatRange> owned,
                                                            Tensor owned_grads,
                                                            Tensor owned_values) {
  std::unique_ptr<Optimizer> o(new Optimizer(params, config, groups));
  const int64_t n = params->padded_numel();
  if (owned.empty()) owned.push_back({0, n});
  int64_t len = 0, at = 0;
  for (const FlatRange& r : owned) {
    if (r.first < at || r.second < r.first || r.second > n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer: owned range [", r.first, ", ", r.second,
          ") is out of order or outside the parameter buffer (", n, " elements)"));
    }
    at = r.second;
    len += r.second - r.first;
  }
  if (owned_grads.defined() ? owned_grads.numel() < len : !params->flat_grads().defined()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer: no gradients for the ", len, " owned elements (ZeRO-2's owned_grads holds ",
        owned_grads.defined() ? owned_grads.numel() : 0, ")"));
  }
  if (owned_values.defined() ? owned_values.numel() < len : !params->holds_values()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer: no values for the ", len, " owned elements (ZeRO-3's owned_values holds ",
        owned_values.defined() ? owned_values.numel() : 0, ")"));
  }
  o->owned_ = std::move(owned);
  o->owned_grads_ = std::move(owned_grads);
  o->owned_values_ = std::move(owned_values);
  LOOM_ASSIGN_OR_RETURN(o->m_, ZerosOn(std::max<int64_t>(len, 1), params->device()));
  LOOM_ASSIGN_OR_RETURN(o->v_, ZerosOn(std::max<int64_t>(len, 1), params->device()));
  o->BuildRuns();
  return o;
}

void Optimizer::BuildRuns() {
  // Parameters sit back to back in the flat buffer (ParamBuffer), each in a
  // slot padded with zeros that stay zero under AdamW, so runs may span the
  // padding.
  std::vector<Run> norm, expert_norm, update;
  auto add = [](std::vector<Run>* runs, int64_t begin, int64_t end, bool wd) {
    if (!runs->empty() && runs->back().end == begin && runs->back().weight_decay == wd) {
      runs->back().end = end;
    } else {
      runs->push_back({begin, end, 0, wd});
    }
  };
  const std::vector<layers::Param>& ps = params_->params();
  for (size_t i = 0; i < ps.size(); ++i) {
    const layers::ParamHandle h{static_cast<int>(i)};
    const int64_t begin = ps[i].offset, end = params_->SlotEnd(h);
    if (Counted(ps[i])) {
      add(ps[i].spec->expert && SumExpertsOverEp() ? &expert_norm : &norm, begin, end,
          /*wd=*/false);
    }
    add(&update, begin, end, ps[i].spec->weight_decay);
  }
  // Cut to the owned ranges; moments are the owned ranges back to back.
  auto cut = [&](const std::vector<Run>& runs, std::vector<Run>* out) {
    int64_t moment_at = 0;
    for (const FlatRange& r : owned_) {
      for (const Run& run : runs) {
        const int64_t from = std::max(run.begin, r.first), to = std::min(run.end, r.second);
        if (from < to) out->push_back({from, to, moment_at + from - r.first, run.weight_decay});
      }
      moment_at += r.second - r.first;
    }
  };
  cut(norm, &norm_runs_);
  cut(expert_norm, &expert_norm_runs_);
  cut(update, &update_runs_);
}

bool Optimizer::RunsTileOwned() const {
  // Runs lie inside the owned ranges and never overlap (parameter slots are
  // disjoint), so equal lengths mean every owned element is in one run.
  int64_t owned = 0, updated = 0;
  for (const FlatRange& r : owned_) owned += r.second - r.first;
  for (const Run& run : update_runs_) updated += run.end - run.begin;
  return owned == updated;
}

absl::StatusOr<Tensor> Optimizer::GradOf(const Run& run) const {
  if (owned_grads_.defined()) return owned_grads_.Narrow(run.moment_begin, run.end - run.begin);
  return params_->flat_grads().Narrow(run.begin, run.end - run.begin);
}

absl::StatusOr<Tensor> Optimizer::ValueOf(const Run& run) const {
  if (owned_values_.defined()) return owned_values_.Narrow(run.moment_begin, run.end - run.begin);
  return params_->flat_values().Narrow(run.begin, run.end - run.begin);
}

bool Optimizer::Counted(const layers::Param& p) const {
  if (p.spec->split == layers::TpSplit::kReplicated && Rank(groups_.tp) != 0) return false;
  return !p.tied_copy;
}

absl::StatusOr<double> Optimizer::GradNorm() const {
  // Sum of squares of what this rank owns, each parameter counted once.
  const core::Device device = params_->device();
  // The runs' sums accumulate in one f64 on the gradients' device and are
  // read once: one host wait per step on a GPU, not one per run. (The same
  // additions in the same order as summing the runs on the host.)
  auto squares = [&](const std::vector<Run>& runs) -> absl::StatusOr<double> {
    // A reduction's scratch, not optimizer state (the ledger's "other").
    core::MemoryScope scratch(core::MemoryCategory::kOther);
    LOOM_ASSIGN_OR_RETURN(Tensor acc, Tensor::Empty(core::Shape{1}, core::DType::kF64,
                                                    device));
    LOOM_RETURN_IF_ERROR(core::ops::Zero(&acc));
    for (const Run& run : runs) {
      LOOM_ASSIGN_OR_RETURN(Tensor part, GradOf(run));
      LOOM_RETURN_IF_ERROR(core::ops::SumSquaresInto(part, &acc));
    }
    LOOM_ASSIGN_OR_RETURN(const Tensor host, acc.To(core::Device::CPU()));
    return host.data<double>()[0];
  };
  LOOM_ASSIGN_OR_RETURN(double sq, squares(norm_runs_));
  if (SumExpertsOverEp()) {  // each EP rank holds other experts
    LOOM_ASSIGN_OR_RETURN(double experts, squares(expert_norm_runs_));
    LOOM_RETURN_IF_ERROR(comm::AllReduceScalar(groups_.experts, comm::ReduceOp::kSum, &experts));
    sq += experts;
  }
  LOOM_RETURN_IF_ERROR(comm::AllReduceScalar(groups_.shards, comm::ReduceOp::kSum, &sq));
  LOOM_RETURN_IF_ERROR(comm::AllReduceScalar(groups_.tp, comm::ReduceOp::kSum, &sq));
  LOOM_RETURN_IF_ERROR(comm::AllReduceScalar(groups_.pp, comm::ReduceOp::kSum, &sq));
  return std::sqrt(sq);
}

absl::StatusOr<double> Optimizer::Step(float lr) {
  LOOM_ASSIGN_OR_RETURN(const double norm, GradNorm());
  ++step_;
  float scale = 1.0f;
  if (config_.clip_grad > 0 && norm > config_.clip_grad) {
    scale = static_cast<float>(config_.clip_grad / (norm + 1e-6));
  }
  const Tensor& compute = params_->flat_compute();
  LOOM_ASSIGN_OR_RETURN(const core::ops::KernelChoice choice,
                        core::ops::ChooseKernel("adamw", params_->device().type));
  // One pass writing the bf16 compute copy with the update, where there is a
  // copy (--bf16: the GPU's Param::value, the CPU's Param::gemm_value, both
  // ParamBuffer's flat compute buffer) and the runs are exactly the owned
  // ranges; otherwise (f32, or runs not tiling the owned ranges) the
  // unfused update and SyncComputeCopy over the owned ranges.
  const bool fused = choice.implementation == "fused_copy" && compute.defined() && RunsTileOwned();
  for (const Run& run : update_runs_) {
    const int64_t len = run.end - run.begin;
    core::ops::AdamWOptions opts;
    opts.lr = lr;
    opts.beta1 = config_.beta1;
    opts.beta2 = config_.beta2;
    opts.eps = config_.eps;
    opts.weight_decay = run.weight_decay ? config_.weight_decay : 0.0f;
    opts.grad_scale = scale;
    LOOM_ASSIGN_OR_RETURN(Tensor value, ValueOf(run));
    LOOM_ASSIGN_OR_RETURN(Tensor grad, GradOf(run));
    LOOM_ASSIGN_OR_RETURN(Tensor m, m_.Narrow(run.moment_begin, len));
    LOOM_ASSIGN_OR_RETURN(Tensor v, v_.Narrow(run.moment_begin, len));
    if (fused) {
      LOOM_ASSIGN_OR_RETURN(Tensor copy, compute.Narrow(run.begin, len));
      LOOM_RETURN_IF_ERROR(core::ops::AdamWStepWithCopy(&value, grad, &m, &v, step_, opts, &copy));
      continue;
    }
    LOOM_RETURN_IF_ERROR(core::ops::AdamWStep(&value, grad, &m, &v, step_, opts));
  }
  if (fused || owned_values_.defined()) return norm;
  // The bf16 weights the next step computes with (what this rank updated).
  for (const FlatRange& r : owned_) {
    LOOM_RETURN_IF_ERROR(params_->SyncComputeCopy(r.first, r.second));
  }
  return norm;
}

}  // namespace loom::train
