#include "layers/context_parallel.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/ops/ops.h"
#include "core/status_macros.h"

namespace loom::layers {
namespace {

using core::DType;
using core::Shape;
using core::Tensor;
namespace cpu = core::cpu;

// Tags of the ring's messages: K/V, and in the backward their dK/dV.
constexpr int kKvTag = 7100;
constexpr int kDkvTag = 7101;

// The dimensions of one call, checked against the tensors.
struct Dims {
  int64_t c = 0;      // chunk length
  int64_t rows = 0;   // local rows (2c)
  int64_t b = 0;      // micro-batch
  int64_t heads = 0;  // this rank's heads
  int64_t d = 0;      // head dim
};

bool IsFloat(DType t) { return t == DType::kF32 || t == DType::kBF16; }

// The layout, the CP group it must describe, and qkv (both ring directions).
absl::StatusOr<Dims> CheckRing(const comm::Communicator& cp, const ContextParallelLayout& layout,
                               const Tensor& qkv, int64_t heads, const char* op) {
  LOOM_RETURN_IF_ERROR(CheckContextParallelLayout(layout));
  if (cp.size() != layout.cp || cp.rank() != layout.rank) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": the CP group has rank ", cp.rank(),
                                                   " of ", cp.size(), ", the layout says ",
                                                   layout.rank, " of ", layout.cp));
  }
  if (!qkv.defined() || !IsFloat(qkv.dtype()) || qkv.shape().rank() != 3 || heads < 1 ||
      qkv.dim(2) % (3 * heads) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": qkv must be an f32 or bf16 [2c, b, heads * 3 * d] with heads = ", heads));
  }
  Dims dm;
  dm.c = layout.chunk();
  dm.rows = layout.local_len();
  dm.b = qkv.dim(1);
  dm.heads = heads;
  dm.d = qkv.dim(2) / (3 * heads);
  if (qkv.dim(0) != dm.rows) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": qkv has ", qkv.dim(0),
                                                   " rows; this CP rank holds 2 chunks of ", dm.c,
                                                   " = ", dm.rows));
  }
  return dm;
}

// `t` is on qkv's device, of `dtype` and shape `want`.
absl::Status CheckLike(const Tensor& t, const Tensor& qkv, DType dtype, const Shape& want,
                       const char* what, const char* op) {
  if (!t.defined() || t.device() != qkv.device() || t.dtype() != dtype || t.shape() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", what, " must be a ", core::DTypeName(dtype), " tensor of shape ",
                     want.ToString(), " on qkv's device; got ", t.DebugString()));
  }
  return absl::OkStatus();
}

// The forward's outputs: out [rows, b, heads * d] (qkv's dtype) and lse [b, heads, rows] (f32).
absl::Status CheckOutAndLse(const Dims& dm, const Tensor& qkv, const Tensor& out,
                            const Tensor& lse, const char* op) {
  LOOM_RETURN_IF_ERROR(
      CheckLike(out, qkv, qkv.dtype(), Shape{dm.rows, dm.b, dm.heads * dm.d}, "out", op));
  return CheckLike(lse, qkv, DType::kF32, Shape{dm.b, dm.heads, dm.rows}, "lse", op);
}

// The (Q half qh, K/V half kh) block: Q rows of this rank's qkv, K/V rows of
// the buffer holding `kv_owner`'s halves, at global positions.
core::ops::FlashBlockOptions Block(const ContextParallelLayout& layout, const Dims& dm,
                                   const core::ops::AttentionDropout& dropout, int kv_owner,
                                   int qh, int kh) {
  core::ops::FlashBlockOptions o;
  o.heads = dm.heads;
  o.q_row = qh * dm.c;
  o.q_len = dm.c;
  o.q_start = layout.HalfStart(qh);
  o.k_row = kh * dm.c;
  o.k_len = dm.c;
  o.k_start = layout.HalfStartOf(kv_owner, kh);
  o.seq_len = layout.seq_len;
  o.causal = true;
  o.dropout = dropout;
  return o;
}

// Whether every query of the block is before every key: nothing to do. (The
// zig-zag layout makes each block skipped, full or diagonal.)
bool FullyMasked(const core::ops::FlashBlockOptions& o) {
  return o.k_start > o.q_start + o.q_len - 1;
}

int Next(const ContextParallelLayout& l) { return (l.rank + 1) % l.cp; }
int Prev(const ContextParallelLayout& l) { return (l.rank + l.cp - 1) % l.cp; }

}  // namespace

absl::Status CheckContextParallelLayout(const ContextParallelLayout& l) {
  if (l.cp < 1 || l.rank < 0 || l.rank >= l.cp) {
    return absl::InvalidArgumentError(absl::StrCat("context parallel rank ", l.rank, " of ",
                                                   l.cp, " (--context-parallel-size)"));
  }
  if (l.seq_len < 2 * l.cp || l.seq_len % (2 * l.cp) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--seq-length (", l.seq_len, ") must be a multiple of 2 x --context-parallel-size (",
        2 * l.cp, "): the sequence is cut into 2 chunks per CP rank"));
  }
  return absl::OkStatus();
}

