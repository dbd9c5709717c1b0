#include "comm/internal/algorithms.h"

#include <cstring>
#include <utility>
#include <vector>

#include "comm/internal/reduce.h"
#include "core/dtype.h"

namespace loom::comm::internal {
namespace {

char* P(const core::Tensor& t) { return static_cast<char*>(t.raw_data()); }
int Mod(int a, int n) { return ((a % n) + n) % n; }
int Ctz(int x) { return __builtin_ctz(static_cast<unsigned>(x)); }
bool IsPow2(int n) { return (n & (n - 1)) == 0; }

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
    if (IsPow2(n)) {
      char* rb = steps.Stage(0, bytes);
      for (int mask = 1; mask < n; mask <<= 1) {
        int partner = r ^ mask;
        s = steps.Exchange(
            {{true, partner, Ctz(mask), dst, bytes}, {false, partner, Ctz(mask), rb, bytes}});
        if (!s.ok()) return s;
        ReduceInto(dst, rb, count, dt, red);
      }
    } else {
      char* all = steps.Stage(0, bytes * n);
      std::memcpy(all + r * bytes, dst, bytes);
      std::vector<Leg> legs;
      for (int j = 0; j < n; ++j) {
        if (j == r) continue;
        legs.push_back({true, j, 0, dst, bytes});
        legs.push_back({false, j, 0, all + j * bytes, bytes});
      }
      s = steps.Exchange(legs);
      if (!s.ok()) return s;
      std::memcpy(dst, all, bytes);
      for (int j = 1; j < n; ++j) ReduceInto(dst, all + j * bytes, count, dt, red);
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

absl::Status RunAllToAll(Steps& steps, const core::Tensor& in, const core::Tensor& out) {
  const int n = steps.size(), r = steps.rank();
  const size_t bytes = in.nbytes(), mb = bytes / n;
  const char* src = P(in);
  if (src == P(out) && n > 1) {
    char* tmp = steps.Stage(0, bytes);
    std::memcpy(tmp, src, bytes);
    src = tmp;
  }
  char* o = P(out);
  if (o + r * mb != src + r * mb) std::memcpy(o + r * mb, src + r * mb, mb);
  if (n == 1 || mb == 0) return absl::OkStatus();
  std::vector<Leg> legs;
  for (int j = 0; j < n; ++j) {
    if (j == r) continue;
    legs.push_back({true, j, 0, const_cast<char*>(src) + j * mb, mb});
    legs.push_back({false, j, 0, o + j * mb, mb});
  }
  return steps.Exchange(legs);
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
