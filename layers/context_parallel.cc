#include "layers/context_parallel.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/cpu/flash_attention.h"
#include "core/status_macros.h"

namespace loom::layers {
namespace {

using core::DType;
using core::Shape;
using core::Tensor;
namespace cpu = core::cpu;

// Tags of the ring's messages: K/V, and in the backward K/V with dK/dV.
constexpr int kKvTag = 7100;
constexpr int kDkvTag = 7101;

// The dimensions of one call, checked against the tensors.
struct Dims {
  int64_t c = 0;      // chunk length
  int64_t rows = 0;   // local rows (2c)
  int64_t b = 0;      // micro-batch
  int64_t heads = 0;  // this rank's heads
  int64_t d = 0;      // head dim
  int64_t Pairs() const { return b * heads; }
  // Row strides of qkv [rows, b, heads, 3, d], a K/V buffer [rows, b, heads, 2, d]
  // and out [rows, b, heads, d].
  int64_t LdQkv() const { return b * heads * 3 * d; }
  int64_t LdKv() const { return b * heads * 2 * d; }
  int64_t LdOut() const { return b * heads * d; }
};

// The layout, the CP group it must describe, and qkv (both ring directions).
absl::StatusOr<Dims> CheckRing(const comm::Communicator& cp, const ContextParallelLayout& layout,
                               const Tensor& qkv, int64_t heads, const char* op) {
  LOOM_RETURN_IF_ERROR(CheckContextParallelLayout(layout));
  if (cp.size() != layout.cp || cp.rank() != layout.rank) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": the CP group has rank ", cp.rank(),
                                                   " of ", cp.size(), ", the layout says ",
                                                   layout.rank, " of ", layout.cp));
  }
  if (qkv.device().type != core::DeviceType::kCPU || qkv.dtype() != DType::kF32 ||
      qkv.shape().rank() != 3 || heads < 1 || qkv.dim(2) % (3 * heads) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": qkv must be a host f32[2c, b, heads * 3 * d] with heads = ", heads));
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

absl::Status CheckLike(const Tensor& t, const Shape& want, const char* what, const char* op) {
  if (t.device().type != core::DeviceType::kCPU || t.dtype() != DType::kF32 ||
      t.shape() != want) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", what, " must be a host f32 tensor of the expected shape"));
  }
  return absl::OkStatus();
}

// The forward's outputs: out [rows, b, heads * d] and lse [b, heads, rows].
absl::Status CheckOutAndLse(const Dims& dm, const Tensor& out, const Tensor& lse, const char* op) {
  LOOM_RETURN_IF_ERROR(CheckLike(out, Shape{dm.rows, dm.b, dm.heads * dm.d}, "out", op));
  return CheckLike(lse, Shape{dm.b, dm.heads, dm.rows}, "lse", op);
}

// The K and V of qkv packed as [rows, b, heads, 2, d]: what travels the ring.
void PackKv(const Dims& dm, const float* qkv, float* kv) {
  const int64_t n = dm.rows * dm.b * dm.heads;
#pragma omp parallel for
  for (int64_t r = 0; r < n; ++r) {
    std::memcpy(kv + r * 2 * dm.d, qkv + r * 3 * dm.d + dm.d, 2 * dm.d * sizeof(float));
  }
}

// The global pair index of (batch b_i, local head h) for the dropout mask.
int64_t GlobalPair(const cpu::AttentionDropout& dropout, int64_t heads, int64_t b_i, int64_t h) {
  const int64_t total = dropout.total_heads > 0 ? dropout.total_heads : heads;
  return b_i * total + dropout.head_offset + h;
}

// The (Q half, K/V half) block of pair (b_i, h): Q from this rank's qkv, K/V
// from `kv` (owner's halves), at global positions.
cpu::FlashBlock Block(const ContextParallelLayout& layout, const Dims& dm,
                      const cpu::AttentionDropout& dropout, const float* qkv, const float* kv,
                      int kv_owner, int64_t b_i, int64_t h, int qh, int kh) {
  const int64_t pair = b_i * dm.heads + h;
  cpu::FlashBlock blk;
  blk.d = dm.d;
  blk.q = qkv + (qh * dm.c * dm.b * dm.heads + pair) * 3 * dm.d;
  blk.ld_q = dm.LdQkv();
  blk.q_start = layout.HalfStart(qh);
  blk.q_len = dm.c;
  blk.k = kv + (kh * dm.c * dm.b * dm.heads + pair) * 2 * dm.d;
  blk.v = blk.k + dm.d;
  blk.ld_kv = dm.LdKv();
  blk.k_start = layout.HalfStartOf(kv_owner, kh);
  blk.k_len = dm.c;
  blk.seq_len = layout.seq_len;
  blk.global_pair = GlobalPair(dropout, dm.heads, b_i, h);
  blk.dropout = dropout;
  blk.causal = true;
  return blk;
}

