#include "layers/mappings.h"

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace loom::layers {
namespace {

using core::Shape;
using core::Tensor;

absl::StatusOr<Shape> WithDim(const Shape& s, int dim, int64_t value) {
  int64_t dims[Shape::kMaxRank];
  for (int i = 0; i < s.rank(); ++i) dims[i] = s.dim(i);
  dims[dim] = value;
  return Shape::Make(dims, s.rank());
}

absl::Status CheckDivisible(const char* op, const Tensor& x, int dim, int p) {
  if (x.rank() < 1 || x.dim(dim) % p != 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", x.DebugString(), " dim ", dim,
                                                   " is not divisible by the TP size ", p));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WaitTp(const TpGroup& tp, const comm::WorkPtr& work) {
  if (work == nullptr) return absl::OkStatus();
  if (tp.stats == nullptr) return work->WaitOnStream();
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status s = work->WaitOnStream();
  tp.stats->blocked_ms +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

absl::Status AllReduceTp(const TpGroup& tp, const Tensor& x) {
  if (!tp.parallel()) return absl::OkStatus();
  return WaitTp(tp, tp.comm->AllReduce(x, comm::ReduceOp::kSum));
}

comm::WorkPtr AllReduceTpAsync(const TpGroup& tp, const Tensor& x) {
  if (!tp.parallel()) return comm::CompletedWork(absl::OkStatus(), "all_reduce (tp=1)");
  return tp.comm->AllReduce(x, comm::ReduceOp::kSum);
}

comm::WorkPtr AllGatherSeqAsync(const TpGroup& tp, const Tensor& x, Tensor* out) {
  if (!tp.parallel()) {
    *out = x;
    return comm::CompletedWork(absl::OkStatus(), "all_gather (tp=1)");
  }
  if (x.rank() < 1) {
    return comm::CompletedWork(absl::InvalidArgumentError("AllGatherSeq: rank-0 input"), "");
  }
  absl::StatusOr<Shape> shape = WithDim(x.shape(), 0, x.dim(0) * tp.size());
  if (!shape.ok()) return comm::CompletedWork(shape.status(), "all_gather");
  absl::StatusOr<Tensor> full = Tensor::Empty(*shape, x.dtype(), x.device());
  if (!full.ok()) return comm::CompletedWork(full.status(), "all_gather");
  *out = *full;
  return tp.comm->AllGather(x, *out);
}

absl::StatusOr<Tensor> AllGatherSeq(const TpGroup& tp, const Tensor& x) {
  Tensor out;
  absl::Status s = WaitTp(tp, AllGatherSeqAsync(tp, x, &out));
  if (!s.ok()) return s;
  return out;
}

comm::WorkPtr ReduceScatterSeqAsync(const TpGroup& tp, const Tensor& x, Tensor* out) {
  if (!tp.parallel()) {
    *out = x;
    return comm::CompletedWork(absl::OkStatus(), "reduce_scatter (tp=1)");
  }
  absl::Status ok = CheckDivisible("ReduceScatterSeq", x, 0, tp.size());
  if (!ok.ok()) return comm::CompletedWork(ok, "reduce_scatter");
  absl::StatusOr<Shape> shape = WithDim(x.shape(), 0, x.dim(0) / tp.size());
  if (!shape.ok()) return comm::CompletedWork(shape.status(), "reduce_scatter");
  absl::StatusOr<Tensor> part = Tensor::Empty(*shape, x.dtype(), x.device());
  if (!part.ok()) return comm::CompletedWork(part.status(), "reduce_scatter");
  *out = *part;
  return tp.comm->ReduceScatter(x, *out, comm::ReduceOp::kSum);
}

absl::StatusOr<Tensor> ReduceScatterSeq(const TpGroup& tp, const Tensor& x) {
  Tensor out;
  absl::Status s = WaitTp(tp, ReduceScatterSeqAsync(tp, x, &out));
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<Tensor> SplitLastDim(const TpGroup& tp, const Tensor& x) {
  if (!tp.parallel()) return x;
  if (!x.device().is_cpu()) {
    // The last-dim mappings serve tests and generation, not the training
    // step: a device tensor takes the strided copy through the host.
    LOOM_ASSIGN_OR_RETURN(Tensor host, x.To(core::Device::CPU()));
    LOOM_ASSIGN_OR_RETURN(Tensor part, SplitLastDim(tp, host));
    return part.To(x.device());
  }
  const int last = x.rank() - 1;
  absl::Status ok = CheckDivisible("SplitLastDim", x, last, tp.size());
  if (!ok.ok()) return ok;
  const int64_t n = x.dim(last), part = n / tp.size(), rows = x.numel() / n;
  absl::StatusOr<Shape> shape = WithDim(x.shape(), last, part);
  if (!shape.ok()) return shape.status();
  absl::StatusOr<Tensor> out = Tensor::Empty(*shape, x.dtype(), x.device());
  if (!out.ok()) return out.status();
  const size_t es = core::DTypeSize(x.dtype());
  const char* src = static_cast<const char*>(x.raw_data()) + tp.rank() * part * es;
  char* dst = static_cast<char*>(out->raw_data());
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * part * es, src + r * n * es, part * es);
  return out;
}

absl::StatusOr<Tensor> GatherLastDim(const TpGroup& tp, const Tensor& x) {
  if (!tp.parallel()) return x;
  const int last = x.rank() - 1;
  const int p = tp.size();
  const int64_t part = x.dim(last), rows = x.numel() / std::max<int64_t>(part, 1);
  // Gather whole blocks [p][rows, part], then interleave into [rows, p·part].
  absl::StatusOr<Tensor> blocks = Tensor::Empty(core::Shape{p * x.numel()}, x.dtype(), x.device());
  if (!blocks.ok()) return blocks.status();
  absl::StatusOr<Tensor> flat = x.Reshape(core::Shape{x.numel()});
  if (!flat.ok()) return flat.status();
  absl::Status s = tp.comm->AllGather(*flat, *blocks)->WaitOnStream();
  if (!s.ok()) return s;
  absl::StatusOr<Shape> shape = WithDim(x.shape(), last, part * p);
  if (!shape.ok()) return shape.status();
  if (!x.device().is_cpu()) {  // interleave on the host, as in SplitLastDim
    LOOM_ASSIGN_OR_RETURN(Tensor host, blocks->To(core::Device::CPU()));
    blocks = host;
  }
  absl::StatusOr<Tensor> out = Tensor::Empty(*shape, x.dtype());
  if (!out.ok()) return out.status();
  const size_t es = core::DTypeSize(x.dtype());
  const char* src = static_cast<const char*>(blocks->raw_data());
  char* dst = static_cast<char*>(out->raw_data());
  for (int r = 0; r < p; ++r) {
    for (int64_t row = 0; row < rows; ++row) {
      std::memcpy(dst + (row * p + r) * part * es, src + (r * rows + row) * part * es, part * es);
    }
  }
  if (!x.device().is_cpu()) return out->To(x.device());
  return out;
}

absl::StatusOr<Tensor> CopyToTp::Backward(const TpGroup& tp, const Tensor& dy) {
  if (!tp.parallel()) return dy;
  absl::StatusOr<Tensor> out = dy.Clone();
  if (!out.ok()) return out.status();
  absl::Status s = AllReduceTp(tp, *out);
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<Tensor> ReduceFromTp::Forward(const TpGroup& tp, const Tensor& x) {
  return CopyToTp::Backward(tp, x);
}

}  // namespace loom::layers
