#include "comm/internal/algorithms.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "comm/internal/reduce.h"
#include "comm/internal/small_allreduce.h"
#include "core/dtype.h"

namespace loom::comm::internal {
namespace {

char* P(const core::Tensor& t) { return static_cast<char*>(t.raw_data()); }
int Mod(int a, int n) { return ((a % n) + n) % n; }
int Ctz(int x) { return __builtin_ctz(static_cast<unsigned>(x)); }

}  // namespace

absl::Status RunAllReduce(Steps& steps, const core::Tensor& in, const core::Tensor& out,
                          ReduceOp red, size_t small_bytes) {
  const core::DType dt = in.dtype();
  const size_t es = core::DTypeSize(dt);
  const int64_t count = in.numel();
  const size_t bytes = in.nbytes();
  char* dst = P(out);
  const char* src = P(in);
  const int n = steps.size();
  const int r = steps.rank();
  absl::Status s;
  if (n == 1 || bytes <= small_bytes || count < n) {
    if (src != dst) std::memcpy(dst, src, bytes);
    if (n == 1 || count == 0) return absl::OkStatus();
    const SmallAllReduce plan(r, n, dst, steps.Stage(0, SmallAllReduce::StageBytes(n, bytes)),
                              bytes, count, dt, red);
    for (int i = 0; i < plan.steps(); ++i) {
      s = steps.Exchange(plan.StepLegs(i));
      if (!s.ok()) return s;
      plan.Finish(i);
    }
  } else {
    auto blk = [&](int b) {
      b = Mod(b, n);
      int64_t start = b * count / n, end = (b + 1) * count / n;
      return std::make_pair(start, end - start);
    };
    const int right = Mod(r + 1, n), left = Mod(r - 1, n);
    char* rb = steps.Stage(0, (count / n + 1) * es);
    // Out of place, the input is never copied to the output: the first step
    // sends straight from the input, and every received block is reduced
    // from input + received into the output (the same operand order as in
    // place, so results stay bitwise identical). The one block this rank
    // only sends is filled by the all-gather.
    for (int st = 0; st < n - 1; ++st) {
      auto sb = blk(r - st - 1), rbk = blk(r - st - 2);
      const char* send_from = st == 0 ? src : dst;
      std::vector<Leg> legs;
      if (sb.second) {
        legs.push_back({true, right, st, const_cast<char*>(send_from) + sb.first * es,
                        sb.second * es});
      }
      if (rbk.second) legs.push_back({false, left, st, rb, rbk.second * es});
      s = steps.Exchange(legs);
      if (!s.ok()) return s;
      if (rbk.second) {
        ReduceTo(dst + rbk.first * es, src + rbk.first * es, rb, rbk.second, dt, red);
      }
    }
    if (red == ReduceOp::kAvg) {
      auto own = blk(r);
      FinishAvg(dst + own.first * es, own.second, dt, n);
    }
    for (int st = 0; st < n - 1; ++st) {
      auto sb = blk(r - st), rbk = blk(r - st - 1);
      std::vector<Leg> legs;
      if (sb.second) legs.push_back({true, right, n + st, dst + sb.first * es, sb.second * es});
      if (rbk.second) legs.push_back({false, left, n + st, dst + rbk.first * es, rbk.second * es});
      s = steps.Exchange(legs);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  if (red == ReduceOp::kAvg) FinishAvg(dst, count, dt, n);
  return absl::OkStatus();
}

absl::Status RunBroadcast(Steps& steps, const core::Tensor& in, const core::Tensor& out, int root) {
  const int n = steps.size(), r = steps.rank();
  const size_t bytes = out.nbytes();
  if (r == root && P(in) != P(out)) std::memcpy(P(out), P(in), bytes);
  if (n == 1 || bytes == 0) return absl::OkStatus();
  const int vr = Mod(r - root, n);
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      absl::Status s =
          steps.Exchange({{false, Mod(vr - mask + root, n), Ctz(mask), P(out), bytes}});
      if (!s.ok()) return s;
      break;
    }
    mask <<= 1;
  }
  std::vector<Leg> legs;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vr + mask < n) legs.push_back({true, Mod(vr + mask + root, n), Ctz(mask), P(out), bytes});
  }
  return legs.empty() ? absl::OkStatus() : steps.Exchange(legs);
}

absl::Status RunReduce(Steps& steps, const core::Tensor& in, const core::Tensor& out, ReduceOp red,
                       int root) {
  const int n = steps.size(), r = steps.rank();
  const size_t bytes = in.nbytes();
  const int64_t count = in.numel();
  if (bytes == 0) return absl::OkStatus();
  char* acc = r == root ? P(out) : steps.Stage(0, bytes);
  if (acc != P(in)) std::memcpy(acc, P(in), bytes);
  if (n == 1) return absl::OkStatus();
  char* rb = steps.Stage(1, bytes);
  const int vr = Mod(r - root, n);
  for (int mask = 1; mask < n; mask <<= 1) {
    if (vr & mask) {
      return steps.Exchange({{true, Mod(vr - mask + root, n), Ctz(mask), acc, bytes}});
    }
    if (vr + mask < n) {
      absl::Status s = steps.Exchange({{false, Mod(vr + mask + root, n), Ctz(mask), rb, bytes}});
      if (!s.ok()) return s;
      ReduceInto(acc, rb, count, in.dtype(), red);
    }
  }
  if (red == ReduceOp::kAvg) FinishAvg(acc, count, in.dtype(), n);
  return absl::OkStatus();
}

