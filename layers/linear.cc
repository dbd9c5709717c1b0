#include "layers/linear.h"

#include "absl/strings/str_cat.h"
#include "core/ops/kernel_choice.h"
#include "core/ops/ops.h"
#include "core/status_macros.h"
#include "layers/mappings.h"
#include "layers/tp_overlap.h"
#include "layers/weight_grad_store.h"

namespace loom::layers {
namespace {

using core::Shape;
using core::Tensor;
using core::ops::LinearOptions;
using core::ops::MatmulOptions;

// Whether the bias/GELU epilogues ride on the GEMMs for tensors like `t`
// (core/ops/kernel_manifest.textproto, "linear_epilogue").
absl::StatusOr<bool> FusedEpilogue(const Tensor& t) {
  LOOM_ASSIGN_OR_RETURN(const core::ops::KernelChoice c,
                        core::ops::ChooseKernel("linear_epilogue", t.device().type));
  return c.implementation == "cublaslt";
}

// [s, b, h] in the dtype and on the device of `like` (activations follow the input).
absl::StatusOr<Tensor> NewActivation(int64_t s, int64_t b, int64_t h, const Tensor& like) {
  return Tensor::Empty(Shape{s, b, h}, like.dtype(), like.device());
}

absl::Status CheckInput(const char* op, const Tensor& x, const Tensor& weight) {
  const int64_t features = weight.dim(1);
  if (x.rank() != 3 || x.dim(2) != features) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": input ", x.DebugString(),
                                                   ", expected [s, b, ", features, "]"));
  }
  if (x.dtype() != weight.dtype() || x.device() != weight.device()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": input ", x.DebugString(),
                                                   " does not match the weight ",
                                                   weight.DebugString(), " in dtype and device"));
  }
  return absl::OkStatus();
}

// The weight as the GEMMs take it: on the CPU under --bf16 its bf16 compute
// copy (Param::gemm_value; activations and gradients stay f32 and are
// rounded to bf16 inside Matmul, products summed in f32), else its value.
const Tensor& GemmWeight(const Param& w) {
  return w.gemm_value.defined() ? w.gemm_value : w.value;
}

// `o` with the CPU's bf16 GEMM mode on when `w` has a bf16 GEMM copy.
MatmulOptions GemmOptions(const Param& w, MatmulOptions o) {
  o.bf16 = w.gemm_value.defined();
  return o;
}

// dW += dYᵀ·X and db += Σ dY over rows (db may be null); `bf16`: the CPU's
// bf16 GEMM (dW itself accumulates in f32).
absl::Status WeightGrads(const Tensor& dy2, const Tensor& x2, Tensor dw, Tensor* db, bool bf16) {
  LOOM_RETURN_IF_ERROR(
      core::ops::Matmul(dy2, x2, &dw, MatmulOptions{true, false, 1.0f, 1.0f, bf16}));
  if (db != nullptr) LOOM_RETURN_IF_ERROR(core::ops::BiasAddBackward(dy2, db));
  return absl::OkStatus();
}

int64_t Bytes(const Tensor& t) { return static_cast<int64_t>(t.nbytes()); }

}  // namespace

absl::StatusOr<Tensor> As2D(const Tensor& x) {
  return x.Reshape(Shape{x.numel() / x.dim(x.rank() - 1), x.dim(x.rank() - 1)});
}

// ------------------------------------------------------------ column parallel

absl::StatusOr<Tensor> ColumnParallelLinear::Matrix(const Tensor& t) const {
  if (in_features_ <= 0) return t;
  return t.Reshape(Shape{t.numel() / in_features_, in_features_});
}

absl::StatusOr<Tensor> ColumnParallelLinear::Vector(const Tensor& t) const {
  if (t.rank() == 1) return t;
  return t.Reshape(Shape{t.numel()});
}

absl::StatusOr<Tensor> ColumnParallelLinear::BiasGrad() const {
  if (b_ == nullptr) return Tensor();
  return Vector(b_->grad);
}