std::vector<int64_t> LocalPositions(const ContextParallelLayout& l) {
  std::vector<int64_t> out;
  out.reserve(l.local_len());
  for (int h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < l.chunk(); ++i) out.push_back(l.HalfStart(h) + i);
  }
  return out;
}

std::vector<RowRun> GlobalRowRuns(const ContextParallelLayout& l, int64_t first, int64_t count) {
  if (l.cp == 1) return {RowRun{first, count, first}};  // the whole sequence, in order
  std::vector<RowRun> runs;
  const int64_t c = l.chunk();
  for (int h = 0; h < 2; ++h) {
    const int64_t begin = std::max(first, h * c), end = std::min(first + count, (h + 1) * c);
    if (begin < end) runs.push_back(RowRun{begin, end - begin, l.HalfStart(h) + begin - h * c});
  }
  return runs;
}

std::vector<RowRun> ActivationRowRuns(const TpGroup& tp, const CpGroup& cp, int64_t rows) {
  const int64_t sp = tp.sequence_parallel ? tp.size() : 1;
  const int64_t first = tp.sequence_parallel ? tp.rank() * rows : 0;
  std::vector<RowRun> runs = GlobalRowRuns(cp.Layout(rows * sp * cp.size()), first, rows);
  for (RowRun& run : runs) run.local_first -= first;
  return runs;
}

absl::StatusOr<Tensor> SelectLocalRows(const Tensor& global, const ContextParallelLayout& l) {
  LOOM_RETURN_IF_ERROR(CheckContextParallelLayout(l));
  if (global.device().type != core::DeviceType::kCPU || global.shape().rank() < 1 ||
      global.dim(0) != l.seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("SelectLocalRows: a host tensor with ", l.seq_len, " rows is needed"));
  }
  int64_t dims[4];
  for (int i = 0; i < global.shape().rank(); ++i) dims[i] = global.dim(i);
  dims[0] = l.local_len();
  LOOM_ASSIGN_OR_RETURN(Shape shape, Shape::Make(dims, global.shape().rank()));
  LOOM_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(shape, global.dtype()));
  const size_t row = global.nbytes() / static_cast<size_t>(l.seq_len);
  const char* src = static_cast<const char*>(global.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  for (int h = 0; h < 2; ++h) {
    std::memcpy(dst + h * l.chunk() * row, src + l.HalfStart(h) * row, l.chunk() * row);
  }
  return out;
}

absl::Status RingAttentionForward(comm::Communicator& cp, const ContextParallelLayout& layout,
                                  const Tensor& qkv, int64_t heads,
                                  const cpu::AttentionDropout& dropout, Tensor* out,
                                  Tensor* lse) {
  constexpr char kOp[] = "RingAttentionForward";
  LOOM_ASSIGN_OR_RETURN(Dims dm, CheckRing(cp, layout, qkv, heads, kOp));
  LOOM_RETURN_IF_ERROR(CheckOutAndLse(dm, qkv, *out, *lse, kOp));
  const core::Device dev = qkv.device();

  // Double-buffered K/V: compute on `cur` while `nxt` arrives.
  const Shape kv_shape{dm.rows, dm.b, heads * 2 * dm.d};
  LOOM_ASSIGN_OR_RETURN(Tensor cur, Tensor::Empty(kv_shape, qkv.dtype(), dev));
  LOOM_ASSIGN_OR_RETURN(Tensor nxt, Tensor::Empty(kv_shape, qkv.dtype(), dev));
  LOOM_RETURN_IF_ERROR(core::ops::FlashKvPack(qkv, heads, &cur));
  // The running softmax state of every local row (f32).
  LOOM_ASSIGN_OR_RETURN(Tensor acc,
                        Tensor::Empty(Shape{dm.b, heads, dm.rows, dm.d}, DType::kF32, dev));
  LOOM_ASSIGN_OR_RETURN(Tensor mx, Tensor::Empty(Shape{dm.b, heads, dm.rows}, DType::kF32, dev));
  LOOM_ASSIGN_OR_RETURN(Tensor sum, Tensor::Empty(Shape{dm.b, heads, dm.rows}, DType::kF32, dev));
  LOOM_RETURN_IF_ERROR(core::ops::FlashBlockInit(&acc, &mx, &sum));
  for (int step = 0; step < layout.cp; ++step) {
    const int owner = (layout.rank - step + layout.cp) % layout.cp;
    comm::WorkPtr pass;
    if (step + 1 < layout.cp) {  // the next K/V travels while this one is used
      pass = cp.BatchSendRecv({{comm::P2POp::Kind::kSend, cur, Next(layout), kKvTag},
                               {comm::P2POp::Kind::kRecv, nxt, Prev(layout), kKvTag}});
    }
    absl::Status s;
    for (int qh = 0; qh < 2 && s.ok(); ++qh) {
      for (int kh = 0; kh < 2 && s.ok(); ++kh) {
        const core::ops::FlashBlockOptions o = Block(layout, dm, dropout, owner, qh, kh);
        if (!FullyMasked(o)) s = core::ops::FlashBlockForward(qkv, cur, o, &acc, &mx, &sum);
      }
    }
    if (pass != nullptr) {
      absl::Status w = pass->WaitOnStream();
      if (s.ok()) s = w;
    }
    LOOM_RETURN_IF_ERROR(s);
    std::swap(cur, nxt);
  }
  return core::ops::FlashBlockFinish(acc, mx, sum, out, lse);
}