absl::Status RunAllGather(Steps& steps, const core::Tensor& in, const core::Tensor& out) {
  const int n = steps.size(), r = steps.rank();
  const size_t mb = in.nbytes();
  char* o = P(out);
  if (o + r * mb != P(in)) std::memcpy(o + r * mb, P(in), mb);
  if (n == 1 || mb == 0) return absl::OkStatus();
  const int right = Mod(r + 1, n), left = Mod(r - 1, n);
  for (int st = 0; st < n - 1; ++st) {
    absl::Status s = steps.Exchange({{true, right, st, o + Mod(r - st, n) * mb, mb},
                                   {false, left, st, o + Mod(r - st - 1, n) * mb, mb}});
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status RunReduceScatter(Steps& steps, const core::Tensor& in, const core::Tensor& out,
                              ReduceOp red) {
  const int n = steps.size(), r = steps.rank();
  const int64_t m = out.numel();
  const size_t mb = out.nbytes();
  const core::DType dt = in.dtype();
  char* src = P(in);
  if (n == 1) {
    if (P(out) != src) std::memcpy(P(out), src, mb);
    return absl::OkStatus();
  }
  if (m == 0) return absl::OkStatus();
  char* acc = steps.Stage(0, mb);
  char* rb = steps.Stage(1, mb);
  const int right = Mod(r + 1, n), left = Mod(r - 1, n);
  for (int st = 0; st < n - 1; ++st) {
    const int sb = Mod(r - st - 1, n), rbk = Mod(r - st - 2, n);
    char* send = st == 0 ? src + sb * mb : acc;
    absl::Status s = steps.Exchange({{true, right, st, send, mb}, {false, left, st, rb, mb}});
    if (!s.ok()) return s;
    char* target = st == n - 2 ? P(out) : acc;
    if (target != src + rbk * mb) std::memcpy(target, src + rbk * mb, mb);
    ReduceInto(target, rb, m, dt, red);
  }
  if (red == ReduceOp::kAvg) FinishAvg(P(out), m, dt, n);
  return absl::OkStatus();
}

std::vector<size_t> BlockOffsets(absl::Span<const int64_t> counts, size_t elem_bytes) {
  std::vector<size_t> off(counts.size() + 1, 0);
  for (size_t j = 0; j < counts.size(); ++j) off[j + 1] = off[j] + counts[j] * elem_bytes;
  return off;
}

namespace {

// This rank's own block is copied; the others go by pairwise exchange: at
// step k = 1..n-1 it sends block (r + k) % n to that rank and receives block
// (r - k) % n from that rank: one message in flight each way per rank and
// step, and no rank the target of every sender at once. When this rank
// moves at most `small_bytes` in all, every leg is posted at once instead
// (one round trip, not n-1). all_to_all_v ranks may choose differently (their
// totals differ); either way each ordered pair exchanges one message, and a
// pairwise rank's step k waits only on ranks at step k or ranks that posted
// everything, so no choice of modes can deadlock.
absl::Status ExchangeBlocks(Steps& steps, const char* src, const std::vector<size_t>& send_off,
                            char* dst, const std::vector<size_t>& recv_off, size_t small_bytes) {
  const int n = steps.size(), r = steps.rank();
  const size_t own = send_off[r + 1] - send_off[r];  // == recv_off's (checks.h)
  if (own && dst + recv_off[r] != src + send_off[r]) {
    std::memcpy(dst + recv_off[r], src + send_off[r], own);
  }
  const bool at_once = std::max(send_off[n], recv_off[n]) <= small_bytes;
  std::vector<Leg> legs;
  for (int k = 1; k < n; ++k) {
    const int to = Mod(r + k, n), from = Mod(r - k, n);
    // Zero-byte legs are sent too: a peer with nothing to exchange still
    // takes part, so a dead or mismatched peer is noticed by every rank.
    legs.push_back({true, to, 0, const_cast<char*>(src) + send_off[to],
                    send_off[to + 1] - send_off[to]});
    legs.push_back({false, from, 0, dst + recv_off[from], recv_off[from + 1] - recv_off[from]});
    if (at_once && k < n - 1) continue;
    absl::Status s = steps.Exchange(legs);
    if (!s.ok()) return s;
    legs.clear();
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunAllToAll(Steps& steps, const core::Tensor& in, const core::Tensor& out,
                         size_t small_bytes) {
  const int n = steps.size();
  const size_t bytes = in.nbytes();
  if (bytes == 0) return absl::OkStatus();
  const char* src = P(in);
  if (src == P(out) && n > 1) {  // in place: sends read what receives overwrite
    char* tmp = steps.Stage(0, bytes);
    std::memcpy(tmp, src, bytes);
    src = tmp;
  }
  const std::vector<int64_t> counts(n, in.numel() / n);
  const std::vector<size_t> off = BlockOffsets(counts, core::DTypeSize(in.dtype()));
  return ExchangeBlocks(steps, src, off, P(out), off, small_bytes);
}

absl::Status RunAllToAllV(Steps& steps, const core::Tensor& in,
                          absl::Span<const int64_t> send_counts, const core::Tensor& out,
                          absl::Span<const int64_t> recv_counts, size_t small_bytes) {
  const size_t es = core::DTypeSize(in.dtype());
  return ExchangeBlocks(steps, P(in), BlockOffsets(send_counts, es), P(out),
                        BlockOffsets(recv_counts, es), small_bytes);
}

absl::Status RunBarrier(Steps& steps) {
  const int n = steps.size(), r = steps.rank();
  for (int k = 1, st = 0; k < n; k <<= 1, ++st) {
    absl::Status s = steps.Exchange({{true, Mod(r + k, n), st, nullptr, 0},
                                   {false, Mod(r - k, n), st, nullptr, 0}});
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace loom::comm::internal