namespace {

// --tp-comm-overlap without SP has nothing to pipeline: refused, naming the
// flags, before any work (the trainer refuses it first, as Megatron does).
absl::Status CheckOverlap(const char* op, const TpGroup& tp) {
  if (tp.comm_overlap && !tp.sequence_parallel && tp.parallel()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": --tp-comm-overlap needs --sequence-parallel (TpGroup::comm_overlap "
                     "is set without sequence_parallel)"));
  }
  return absl::OkStatus();
}

// Rows [block·n, (block+1)·n) of `t` (a sequence block; undefined stays undefined).
absl::StatusOr<Tensor> Block(const Tensor& t, int block, int64_t n) {
  if (!t.defined()) return t;
  return t.Narrow(block * n, n);
}

}  // namespace

absl::StatusOr<Tensor> ColumnParallelLinear::ForwardRows(const Tensor& x, const Tensor& y,
                                                         const Tensor& act) const {
  LOOM_ASSIGN_OR_RETURN(const Tensor wg, Matrix(GemmWeight(*w_)));
  Tensor y2 = *As2D(y);
  LOOM_ASSIGN_OR_RETURN(const bool fused, FusedEpilogue(x));
  if (fused && b_ != nullptr) {
    // One GEMM with the bias (and GELU, keeping its input) in the epilogue.
    LOOM_ASSIGN_OR_RETURN(const Tensor bias, Vector(b_->value));
    const LinearOptions o{act.defined(), w_->gemm_value.defined()};
    if (!act.defined()) {
      LOOM_RETURN_IF_ERROR(core::ops::LinearForward(*As2D(x), wg, bias, &y2, nullptr, o));
      return y;
    }
    Tensor act2 = *As2D(act);
    LOOM_RETURN_IF_ERROR(core::ops::LinearForward(*As2D(x), wg, bias, &act2, &y2, o));
    return act;
  }
  LOOM_RETURN_IF_ERROR(
      core::ops::Matmul(*As2D(x), wg, &y2, GemmOptions(*w_, MatmulOptions{false, true})));
  if (b_ != nullptr) {
    LOOM_ASSIGN_OR_RETURN(const Tensor bias, Vector(b_->value));
    LOOM_RETURN_IF_ERROR(core::ops::BiasAddForward(y2, bias, &y2));
  }
  if (!act.defined()) return y;
  Tensor out = act;
  LOOM_RETURN_IF_ERROR(core::ops::GeluForward(y, &out));
  return act;
}

absl::StatusOr<Tensor> ColumnParallelLinear::Forward(const Tensor& x, Saved* saved,
                                                     Tensor* pre_gelu) const {
  LOOM_ASSIGN_OR_RETURN(const Tensor w, Matrix(w_->value));
  const int64_t out = w.dim(0);
  LOOM_RETURN_IF_ERROR(CheckInput("ColumnParallelLinear", x, w));
  LOOM_RETURN_IF_ERROR(CheckOverlap("ColumnParallelLinear", tp_));
  const int64_t s = tp_.sequence_parallel ? x.dim(0) * tp_.size() : x.dim(0);
  saved->input = x;  // with SP only the shard is kept
  LOOM_ASSIGN_OR_RETURN(const Tensor y, NewActivation(s, x.dim(1), out, x));
  Tensor act;  // gelu(Y) for the GELU MLP, Y itself then kept in *pre_gelu
  if (pre_gelu != nullptr) {
    LOOM_ASSIGN_OR_RETURN(act, Tensor::Empty(y.shape(), y.dtype(), y.device()));
    *pre_gelu = y;
  }
  if (tp_.ring_overlap()) {
    // Each gathered block's rows through the GEMM while the next block arrives.
    const int64_t n = x.dim(0);
    Tensor full;
    LOOM_RETURN_IF_ERROR(RingAllGatherSeq(
        tp_, x, &full, [&](int block, const Tensor& rows) -> absl::Status {
          LOOM_ASSIGN_OR_RETURN(const Tensor y_rows, Block(y, block, n));
          LOOM_ASSIGN_OR_RETURN(const Tensor act_rows, Block(act, block, n));
          return ForwardRows(rows, y_rows, act_rows).status();
        }));
    return act.defined() ? act : y;
  }
  Tensor full = x;
  if (tp_.sequence_parallel) {
    LOOM_ASSIGN_OR_RETURN(full, AllGatherSeq(tp_, x));  // [s/p, b, in] -> [s, b, in]
  }
  return ForwardRows(full, y, act);
}

