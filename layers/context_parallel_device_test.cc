// The ring attention through core/ops' flash blocks, on the host and on the
// fake device (//core/ops:fake_device: device memory behind poisoned
// pointers, the CPU kernels run on host aliases), CP 2 and 4 as threads.
//   * On the host it is bitwise the ring that called core/cpu/flash_attention.h's
//     block API itself (ReferenceRing*, the implementation it replaced, kept
//     here verbatim as the oracle).
//   * On the fake device it gives the host ring's out, lse and gradients bit
//     for bit: nothing on the host reads or writes the device tensors (the
//     K/V passes go through a test communicator that stages device tensors
//     through the host, as NCCL would move them on a GPU).

#include <omp.h>

#include <cstring>
#include <deque>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/testing/ranks_as_threads.h"
#include "core/cpu/flash_attention.h"
#include "core/ops/ops.h"
#include "core/ops/testing/fake_device.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "layers/context_parallel.h"

namespace loom::layers {
namespace {

using core::DType;
using core::Shape;
using core::Tensor;
namespace cpu = core::cpu;

constexpr int kKvTag = 7100;
constexpr int kDkvTag = 7101;

// ---- The block-API ring this layer ran before core/ops' flash blocks ----

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

namespace {

absl::Status ReferenceRingForward(comm::Communicator& cp, const ContextParallelLayout& layout,
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

absl::Status ReferenceRingBackward(comm::Communicator& cp, const ContextParallelLayout& layout,
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

// ---- A communicator for fake-device tensors -------------------------------

Tensor OnHost(const Tensor& t) { return *t.To(core::Device::CPU()); }

// Point-to-point over a host communicator for device tensors: sends are
// copied to the host when posted, receives land on the host and are copied
// to the device when the op is waited for (what NCCL does on a GPU, in
// device memory). Only what the ring uses.
class StagingComm : public comm::Communicator {
 public:
  explicit StagingComm(comm::Communicator* host) : host_(host) {}
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  core::Device device() const override { return core::Device::CPU(); }
  const std::string& group_name() const override { return host_->group_name(); }
  const char* backend_name() const override { return "staging"; }

  comm::WorkPtr BatchSendRecv(const std::vector<comm::P2POp>& ops) override {
    std::vector<comm::P2POp> host_ops;
    std::vector<std::pair<Tensor, Tensor>> landings;  // (device, host)
    for (const comm::P2POp& op : ops) {
      comm::P2POp h = op;
      if (!op.tensor.device().is_cpu()) {
        if (op.kind == comm::P2POp::Kind::kSend) {
          h.tensor = OnHost(op.tensor);
        } else {
          h.tensor = *Tensor::Empty(op.tensor.shape(), op.tensor.dtype());
          landings.emplace_back(op.tensor, h.tensor);
        }
        ++staged_;
      }
      host_ops.push_back(h);
    }
    return std::make_shared<Staged>(host_->BatchSendRecv(host_ops), std::move(landings));
  }

  int staged() const { return staged_; }

#define LOOM_UNUSED_OP(ret, name, params) \
  ret name params override { return comm::CompletedWork(absl::UnimplementedError(#name), #name); }
  LOOM_UNUSED_OP(comm::WorkPtr, AllReduce, (const Tensor&, const Tensor&, comm::ReduceOp))
  LOOM_UNUSED_OP(comm::WorkPtr, Broadcast, (const Tensor&, const Tensor&, int))
  LOOM_UNUSED_OP(comm::WorkPtr, Reduce, (const Tensor&, const Tensor&, comm::ReduceOp, int))
  LOOM_UNUSED_OP(comm::WorkPtr, AllGather, (const Tensor&, const Tensor&))
  LOOM_UNUSED_OP(comm::WorkPtr, ReduceScatter, (const Tensor&, const Tensor&, comm::ReduceOp))
  LOOM_UNUSED_OP(comm::WorkPtr, AllToAll, (const Tensor&, const Tensor&))
  LOOM_UNUSED_OP(comm::WorkPtr, AllToAllV,
                 (const Tensor&, const std::vector<int64_t>&, const Tensor&,
                  const std::vector<int64_t>&))
  LOOM_UNUSED_OP(comm::WorkPtr, Send, (const Tensor&, int, int))
  LOOM_UNUSED_OP(comm::WorkPtr, Recv, (const Tensor&, int, int))
  LOOM_UNUSED_OP(comm::WorkPtr, Barrier, ())
  LOOM_UNUSED_OP(comm::WorkPtr, BarrierWithin, (absl::Duration))
#undef LOOM_UNUSED_OP
  absl::StatusOr<std::unique_ptr<comm::Communicator>> Split(int, int,
                                                             const std::string&) override {
    return absl::UnimplementedError("Split");
  }

 private:
  class Staged : public comm::Work {
   public:
    Staged(comm::WorkPtr inner, std::vector<std::pair<Tensor, Tensor>> landings)
        : inner_(std::move(inner)), landings_(std::move(landings)) {}
    bool Poll() override { return inner_->Poll(); }
    absl::Status Wait(absl::Duration timeout) override { return Land(inner_->Wait(timeout)); }
    absl::Status Wait() override { return Land(inner_->Wait()); }
    std::string Describe() const override { return inner_->Describe(); }

   private:
    absl::Status Land(absl::Status s) {
      if (!s.ok() || landed_) return s;
      landed_ = true;
      for (auto& [device, host] : landings_) LOOM_RETURN_IF_ERROR(core::ops::Copy(host, &device));
      return absl::OkStatus();
    }
    comm::WorkPtr inner_;
    std::vector<std::pair<Tensor, Tensor>> landings_;
    bool landed_ = false;
  };

  comm::Communicator* host_;
  int staged_ = 0;
};

// ---- Tests ----------------------------------------------------------------

Tensor Random(const Shape& shape, uint32_t seed) {
  Tensor t = *Tensor::Empty(shape, DType::kF32);
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(gen);
  return t;
}

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

struct RankResult {
  Tensor out, lse, dqkv;
};

struct Case {
  int cp;
  float dropout;
};

class RingOnOpsTest : public ::testing::TestWithParam<Case> {
 protected:
  static constexpr int64_t kS = 48, kB = 2, kHeads = 3, kD = 8;

  cpu::AttentionDropout Dropout() const {
    cpu::AttentionDropout dropout;
    dropout.p = GetParam().dropout;
    dropout.seed = 1234;
    dropout.offset = 5;
    dropout.head_offset = 1;  // a TP rank holding heads 1..3 of 5
    dropout.total_heads = 5;
    return dropout;
  }

  // Forward and backward on every CP rank; `device`: the tensors on the
  // (fake) CUDA device, the passes through StagingComm. `reference`: the
  // block-API ring.
  std::vector<RankResult> Run(bool device, bool reference) {
    const int cp = GetParam().cp;
    const Tensor qkv = Random(Shape{kS, kB, kHeads * 3 * kD}, 1);
    const Tensor dout = Random(Shape{kS, kB, kHeads * kD}, 2);
    const cpu::AttentionDropout dropout = Dropout();
    std::vector<RankResult> results(cp);
    const core::Device dev = device ? core::Device::CUDA(0) : core::Device::CPU();
    absl::Status st = comm::testing::RunRanksAsThreads(
        cp, [&](int r, comm::Communicator* c) -> absl::Status {
          const ContextParallelLayout l{kS, cp, r};
          LOOM_ASSIGN_OR_RETURN(Tensor q_host, SelectLocalRows(qkv, l));
          LOOM_ASSIGN_OR_RETURN(Tensor dout_host, SelectLocalRows(dout, l));
          LOOM_ASSIGN_OR_RETURN(Tensor q, q_host.To(dev));
          LOOM_ASSIGN_OR_RETURN(Tensor dq_in, dout_host.To(dev));
          LOOM_ASSIGN_OR_RETURN(Tensor o, Tensor::Empty(Shape{l.local_len(), kB, kHeads * kD},
                                                        DType::kF32, dev));
          LOOM_ASSIGN_OR_RETURN(
              Tensor ls, Tensor::Empty(Shape{kB, kHeads, l.local_len()}, DType::kF32, dev));
          LOOM_ASSIGN_OR_RETURN(Tensor g, Tensor::Empty(q.shape(), DType::kF32, dev));
          StagingComm staging(c);
          comm::Communicator& ring = device ? static_cast<comm::Communicator&>(staging) : *c;
          if (reference) {
            LOOM_RETURN_IF_ERROR(ReferenceRingForward(ring, l, q, kHeads, dropout, &o, &ls));
            LOOM_RETURN_IF_ERROR(
                ReferenceRingBackward(ring, l, dq_in, q, o, ls, kHeads, dropout, &g));
          } else {
            LOOM_RETURN_IF_ERROR(RingAttentionForward(ring, l, q, kHeads, dropout, &o, &ls));
            LOOM_RETURN_IF_ERROR(
                RingAttentionBackward(ring, l, dq_in, q, o, ls, kHeads, dropout, &g));
          }
          if (device && cp > 1 && staging.staged() == 0) {
            return absl::InternalError("no device tensor travelled the ring");
          }
          results[r] = {OnHost(o), OnHost(ls), OnHost(g)};
          return absl::OkStatus();
        });
    EXPECT_TRUE(st.ok()) << st;
    return results;
  }
};

// The ring through core/ops on the host is the block-API ring, bit for bit.
TEST_P(RingOnOpsTest, HostRingIsTheBlockApiRingBitwise) {
  const std::vector<RankResult> want = Run(/*device=*/false, /*reference=*/true);
  const std::vector<RankResult> got = Run(/*device=*/false, /*reference=*/false);
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < got.size(); ++r) {
    EXPECT_TRUE(SameBits(got[r].out, want[r].out)) << "out, rank " << r;
    EXPECT_TRUE(SameBits(got[r].lse, want[r].lse)) << "lse, rank " << r;
    EXPECT_TRUE(SameBits(got[r].dqkv, want[r].dqkv)) << "dqkv, rank " << r;
  }
}

// On the fake device (poisoned device pointers) the ring runs and gives the
// host ring's results bit for bit: no host code touches device memory.
TEST_P(RingOnOpsTest, FakeDeviceRingIsTheHostRingBitwise) {
  const std::vector<RankResult> want = Run(/*device=*/false, /*reference=*/false);
  core::ops::testing::ScopedFakeDevice fake;
  const long calls = core::ops::testing::ScopedFakeDevice::kernel_calls();
  const std::vector<RankResult> got = Run(/*device=*/true, /*reference=*/false);
  EXPECT_GT(core::ops::testing::ScopedFakeDevice::kernel_calls(), calls + 4 * GetParam().cp)
      << "the blocks must have run through the device table";
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < got.size(); ++r) {
    EXPECT_TRUE(SameBits(got[r].out, want[r].out)) << "out, rank " << r;
    EXPECT_TRUE(SameBits(got[r].lse, want[r].lse)) << "lse, rank " << r;
    EXPECT_TRUE(SameBits(got[r].dqkv, want[r].dqkv)) << "dqkv, rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(CpAndDropout, RingOnOpsTest,
                         ::testing::Values(Case{1, 0.0f}, Case{2, 0.0f}, Case{4, 0.0f},
                                           Case{2, 0.2f}, Case{4, 0.2f}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return "cp" + std::to_string(i.param.cp) +
                                  (i.param.dropout > 0 ? "_dropout" : "");
                         });

// The ring refuses mismatched outputs before any work.
TEST(RingOnOpsArgs, RefusesOutputsOfAnotherDtypeOrShape) {
  absl::Status st = comm::testing::RunRanksAsThreads(
      1, [&](int, comm::Communicator* c) -> absl::Status {
        const ContextParallelLayout l{8, 1, 0};
        Tensor q = Random(Shape{8, 1, 3 * 4}, 1);
        Tensor o = *Tensor::Empty(Shape{8, 1, 4}, DType::kBF16);
        Tensor ls = *Tensor::Empty(Shape{1, 1, 8}, DType::kF32);
        absl::Status s = RingAttentionForward(*c, l, q, 1, {}, &o, &ls);
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
        EXPECT_NE(s.message().find("out must be a f32"), std::string::npos) << s;
        return absl::OkStatus();
      });
  ASSERT_TRUE(st.ok()) << st;
}

}  // namespace
}  // namespace loom::layers