// Whether every query of the block is before every key: nothing to do.
bool FullyMasked(const cpu::FlashBlock& blk) {
  return blk.k_start > blk.q_start + blk.q_len - 1;
}

// Runs fn(b_i, h) for every pair on OpenMP threads; returns the first error.
template <typename Fn>
absl::Status ForEachPair(const Dims& dm, Fn fn) {
  absl::Status first;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t p = 0; p < dm.Pairs(); ++p) {
    absl::Status s = fn(p / dm.heads, p % dm.heads);
    if (!s.ok()) {
#pragma omp critical(loom_ring_attention_error)
      if (first.ok()) first = s;
    }
  }
  return first;
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
  LOOM_RETURN_IF_ERROR(CheckOutAndLse(dm, *out, *lse, kOp));

  // Double-buffered K/V: compute on `cur` while `nxt` arrives.
  const Shape kv_shape{dm.rows, dm.b, heads * 2 * dm.d};
  LOOM_ASSIGN_OR_RETURN(Tensor cur, Tensor::Empty(kv_shape, DType::kF32));
  LOOM_ASSIGN_OR_RETURN(Tensor nxt, Tensor::Empty(kv_shape, DType::kF32));
  PackKv(dm, qkv.data<float>(), cur.data<float>());
  // Running softmax state per (pair, Q half): acc [c, d], m [c], l [c].
  const int64_t states = dm.Pairs() * 2;
  std::vector<float> acc(states * dm.c * dm.d), m(states * dm.c), l(states * dm.c);
  auto state = [&](int64_t b_i, int64_t h, int qh) {
    const int64_t s = (b_i * heads + h) * 2 + qh;
    return cpu::FlashRunning{acc.data() + s * dm.c * dm.d, dm.d, m.data() + s * dm.c,
                             l.data() + s * dm.c};
  };
  for (int64_t b_i = 0; b_i < dm.b; ++b_i) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int qh = 0; qh < 2; ++qh) {
        cpu::FlashRunning st = state(b_i, h, qh);
        cpu::FlashRunningInit(dm.c, dm.d, &st);
      }
    }
  }
  for (int step = 0; step < layout.cp; ++step) {
    const int owner = (layout.rank - step + layout.cp) % layout.cp;
    comm::WorkPtr pass;
    if (step + 1 < layout.cp) {  // the next K/V travels while this one is used
      pass = cp.BatchSendRecv({{comm::P2POp::Kind::kSend, cur, Next(layout), kKvTag},
                               {comm::P2POp::Kind::kRecv, nxt, Prev(layout), kKvTag}});
    }
    const float* kv = cur.data<float>();
    absl::Status s = ForEachPair(dm, [&](int64_t b_i, int64_t h) -> absl::Status {
      for (int qh = 0; qh < 2; ++qh) {
        cpu::FlashRunning st = state(b_i, h, qh);
        for (int kh = 0; kh < 2; ++kh) {
          const cpu::FlashBlock blk =
              Block(layout, dm, dropout, qkv.data<float>(), kv, owner, b_i, h, qh, kh);
          if (!FullyMasked(blk)) LOOM_RETURN_IF_ERROR(cpu::FlashForwardBlock(blk, &st));
        }
      }
      return absl::OkStatus();
    });
    if (pass != nullptr) {
      absl::Status w = pass->Wait();
      if (s.ok()) s = w;
    }
    LOOM_RETURN_IF_ERROR(s);
    std::swap(cur, nxt);
  }
  float* o = out->data<float>();
  float* lse_p = lse->data<float>();
  for (int64_t b_i = 0; b_i < dm.b; ++b_i) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t pair = b_i * heads + h;
      for (int qh = 0; qh < 2; ++qh) {
        cpu::FlashRunningFinish(dm.c, dm.d, state(b_i, h, qh),
                                o + (qh * dm.c * dm.b * heads + pair) * dm.d, dm.LdOut(),
                                lse_p + pair * dm.rows + qh * dm.c);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status RingAttentionBackward(comm::Communicator& cp, const ContextParallelLayout& layout,
                                   const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                   const Tensor& lse, int64_t heads,
                                   const cpu::AttentionDropout& dropout, Tensor* dqkv) {
  constexpr char kOp[] = "RingAttentionBackward";
  LOOM_ASSIGN_OR_RETURN(Dims dm, CheckRing(cp, layout, qkv, heads, kOp));
  LOOM_RETURN_IF_ERROR(CheckOutAndLse(dm, out, lse, kOp));
  LOOM_RETURN_IF_ERROR(CheckLike(dout, out.shape(), "dout", kOp));
  LOOM_RETURN_IF_ERROR(CheckLike(*dqkv, qkv.shape(), "dqkv", kOp));

  // delta = rowsum(dO * O) of every local row, per pair: [pairs, rows].
  std::vector<float> delta(dm.Pairs() * dm.rows);
  for (int64_t pair = 0; pair < dm.Pairs(); ++pair) {
    for (int qh = 0; qh < 2; ++qh) {
      const int64_t row0 = (qh * dm.c * dm.Pairs() + pair) * dm.d;
      cpu::FlashDelta(dm.c, dm.d, dout.data<float>() + row0, dm.LdOut(),
                      out.data<float>() + row0, dm.LdOut(),
                      delta.data() + pair * dm.rows + qh * dm.c);
    }
  }
  // dQ accumulates in dqkv's q slots; K/V and their dK/dV travel together:
  // [2, rows, b, heads, 2, d] (K/V, then its gradient accumulator).
  std::memset(dqkv->raw_data(), 0, dqkv->nbytes());
  const Shape buf_shape{2, dm.rows, dm.b, heads * 2 * dm.d};
  LOOM_ASSIGN_OR_RETURN(Tensor cur, Tensor::Zeros(buf_shape, DType::kF32));
  LOOM_ASSIGN_OR_RETURN(Tensor nxt, Tensor::Empty(buf_shape, DType::kF32));
  const int64_t kv_elems = dm.rows * dm.LdKv();
  PackKv(dm, qkv.data<float>(), cur.data<float>());
  for (int step = 0; step < layout.cp; ++step) {
    const int owner = (layout.rank - step + layout.cp) % layout.cp;
    const float* kv = cur.data<float>();
    float* dkv = cur.data<float>() + kv_elems;
    LOOM_RETURN_IF_ERROR(ForEachPair(dm, [&](int64_t b_i, int64_t h) -> absl::Status {
      const int64_t pair = b_i * heads + h;
      for (int qh = 0; qh < 2; ++qh) {
        const int64_t q_row0 = qh * dm.c * dm.Pairs() + pair;
        for (int kh = 0; kh < 2; ++kh) {
          const cpu::FlashBlock blk =
              Block(layout, dm, dropout, qkv.data<float>(), kv, owner, b_i, h, qh, kh);
          if (FullyMasked(blk)) continue;
          cpu::FlashGrads g;
          g.dq = dqkv->data<float>() + q_row0 * 3 * dm.d;
          g.ld_dq = dm.LdQkv();
          g.dk = dkv + (kh * dm.c * dm.Pairs() + pair) * 2 * dm.d;
          g.dv = g.dk + dm.d;
          g.ld_dkv = dm.LdKv();
          LOOM_RETURN_IF_ERROR(cpu::FlashBackwardBlock(
              blk, dout.data<float>() + q_row0 * dm.d, dm.LdOut(),
              lse.data<float>() + pair * dm.rows + qh * dm.c,
              delta.data() + pair * dm.rows + qh * dm.c, g));
        }
      }
      return absl::OkStatus();
    }));
    // K/V with the dK/dV gathered so far move on; after CP hops each rank
    // holds its own K/V's complete gradient again. (The pass is not overlapped
    // with the blocks: the dK/dV it carries are what they just wrote.)
    if (layout.cp > 1) {
      LOOM_RETURN_IF_ERROR(
          cp.BatchSendRecv({{comm::P2POp::Kind::kSend, cur, Next(layout), kDkvTag},
                            {comm::P2POp::Kind::kRecv, nxt, Prev(layout), kDkvTag}})
              ->Wait());
      std::swap(cur, nxt);
    }
  }
  // cur now holds this rank's K/V and their gradient: into dqkv's k, v slots.
  const float* dkv = cur.data<float>() + kv_elems;
  float* dq = dqkv->data<float>();
  const int64_t n = dm.rows * dm.Pairs();
#pragma omp parallel for
  for (int64_t r = 0; r < n; ++r) {
    std::memcpy(dq + r * 3 * dm.d + dm.d, dkv + r * 2 * dm.d, 2 * dm.d * sizeof(float));
  }
  return absl::OkStatus();
}

}  // namespace loom::layers