absl::StatusOr<Tensor> ColumnParallelLinear::Backward(const Tensor& dy, const Saved& saved,
                                                      bool bias_grad_done) const {
  LOOM_ASSIGN_OR_RETURN(const Tensor w, Matrix(GemmWeight(*w_)));
  LOOM_RETURN_IF_ERROR(CheckOverlap("ColumnParallelLinear", tp_));
  const int64_t in = w.dim(1);
  // SP: start re-gathering the input shard now; it is needed only for dW.
  Tensor full;
  comm::WorkPtr gather = tp_.sequence_parallel ? AllGatherSeqAsync(tp_, saved.input, &full)
                                               : nullptr;
  if (!tp_.sequence_parallel) full = saved.input;
  Tensor dy2 = *As2D(dy);
  Tensor dx_out;
  comm::WorkPtr reduce;
  if (tp_.ring_overlap()) {
    // dX = dY·A block by block, each block's running sum over TP travelling
    // the ring while the next block's GEMM runs (the gather above ahead of it).
    const int64_t n = saved.input.dim(0);
    absl::StatusOr<Tensor> scattered = RingReduceScatterSeq(
        tp_, Shape{n, dy.dim(1), in}, dy, [&](int block, const Tensor& part) -> absl::Status {
          LOOM_ASSIGN_OR_RETURN(const Tensor dy_rows, Block(dy, block, n));
          Tensor part2 = *As2D(part);
          return core::ops::Matmul(*As2D(dy_rows), w, &part2, GemmOptions(*w_, {}));
        });
    const absl::Status gathered = WaitTp(tp_, gather);
    if (!scattered.ok()) return scattered.status();
    LOOM_RETURN_IF_ERROR(gathered);
    dx_out = *scattered;
  } else {
    absl::StatusOr<Tensor> dx = NewActivation(dy.dim(0), dy.dim(1), in, dy);
    if (!dx.ok()) return dx.status();
    Tensor dx2 = *As2D(*dx);
    LOOM_RETURN_IF_ERROR(core::ops::Matmul(dy2, w, &dx2, GemmOptions(*w_, {})));  // dX = dY·A
    LOOM_RETURN_IF_ERROR(WaitTp(tp_, gather));
    // Reduce dX over TP (all-reduce, or reduce-scatter along s with SP) while
    // the weight-gradient GEMM runs.
    reduce = tp_.sequence_parallel ? ReduceScatterSeqAsync(tp_, *dx, &dx_out)
                                   : AllReduceTpAsync(tp_, *dx);
    if (!tp_.sequence_parallel) dx_out = *dx;
  }
  const bool bias_grad = b_ != nullptr && !bias_grad_done;
  LOOM_ASSIGN_OR_RETURN(const bool fused, FusedEpilogue(dy));
  // dW (and db) now, or deferred to a split backward's BackwardWeight with the
  // same operands (layers/weight_grad_store.h); there it keeps dY and, with
  // SP, the gathered input (p times the saved shard).
  const Tensor x2 = *As2D(full);
  const int64_t held = Bytes(dy2) + (tp_.sequence_parallel ? Bytes(x2) : 0);
  LOOM_RETURN_IF_ERROR(WeightGradStore::RunOrDefer(
      [this, dy2, x2, bias_grad, fused]() -> absl::Status {
        LOOM_ASSIGN_OR_RETURN(Tensor dw, Matrix(w_->grad));
        Tensor db;
        if (bias_grad) {
          LOOM_ASSIGN_OR_RETURN(db, Vector(b_->grad));
        }
        const bool bf16 = w_->gemm_value.defined();
        if (fused && bias_grad) {
          return core::ops::LinearBackwardWeight(dy2, x2, &dw, &db, LinearOptions{false, bf16});
        }
        return WeightGrads(dy2, x2, dw, bias_grad ? &db : nullptr, bf16);
      },
      held));
  LOOM_RETURN_IF_ERROR(WaitTp(tp_, reduce));
  return dx_out;
}