absl::Status RingAttentionBackward(comm::Communicator& cp, const ContextParallelLayout& layout,
                                   const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                   const Tensor& lse, int64_t heads,
                                   const cpu::AttentionDropout& dropout, Tensor* dqkv) {
  constexpr char kOp[] = "RingAttentionBackward";
  LOOM_ASSIGN_OR_RETURN(Dims dm, CheckRing(cp, layout, qkv, heads, kOp));
  LOOM_RETURN_IF_ERROR(CheckOutAndLse(dm, qkv, out, lse, kOp));
  LOOM_RETURN_IF_ERROR(CheckLike(dout, qkv, qkv.dtype(), out.shape(), "dout", kOp));
  LOOM_RETURN_IF_ERROR(CheckLike(*dqkv, qkv, qkv.dtype(), qkv.shape(), "dqkv", kOp));
  const core::Device dev = qkv.device();

  // delta = rowsum(dO * O) of every local row, per pair: [b, heads, rows].
  LOOM_ASSIGN_OR_RETURN(Tensor delta,
                        Tensor::Empty(Shape{dm.b, heads, dm.rows}, DType::kF32, dev));
  LOOM_RETURN_IF_ERROR(core::ops::FlashBlockDelta(dout, out, heads, &delta));
  // dQ accumulates in the q slots of an f32 dqkv (dqkv itself when f32);
  // K/V travel with their f32 dK/dV accumulators [rows, b, heads, 2, d].
  Tensor grad = *dqkv;
  if (dqkv->dtype() != DType::kF32) {
    LOOM_ASSIGN_OR_RETURN(grad, Tensor::Empty(qkv.shape(), DType::kF32, dev));
  }
  LOOM_RETURN_IF_ERROR(core::ops::Zero(&grad));
  const Shape kv_shape{dm.rows, dm.b, heads * 2 * dm.d};
  LOOM_ASSIGN_OR_RETURN(Tensor cur, Tensor::Empty(kv_shape, qkv.dtype(), dev));
  LOOM_ASSIGN_OR_RETURN(Tensor nxt, Tensor::Empty(kv_shape, qkv.dtype(), dev));
  LOOM_ASSIGN_OR_RETURN(Tensor dcur, Tensor::Empty(kv_shape, DType::kF32, dev));
  LOOM_ASSIGN_OR_RETURN(Tensor dnxt, Tensor::Empty(kv_shape, DType::kF32, dev));
  LOOM_RETURN_IF_ERROR(core::ops::Zero(&dcur));
  LOOM_RETURN_IF_ERROR(core::ops::FlashKvPack(qkv, heads, &cur));
  for (int step = 0; step < layout.cp; ++step) {
    const int owner = (layout.rank - step + layout.cp) % layout.cp;
    comm::WorkPtr pass;
    if (step + 1 < layout.cp) {  // the next K/V travels while this one is used
      pass = cp.BatchSendRecv({{comm::P2POp::Kind::kSend, cur, Next(layout), kKvTag},
                               {comm::P2POp::Kind::kRecv, nxt, Prev(layout), kKvTag}});
    }
    absl::Status s;
    for (int qh = 0; qh < 2 && s.ok(); ++qh) {
      for (int kh = 0; kh < 2 && s.ok(); ++kh) {
        const core::ops::FlashBlockOptions o = Block(layout, dm, dropout, owner, qh, kh);
        if (!FullyMasked(o)) {
          s = core::ops::FlashBlockBackward(dout, qkv, cur, lse, delta, o, &grad, &dcur);
        }
      }
    }
    // The dK/dV gathered so far move on (not overlapped: they are what the
    // blocks just wrote); after CP hops each rank holds its own K/V's
    // complete gradient again.
    if (s.ok() && layout.cp > 1) {
      s = cp.BatchSendRecv({{comm::P2POp::Kind::kSend, dcur, Next(layout), kDkvTag},
                            {comm::P2POp::Kind::kRecv, dnxt, Prev(layout), kDkvTag}})
              ->WaitOnStream();
      std::swap(dcur, dnxt);
    }
    if (pass != nullptr) {
      absl::Status w = pass->WaitOnStream();
      if (s.ok()) s = w;
    }
    LOOM_RETURN_IF_ERROR(s);
    std::swap(cur, nxt);
  }
  // dcur now holds this rank's K/V's gradient: into the k, v slots.
  LOOM_RETURN_IF_ERROR(core::ops::FlashKvUnpack(dcur, heads, &grad));
  if (grad.raw_data() != dqkv->raw_data()) LOOM_RETURN_IF_ERROR(core::ops::Convert(grad, dqkv));
  return absl::OkStatus();
}

}  // namespace loom::layers