// ------------------------------------------------------------ row parallel

absl::Status RowParallelLinear::ForwardRows(const Tensor& x, const Tensor& partial,
                                            bool fused_bias) const {
  Tensor p2 = *As2D(partial);
  if (fused_bias) {
    return core::ops::LinearForward(*As2D(x), GemmWeight(*w_), b_->value, &p2, nullptr,
                                    LinearOptions{false, w_->gemm_value.defined()});
  }
  return core::ops::Matmul(*As2D(x), GemmWeight(*w_), &p2,
                           GemmOptions(*w_, MatmulOptions{false, true}));
}

absl::StatusOr<Tensor> RowParallelLinear::Forward(const Tensor& x, Saved* saved) const {
  const int64_t out = w_->value.dim(0);
  LOOM_RETURN_IF_ERROR(CheckInput("RowParallelLinear", x, w_->value));
  LOOM_RETURN_IF_ERROR(CheckOverlap("RowParallelLinear", tp_));
  saved->input = x;
  // TP size 1: the reduction below is the identity, so the bias may ride on
  // the GEMM; with p ranks it must be added once, after the sum.
  LOOM_ASSIGN_OR_RETURN(const bool fused, FusedEpilogue(x));
  const bool fused_bias = fused && b_ != nullptr && tp_.size() == 1;
  Tensor y;
  if (tp_.ring_overlap()) {
    // Each block's partial product produced while the running sum of the
    // previous block travels the ring.
    if (x.dim(0) % tp_.size() != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("RowParallelLinear: input ", x.DebugString(),
                       " dim 0 is not divisible by the TP size ", tp_.size()));
    }
    const int64_t n = x.dim(0) / tp_.size();
    LOOM_ASSIGN_OR_RETURN(
        y, RingReduceScatterSeq(tp_, Shape{n, x.dim(1), out}, x,
                                [&](int block, const Tensor& part) -> absl::Status {
                                  LOOM_ASSIGN_OR_RETURN(const Tensor rows, Block(x, block, n));
                                  return ForwardRows(rows, part, /*fused_bias=*/false);
                                }));
  } else {
    LOOM_ASSIGN_OR_RETURN(const Tensor partial, NewActivation(x.dim(0), x.dim(1), out, x));
    LOOM_RETURN_IF_ERROR(ForwardRows(x, partial, fused_bias));
    if (tp_.sequence_parallel) {
      LOOM_ASSIGN_OR_RETURN(y, ReduceScatterSeq(tp_, partial));  // -> [s/p, b, out]
    } else {
      LOOM_RETURN_IF_ERROR(AllReduceTp(tp_, partial));
      y = partial;
    }
  }
  if (b_ != nullptr && !fused_bias) {
    Tensor y2 = *As2D(y);
    LOOM_RETURN_IF_ERROR(core::ops::BiasAddForward(y2, b_->value, &y2));
  }
  return y;
}

absl::Status RowParallelLinear::BackwardRows(const Tensor& dy, const Tensor& dx,
                                             const Tensor& pre, const GeluGrad* gelu,
                                             bool fused) const {
  Tensor dy2 = *As2D(dy), dx2 = *As2D(dx);
  const bool bf16 = w_->gemm_value.defined();
  if (gelu != nullptr && fused) {
    // dX = gelu'(pre) ⊙ dY·A in the GEMM's epilogue, with the up-projection's
    // bias gradient (Σ over these rows: the column-parallel layer's full dY).
    Tensor up_db = gelu->up_bias_grad;
    return core::ops::LinearBackwardData(dy2, GemmWeight(*w_), *As2D(pre), &dx2,
                                         up_db.defined() ? &up_db : nullptr,
                                         LinearOptions{true, bf16});
  }
  LOOM_RETURN_IF_ERROR(core::ops::Matmul(dy2, GemmWeight(*w_), &dx2, GemmOptions(*w_, {})));
  if (gelu == nullptr) return absl::OkStatus();
  Tensor out = dx;
  return core::ops::GeluBackward(pre, dx, &out);
}

absl::StatusOr<Tensor> RowParallelLinear::Backward(const Tensor& dy, const Saved& saved,
                                                   const GeluGrad* gelu) const {
  LOOM_RETURN_IF_ERROR(CheckOverlap("RowParallelLinear", tp_));
  LOOM_ASSIGN_OR_RETURN(const bool fused, FusedEpilogue(dy));
  // The bias was added after the reduction: its gradient is Σ dY over this
  // rank's rows (with SP only 1/p of the sequence: the optimizer all-reduces
  // it over TP, see ParamSpec::sequence_parallel_grad). Without SP those rows
  // are the dY the weight-gradient GEMM reads, so its epilogue can sum them.
  const bool fused_bias = fused && b_ != nullptr && !tp_.sequence_parallel;
  if (b_ != nullptr && !fused_bias) {
    LOOM_RETURN_IF_ERROR(core::ops::BiasAddBackward(*As2D(dy), &b_->grad));
  }
  const int64_t in = w_->value.dim(1);
  const int64_t s = tp_.sequence_parallel ? dy.dim(0) * tp_.size() : dy.dim(0);
  LOOM_ASSIGN_OR_RETURN(const Tensor dx, NewActivation(s, dy.dim(1), in, dy));
  const Tensor pre = gelu != nullptr ? *gelu->pre : Tensor();
  Tensor full = dy;
  if (tp_.ring_overlap()) {
    // dX's rows of each gathered dY block while the next block arrives.
    const int64_t n = dy.dim(0);
    LOOM_RETURN_IF_ERROR(RingAllGatherSeq(
        tp_, dy, &full, [&](int block, const Tensor& rows) -> absl::Status {
          LOOM_ASSIGN_OR_RETURN(const Tensor dx_rows, Block(dx, block, n));
          LOOM_ASSIGN_OR_RETURN(const Tensor pre_rows, Block(pre, block, n));
          return BackwardRows(rows, dx_rows, pre_rows, gelu, fused);
        }));
  } else {
    if (tp_.sequence_parallel) {
      LOOM_ASSIGN_OR_RETURN(full, AllGatherSeq(tp_, dy));  // [s/p, b, out] -> [s, b, out]
    }
    LOOM_RETURN_IF_ERROR(BackwardRows(full, dx, pre, gelu, fused));
  }
  if (gelu != nullptr && fused && gelu->up_bias_grad.defined() &&
      gelu->up_bias_grad_done != nullptr) {
    *gelu->up_bias_grad_done = true;
  }
  // Now or at a split backward's BackwardWeight (keeping dY, with SP the gathered one).
  const Tensor dy2 = *As2D(full);
  const Tensor x2 = *As2D(saved.input);
  const bool bf16 = w_->gemm_value.defined();
  LOOM_RETURN_IF_ERROR(WeightGradStore::RunOrDefer(
      [this, dy2, x2, fused_bias, bf16]() -> absl::Status {
        if (fused_bias) {
          return core::ops::LinearBackwardWeight(dy2, x2, &w_->grad, &b_->grad,
                                                 LinearOptions{false, bf16});
        }
        return WeightGrads(dy2, x2, w_->grad, nullptr, bf16);
      },
      Bytes(dy2)));
  return dx;
}

}  // namespace loom::layers
