#include "comm/testing/conformance.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "comm/internal/reduce.h"
#include "core/cpu/convert.h"
#include "core/dtype.h"
#include "core/status_macros.h"
#include "core/storage.h"
#include "core/tensor.h"

namespace loom::comm::testing {
namespace {

using core::DType;
using core::Tensor;

const DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kF64,
                         DType::kI32, DType::kI64,  DType::kU8};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin,
                         ReduceOp::kProd};

void SetAt(const Tensor& t, int64_t i, double v) {
  void* p = t.raw_data();
  switch (t.dtype()) {
    case DType::kF32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::kF64: static_cast<double*>(p)[i] = v; break;
    case DType::kI32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DType::kI64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
    case DType::kU8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); break;
    case DType::kBF16:
      static_cast<uint16_t*>(p)[i] = core::cpu::FloatToBf16Bits(static_cast<float>(v));
      break;
    case DType::kF16:
      static_cast<uint16_t*>(p)[i] = internal::F32ToF16(static_cast<float>(v));
      break;
  }
}

double GetAt(const Tensor& t, int64_t i) {
  const void* p = t.raw_data();
  switch (t.dtype()) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kF64: return static_cast<const double*>(p)[i];
    case DType::kI32: return static_cast<const int32_t*>(p)[i];
    case DType::kI64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::kU8: return static_cast<const uint8_t*>(p)[i];
    case DType::kBF16: return core::cpu::Bf16BitsToFloat(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16: return internal::F16ToF32(static_cast<const uint16_t*>(p)[i]);
  }
  return 0;
}

double Tolerance(DType d) {
  switch (d) {
    case DType::kF32: return 1e-6;
    case DType::kF64: return 1e-12;
    case DType::kBF16: return 1.0 / 128;
    case DType::kF16: return 1.0 / 1024;
    default: return 0;
  }
}

// Input of rank `r` at index i for reductions: small integers, so every
// reduction is exact in every dtype (prod of {1,2} over <= 8 ranks fits u8).
double RedVal(ReduceOp op, int r, int64_t i) {
  if (op == ReduceOp::kProd) return 1 + (r + i) % 2;
  return 1 + (r * 3 + i) % 5;
}
double Expected(ReduceOp op, DType d, int n, int64_t i) {
  double acc = RedVal(op, 0, i);
  for (int r = 1; r < n; ++r) {
    double v = RedVal(op, r, i);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: acc += v; break;
      case ReduceOp::kProd: acc *= v; break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
    }
  }
  if (op == ReduceOp::kAvg) acc = core::IsFloating(d) ? acc / n : std::floor(acc / n);
  return acc;
}
// Payload for data-movement ops: depends on (source, index).
double DataVal(int src, int64_t i) { return 1 + (src * 7 + i * 3) % 100; }
constexpr double kGarbage = 77;

absl::StatusOr<Tensor> Make(DType d, int64_t n, double fill) {
  absl::StatusOr<Tensor> t = Tensor::Empty({n}, d);
  if (!t.ok()) return t;
  for (int64_t i = 0; i < n; ++i) SetAt(*t, i, fill);
  return t;
}

bool Close(double got, double want, DType d) {
  return std::fabs(got - want) <= Tolerance(d) * std::max(1.0, std::fabs(want));
}

std::string Label(const char* op, DType d, int64_t count, bool in_place) {
  return absl::StrCat(op, " ", core::DTypeName(d), " count=", count,
                      in_place ? " in-place" : " out-of-place");
}

template <typename F>
absl::Status CheckAll(const Tensor& t, int64_t n, F want, const std::string& label,
                      const Communicator& c, int64_t offset = 0) {
  for (int64_t i = 0; i < n; ++i) {
    double g = GetAt(t, offset + i), w = want(i);
    if (!Close(g, w, t.dtype())) {
      return absl::InternalError(absl::StrCat(label, ": rank ", c.rank(), " of ", c.size(),
                                              " index ", offset + i, ": got ", g, " expected ",
                                              w));
    }
  }
  return absl::OkStatus();
}

absl::Status Annotate(absl::Status s, const std::string& label) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(label, ": ", s.message()));
}

// counts + the multi-MiB count for dtype d (divided by `div`).
std::vector<int64_t> Counts(const SuiteOptions& o, DType d, bool large, int div = 1) {
  std::vector<int64_t> c = o.counts;
  if (large) c.push_back(static_cast<int64_t>(o.large_bytes / core::DTypeSize(d)) / div);
  return c;
}

absl::Status AllReduceCase(Communicator& c, const SuiteOptions& o) {
  const int n = c.size(), r = c.rank();
  for (DType d : kDTypes) {
    for (ReduceOp op : kOps) {
      bool large = op == ReduceOp::kSum || d == DType::kF32;
      for (int64_t count : Counts(o, d, large)) {
        for (bool in_place : {false, true}) {
          std::string label = Label("all_reduce", d, count, in_place) + " " + ReduceOpName(op);
          absl::StatusOr<Tensor> in = Make(d, count, 0);
          if (!in.ok()) return in.status();
          for (int64_t i = 0; i < count; ++i) SetAt(*in, i, RedVal(op, r, i));
          Tensor out = *in;
          if (!in_place) {
            absl::StatusOr<Tensor> t = Make(d, count, kGarbage);
            if (!t.ok()) return t.status();
            out = *t;
          }
          LOOM_RETURN_IF_ERROR(Annotate(c.AllReduce(*in, out, op)->Wait(), label));
          LOOM_RETURN_IF_ERROR(CheckAll(
              out, count, [&](int64_t i) { return Expected(op, d, n, i); }, label, c));
          if (!in_place) {
            LOOM_RETURN_IF_ERROR(CheckAll(*in, count, [&](int64_t i) { return RedVal(op, r, i); },
                                          label + " (input must be unchanged)", c));
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status BroadcastCase(Communicator& c, const SuiteOptions& o) {
  const int n = c.size(), r = c.rank();
  for (DType d : kDTypes) {
    for (int64_t count : Counts(o, d, d == DType::kF32 || d == DType::kBF16)) {
      for (bool in_place : {false, true}) {
        for (int root : {0, n - 1}) {
          std::string label = absl::StrCat(Label("broadcast", d, count, in_place), " root=", root);
          absl::StatusOr<Tensor> in = Make(d, count, 0);
          if (!in.ok()) return in.status();
          for (int64_t i = 0; i < count; ++i) SetAt(*in, i, DataVal(r, i));
          Tensor out = *in;
          if (!in_place) out = *Make(d, count, kGarbage);
          LOOM_RETURN_IF_ERROR(Annotate(c.Broadcast(*in, out, root)->Wait(), label));
          LOOM_RETURN_IF_ERROR(CheckAll(
              out, count, [&](int64_t i) { return DataVal(root, i); }, label, c));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ReduceCase(Communicator& c, const SuiteOptions& o) {
  const int n = c.size(), r = c.rank();
  for (DType d : kDTypes) {
    for (ReduceOp op : kOps) {
      for (int64_t count : Counts(o, d, d == DType::kF32 && op == ReduceOp::kSum)) {
        for (bool in_place : {false, true}) {
          for (int root : {0, n - 1}) {
            std::string label = absl::StrCat(Label("reduce", d, count, in_place), " ",
                                             ReduceOpName(op), " root=", root);
            absl::StatusOr<Tensor> in = Make(d, count, 0);
            if (!in.ok()) return in.status();
            for (int64_t i = 0; i < count; ++i) SetAt(*in, i, RedVal(op, r, i));
            Tensor out = *in;
            if (!in_place) out = *Make(d, count, kGarbage);
            LOOM_RETURN_IF_ERROR(Annotate(c.Reduce(*in, out, op, root)->Wait(), label));
            if (r == root) {
              LOOM_RETURN_IF_ERROR(
                  CheckAll(out, count, [&](int64_t i) { return Expected(op, d, n, i); }, label, c));
            } else if (!in_place) {
              LOOM_RETURN_IF_ERROR(CheckAll(out, count, [&](int64_t) { return kGarbage; },
                                            label + " (non-root output must be untouched)", c));
            }
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status AllGatherCase(Communicator& c, const SuiteOptions& o) {
  const int n = c.size(), r = c.rank();
  for (DType d : kDTypes) {
    for (int64_t count : Counts(o, d, d == DType::kF32 || d == DType::kBF16, n)) {
      for (bool in_place : {false, true}) {
        std::string label = Label("all_gather", d, count, in_place);
        absl::StatusOr<Tensor> out = Make(d, count * n, kGarbage);
        if (!out.ok()) return out.status();
        Tensor in = in_place ? *out->View(r * count, {count}) : *Make(d, count, 0);
        for (int64_t i = 0; i < count; ++i) SetAt(in, i, DataVal(r, i));
        LOOM_RETURN_IF_ERROR(Annotate(c.AllGather(in, *out)->Wait(), label));
        for (int src = 0; src < n; ++src) {
          LOOM_RETURN_IF_ERROR(CheckAll(*out, count, [&](int64_t i) { return DataVal(src, i); },
                                        absl::StrCat(label, " block ", src), c, src * count));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ReduceScatterCase(Communicator& c, const SuiteOptions& o) {
  const int n = c.size(), r = c.rank();
  for (DType d : kDTypes) {
    for (ReduceOp op : kOps) {
      bool large = op == ReduceOp::kSum && (d == DType::kF32 || d == DType::kBF16);
      for (int64_t count : Counts(o, d, large, n)) {
        for (bool in_place : {false, true}) {
          std::string label =
              absl::StrCat(Label("reduce_scatter", d, count, in_place), " ", ReduceOpName(op));
          absl::StatusOr<Tensor> in = Make(d, count * n, 0);
          if (!in.ok()) return in.status();
          // Global index g = block * count + i: value RedVal(op, r, g).
          for (int64_t g = 0; g < count * n; ++g) SetAt(*in, g, RedVal(op, r, g));
          Tensor out = in_place ? *in->View(r * count, {count}) : *Make(d, count, kGarbage);
          LOOM_RETURN_IF_ERROR(Annotate(c.ReduceScatter(*in, out, op)->Wait(), label));
          LOOM_RETURN_IF_ERROR(CheckAll(
              out, count, [&](int64_t i) { return Expected(op, d, n, r * count + i); }, label, c));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status AllToAllCase(Communicator& c, const SuiteOptions& o) {
  const int n = c.size(), r = c.rank();
  for (DType d : kDTypes) {
    for (int64_t count : Counts(o, d, d == DType::kF32, n)) {
      for (bool in_place : {false, true}) {
        std::string label = Label("all_to_all", d, count, in_place);
        absl::StatusOr<Tensor> in = Make(d, count * n, 0);
        if (!in.ok()) return in.status();
        // Block j of rank r goes to rank j: value DataVal(r * n + j, i).
        for (int j = 0; j < n; ++j) {
          for (int64_t i = 0; i < count; ++i) SetAt(*in, j * count + i, DataVal(r * n + j, i));
        }
        Tensor out = in_place ? *in : *Make(d, count * n, kGarbage);
        LOOM_RETURN_IF_ERROR(Annotate(c.AllToAll(*in, out)->Wait(), label));
        for (int src = 0; src < n; ++src) {
          LOOM_RETURN_IF_ERROR(CheckAll(
              out, count, [&](int64_t i) { return DataVal(src * n + r, i); },
              absl::StrCat(label, " block ", src), c, src * count));
        }
      }
    }
  }
  return absl::OkStatus();
}

// all_to_all_v's count patterns: what rank `src` sends rank `dst`, with `m`
// the pattern's unit.
struct CountPattern {
  const char* name;
  int64_t (*count)(int src, int dst, int n, int64_t m);
};
const CountPattern kCountPatterns[] = {
    {"equal", [](int, int, int, int64_t m) { return m; }},
    {"unequal", [](int src, int dst, int, int64_t m) { return m * (1 + (src + 2 * dst) % 3); }},
    // Some pairs (a rank's block to itself too) exchange nothing.
    {"zero to some peers",
     [](int src, int dst, int, int64_t m) { return (src + dst) % 2 ? m : int64_t{0}; }},
    // Rank 0 sends nothing at all; the last rank receives nothing at all.
    {"silent rank 0, deaf last rank",
     [](int src, int dst, int n, int64_t m) { return src == 0 || dst == n - 1 ? 0 : m; }},
    {"nothing at all", [](int, int, int, int64_t) { return int64_t{0}; }},
};

absl::Status AllToAllVCase(Communicator& c, const SuiteOptions& o) {
  const int n = c.size(), r = c.rank();
  for (DType d : kDTypes) {
    for (const CountPattern& p : kCountPatterns) {
      // Units: the suite's counts but 0 (a pattern of its own), and for f32
      // one near large_bytes per rank.
      std::vector<int64_t> units;
      for (int64_t count : Counts(o, d, d == DType::kF32, 2 * n)) {
        if (count > 0) units.push_back(count);
      }
      for (int64_t m : units) {
        std::string label = absl::StrCat("all_to_all_v ", core::DTypeName(d), " ", p.name,
                                         " unit=", m);
        std::vector<int64_t> send(n), recv(n);
        for (int j = 0; j < n; ++j) {
          send[j] = p.count(r, j, n, m);
          recv[j] = p.count(j, r, n, m);
        }
        int64_t send_total = 0, recv_total = 0;
        for (int j = 0; j < n; ++j) {
          send_total += send[j];
          recv_total += recv[j];
        }
        absl::StatusOr<Tensor> in = Make(d, send_total, 0);
        if (!in.ok()) return in.status();
        // Rank r's block for rank j: value DataVal(r * n + j, i).
        int64_t at = 0;
        for (int j = 0; j < n; at += send[j++]) {
          for (int64_t i = 0; i < send[j]; ++i) SetAt(*in, at + i, DataVal(r * n + j, i));
        }
        absl::StatusOr<Tensor> out = Make(d, recv_total, kGarbage);
        if (!out.ok()) return out.status();
        LOOM_RETURN_IF_ERROR(Annotate(c.AllToAllV(*in, send, *out, recv)->Wait(), label));
        at = 0;
        for (int src = 0; src < n; at += recv[src++]) {
          LOOM_RETURN_IF_ERROR(CheckAll(
              *out, recv[src], [&](int64_t i) { return DataVal(src * n + r, i); },
              absl::StrCat(label, " block from rank ", src), c, at));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status SendRecvCase(Communicator& c, const SuiteOptions& o) {
  const int n = c.size(), r = c.rank();
  if (n == 1) return absl::OkStatus();
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  for (DType d : kDTypes) {
    for (int64_t count : Counts(o, d, d == DType::kF32)) {
      std::string label = Label("send/recv", d, count, false);
      // Two messages with different tags, received in the opposite order.
      Tensor s1 = *Make(d, count, 0), s2 = *Make(d, count, 0);
      for (int64_t i = 0; i < count; ++i) {
        SetAt(s1, i, DataVal(r, i));
        SetAt(s2, i, DataVal(r + 50, i));
      }
      Tensor r1 = *Make(d, count, kGarbage), r2 = *Make(d, count, kGarbage);
      std::vector<WorkPtr> works;
      if (o.p2p_matches_tags) {
        works = {c.Send(s1, right, 5), c.Send(s2, right, 6), c.Recv(r2, left, 6),
                 c.Recv(r1, left, 5)};
      } else if (r % 2 == 0) {  // issue-order matching: no cycle of waiting sends
        works = {c.Send(s1, right, 5), c.Send(s2, right, 6), c.Recv(r1, left, 5),
                 c.Recv(r2, left, 6)};
      } else {
        works = {c.Recv(r1, left, 5), c.Recv(r2, left, 6), c.Send(s1, right, 5),
                 c.Send(s2, right, 6)};
      }
      LOOM_RETURN_IF_ERROR(Annotate(WaitAll(works), label));
      LOOM_RETURN_IF_ERROR(CheckAll(
          r1, count, [&](int64_t i) { return DataVal(left, i); }, label + " tag 5", c));
      LOOM_RETURN_IF_ERROR(CheckAll(
          r2, count, [&](int64_t i) { return DataVal(left + 50, i); }, label + " tag 6", c));
    }
  }
  return absl::OkStatus();
}

absl::Status BatchCase(Communicator& c, const SuiteOptions& o) {
  const int n = c.size(), r = c.rank();
  if (n == 1) return absl::OkStatus();
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  for (int64_t count : Counts(o, DType::kF32, true)) {
    std::string label = Label("batch_send_recv", DType::kF32, count, false);
    Tensor to_right = *Make(DType::kF32, count, 0), to_left = *Make(DType::kF32, count, 0);
    for (int64_t i = 0; i < count; ++i) {
      SetAt(to_right, i, DataVal(r, i));
      SetAt(to_left, i, DataVal(r + 30, i));
    }
    Tensor from_left = *Make(DType::kF32, count, kGarbage);
    Tensor from_right = *Make(DType::kF32, count, kGarbage);
    // Like a 1F1B steady state: activations go right, gradients go left.
    std::vector<P2POp> ops = {{P2POp::Kind::kRecv, from_left, left, 1},
                              {P2POp::Kind::kSend, to_right, right, 1},
                              {P2POp::Kind::kRecv, from_right, right, 2},
                              {P2POp::Kind::kSend, to_left, left, 2}};
    LOOM_RETURN_IF_ERROR(Annotate(c.BatchSendRecv(ops)->Wait(), label));
    LOOM_RETURN_IF_ERROR(CheckAll(
        from_left, count, [&](int64_t i) { return DataVal(left, i); }, label, c));
    LOOM_RETURN_IF_ERROR(CheckAll(
        from_right, count, [&](int64_t i) { return DataVal(right + 30, i); }, label, c));
  }
  return absl::OkStatus();
}

// Messages between two ranks with one tag are received in the order sent,
// across operations and within one batch (comm.h, POINT TO POINT). Along a
// chain (rank r receives from r - 1, then sends to r + 1), four messages
// (tags 7, 8, 7, 7) go as a Send, a batch of two and a Send. Where tags
// route, the receiver takes them in one batch in another order; on nccl it
// mirrors the sender's order and grouping, as portable code must.
absl::Status PointToPointOrderCase(Communicator& c, const SuiteOptions& o) {
  const int n = c.size(), r = c.rank();
  constexpr int64_t kCount = 6;
  const int tags[4] = {7, 8, 7, 7};
  if (r > 0) {
    const int left = r - 1;
    std::vector<Tensor> got;
    for (int k = 0; k < 4; ++k) got.push_back(*Make(DType::kF32, kCount, kGarbage));
    if (o.p2p_matches_tags) {
      LOOM_RETURN_IF_ERROR(Annotate(c.BatchSendRecv({{P2POp::Kind::kRecv, got[1], left, 8},
                                                     {P2POp::Kind::kRecv, got[0], left, 7},
                                                     {P2POp::Kind::kRecv, got[2], left, 7},
                                                     {P2POp::Kind::kRecv, got[3], left, 7}})
                                        ->Wait(),
                                    "p2p order: one batch of receives"));
    } else {
      LOOM_RETURN_IF_ERROR(Annotate(
          WaitAll({c.Recv(got[0], left, 7),
                   c.BatchSendRecv({{P2POp::Kind::kRecv, got[1], left, 8},
                                    {P2POp::Kind::kRecv, got[2], left, 7}}),
                   c.Recv(got[3], left, 7)}),
          "p2p order: receives in the sender's order"));
    }
    for (int k = 0; k < 4; ++k) {
      LOOM_RETURN_IF_ERROR(CheckAll(
          got[k], kCount, [&](int64_t i) { return DataVal(left + 10 * k, i); },
          absl::StrCat("p2p order: message ", k, " (tag ", tags[k], ") from rank ", left), c));
    }
  }
  if (r < n - 1) {
    const int right = r + 1;
    std::vector<Tensor> msg;
    for (int k = 0; k < 4; ++k) {
      msg.push_back(*Make(DType::kF32, kCount, 0));
      for (int64_t i = 0; i < kCount; ++i) SetAt(msg[k], i, DataVal(r + 10 * k, i));
    }
    LOOM_RETURN_IF_ERROR(Annotate(
        WaitAll({c.Send(msg[0], right, tags[0]),
                 c.BatchSendRecv({{P2POp::Kind::kSend, msg[1], right, tags[1]},
                                  {P2POp::Kind::kSend, msg[2], right, tags[2]}}),
                 c.Send(msg[3], right, tags[3])}),
        "p2p order: sends"));
  }
  // An empty batch completes at once.
  return Annotate(c.BatchSendRecv({})->Wait(absl::Seconds(10)), "empty batch_send_recv");
}

// The number a Work's description gives its op ("all_reduce #12 in group
// ..."), or -1.
int64_t OpNumber(const Work& w) {
  const std::string d = w.Describe();
  const size_t at = d.find(" #");
  if (at == std::string::npos) return -1;
  int64_t v = 0;
  size_t i = at + 2;
  if (i >= d.size() || d[i] < '0' || d[i] > '9') return -1;
  for (; i < d.size() && d[i] >= '0' && d[i] <= '9'; ++i) v = v * 10 + (d[i] - '0');
  return v;
}

// A collective after unequal point-to-point traffic matches across ranks
// (comm.h, POINT TO POINT: collectives ignore point-to-point traffic), as
// after a pipeline schedule in which stages issue different numbers of
// sends, receives and batches. Collective waits are bounded (60 s) so that a
// backend that numbers both kinds together fails here instead of hanging.
absl::Status CollectiveAfterUnequalPointToPointCase(Communicator& c, const SuiteOptions&) {
  const int n = c.size(), r = c.rank();
  const absl::Duration kBound = absl::Seconds(60);
  constexpr int64_t kCount = 5;
  auto message = [&](int src, int k) {
    Tensor t = *Make(DType::kF32, kCount, 0);
    for (int64_t i = 0; i < kCount; ++i) SetAt(t, i, DataVal(src * 16 + k, i));
    return t;
  };
  auto expect = [&](const std::vector<Tensor>& got, int src, int k0, const char* what) {
    for (size_t k = 0; k < got.size(); ++k) {
      LOOM_RETURN_IF_ERROR(CheckAll(got[k], kCount,
                                    [&](int64_t i) { return DataVal(src * 16 + k0 + k, i); },
                                    absl::StrCat(what, " message ", k, " from rank ", src), c));
    }
    return absl::OkStatus();
  };
  // Which collective this is among the communicator's collectives, the same
  // on every rank.
  std::vector<int64_t> numbers;
  auto numbered = [&](const WorkPtr& w) {
    numbers.push_back(OpNumber(*w));
    return w;
  };

  // 1. Forward, along the chain: rank r receives r messages from r - 1 and
  //    sends r + 1 to r + 1; odd ranks receive one by one and send in one
  //    batch, even ranks the other way round.
  std::vector<WorkPtr> p2p;
  std::vector<Tensor> got;
  if (r > 0) {
    std::vector<P2POp> batch;
    for (int k = 0; k < r; ++k) {
      got.push_back(*Make(DType::kF32, kCount, kGarbage));
      if (r % 2 == 1) {
        p2p.push_back(c.Recv(got.back(), r - 1, 100 + k));
      } else {
        batch.push_back({P2POp::Kind::kRecv, got.back(), r - 1, 100 + k});
      }
    }
    if (!batch.empty()) p2p.push_back(c.BatchSendRecv(batch));
  }
  std::vector<Tensor> sent;
  if (r < n - 1) {
    std::vector<P2POp> batch;
    for (int k = 0; k < r + 1; ++k) {
      sent.push_back(message(r, k));
      if (r % 2 == 0) {
        p2p.push_back(c.Send(sent.back(), r + 1, 100 + k));
      } else {
        batch.push_back({P2POp::Kind::kSend, sent.back(), r + 1, 100 + k});
      }
    }
    if (!batch.empty()) p2p.push_back(c.BatchSendRecv(batch));
  }
  LOOM_RETURN_IF_ERROR(Annotate(WaitAll(p2p), "forward point-to-point traffic"));
  if (r > 0) LOOM_RETURN_IF_ERROR(expect(got, r - 1, 0, "forward"));

  // The last stage broadcasts a value (the pipeline's mean loss), then every
  // rank all-reduces.
  Tensor loss = *Make(DType::kF64, 1, r == n - 1 ? 2.5 : kGarbage);
  LOOM_RETURN_IF_ERROR(Annotate(numbered(c.Broadcast(loss, n - 1))->Wait(kBound),
                                "broadcast after unequal p2p"));
  LOOM_RETURN_IF_ERROR(CheckAll(loss, 1, [](int64_t) { return 2.5; },
                                "broadcast after unequal p2p", c));
  Tensor ones = *Make(DType::kF32, kCount, 1);
  LOOM_RETURN_IF_ERROR(Annotate(numbered(c.AllReduce(ones, ReduceOp::kSum))->Wait(kBound),
                                "all_reduce after unequal p2p"));
  LOOM_RETURN_IF_ERROR(CheckAll(ones, kCount, [&](int64_t) { return static_cast<double>(n); },
                                "all_reduce after unequal p2p", c));

  // 2. Backward, along the chain the other way, with other counts (rank r
  //    receives n - r - 1 messages from r + 1, sends n - r to r - 1), and a
  //    collective issued before anyone waits for that traffic.
  p2p.clear();
  got.clear();
  sent.clear();
  if (r < n - 1) {
    std::vector<P2POp> batch;
    for (int k = 0; k < n - r - 1; ++k) {
      got.push_back(*Make(DType::kF32, kCount, kGarbage));
      batch.push_back({P2POp::Kind::kRecv, got.back(), r + 1, 200 + k});
    }
    p2p.push_back(c.BatchSendRecv(batch));
  }
  if (r > 0) {
    for (int k = 0; k < n - r; ++k) {
      sent.push_back(message(r, k));
      p2p.push_back(c.Send(sent.back(), r - 1, 200 + k));
    }
  }
  Tensor top = *Make(DType::kI32, 3, r);
  WorkPtr max = numbered(c.AllReduce(top, ReduceOp::kMax));
  LOOM_RETURN_IF_ERROR(Annotate(WaitAll(p2p), "backward point-to-point traffic"));
  LOOM_RETURN_IF_ERROR(Annotate(max->Wait(kBound), "all_reduce issued before waiting for p2p"));
  LOOM_RETURN_IF_ERROR(CheckAll(top, 3, [&](int64_t) { return n - 1; },
                                "all_reduce issued before waiting for p2p", c));
  if (r < n - 1) LOOM_RETURN_IF_ERROR(expect(got, r + 1, 0, "backward"));

  // 3. Every rank numbered those collectives alike.
  Tensor mine = *Make(DType::kI64, static_cast<int64_t>(numbers.size()), 0);
  for (size_t k = 0; k < numbers.size(); ++k) SetAt(mine, k, static_cast<double>(numbers[k]));
  Tensor all = *Make(DType::kI64, static_cast<int64_t>(numbers.size()) * n, 0);
  LOOM_RETURN_IF_ERROR(Annotate(c.AllGather(mine, all)->Wait(kBound), "all_gather of op numbers"));
  for (size_t k = 0; k < numbers.size(); ++k) {
    if (numbers[k] < 0) {
      return absl::InternalError(absl::StrCat("collective ", k, " of the case has no \"#<number>\" "
                                              "in its description"));
    }
    for (int q = 0; q < n; ++q) {
      const double theirs = GetAt(all, q * static_cast<int64_t>(numbers.size()) + k);
      if (theirs != static_cast<double>(numbers[k])) {
        return absl::InternalError(absl::StrCat(
            "collective ", k, " of the case is #", numbers[k], " on rank ", r, " but #", theirs,
            " on rank ", q, ": collectives must be numbered apart from point-to-point ops"));
      }
    }
  }
  // 4. The communicator still splits and its children work.
  auto child = c.Split(r % 2, r, "after_p2p");
  if (!child.ok()) return Annotate(child.status(), "split after unequal p2p");
  Tensor t = *Make(DType::kI32, 2, 1);
  LOOM_RETURN_IF_ERROR(Annotate((*child)->AllReduce(t, ReduceOp::kSum)->Wait(kBound),
                                "all_reduce on a child split after unequal p2p"));
  return CheckAll(t, 2, [&](int64_t) { return (n + (r % 2 == 0 ? 1 : 0)) / 2; },
                  "all_reduce on a child split after unequal p2p", c);
}

// WaitOnStream, the hot-path wait of layers and optimizer: once it returns,
// the next operation sees the result (here an in-place all-reduce of the
// first one's output, the multi-MiB size so that it takes the ring).
absl::Status WaitOnStreamCase(Communicator& c, const SuiteOptions& o) {
  const int n = c.size();
  const int64_t count = static_cast<int64_t>(o.large_bytes / sizeof(float));
  absl::StatusOr<Tensor> in = Make(DType::kF32, count, 0);
  absl::StatusOr<Tensor> out = Make(DType::kF32, count, kGarbage);
  if (!in.ok() || !out.ok()) return in.ok() ? out.status() : in.status();
  for (int64_t i = 0; i < count; ++i) SetAt(*in, i, DataVal(c.rank(), i));
  LOOM_RETURN_IF_ERROR(c.AllReduce(*in, *out, ReduceOp::kSum)->WaitOnStream());
  LOOM_RETURN_IF_ERROR(c.AllReduce(*out, ReduceOp::kSum)->WaitOnStream());
  LOOM_RETURN_IF_ERROR(c.Barrier()->Wait());  // then read on the host
  return CheckAll(
      *out, count,
      [&](int64_t i) {
        double sum = 0;
        for (int r = 0; r < n; ++r) sum += DataVal(r, i);
        return n * sum;
      },
      "all_reduce of an all_reduce after WaitOnStream", c);
}

absl::Status BarrierCase(Communicator& c, const SuiteOptions&) {
  for (int i = 0; i < 3; ++i) LOOM_RETURN_IF_ERROR(c.Barrier()->Wait());
  return absl::OkStatus();
}

absl::Status ManyInFlightCase(Communicator& c, const SuiteOptions&) {
  const int n = c.size(), r = c.rank();
  constexpr int kOpsInFlight = 100;
  constexpr int64_t kCount = 1000;
  std::vector<Tensor> bufs;
  std::vector<WorkPtr> works;
  for (int k = 0; k < kOpsInFlight; ++k) {
    ReduceOp op = kOps[k % 5];
    if (k % 10 == 9) {  // every tenth an all-gather
      Tensor in = *Make(DType::kI32, kCount, 0);
      for (int64_t i = 0; i < kCount; ++i) SetAt(in, i, DataVal(r + k, i));
      bufs.push_back(*Make(DType::kI32, kCount * n, kGarbage));
      works.push_back(c.AllGather(in, bufs.back()));
    } else {
      Tensor t = *Make(DType::kF32, kCount, 0);
      for (int64_t i = 0; i < kCount; ++i) SetAt(t, i, RedVal(op, r, i + k));
      bufs.push_back(t);
      works.push_back(c.AllReduce(t, op));
    }
  }
  for (int k = 0; k < kOpsInFlight; ++k) {
    std::string label = absl::StrCat("op ", k, " of ", kOpsInFlight, " in flight");
    LOOM_RETURN_IF_ERROR(Annotate(works[k]->Wait(), label));
    ReduceOp op = kOps[k % 5];
    if (k % 10 == 9) {
      for (int src = 0; src < n; ++src) {
        LOOM_RETURN_IF_ERROR(CheckAll(
            bufs[k], kCount, [&](int64_t i) { return DataVal(src + k, i); }, label, c,
            src * kCount));
      }
    } else {
      LOOM_RETURN_IF_ERROR(CheckAll(bufs[k], kCount,
                                    [&](int64_t i) { return Expected(op, DType::kF32, n, i + k); },
                                    label, c));
    }
  }
  return absl::OkStatus();
}

// Ops in flight finish whichever handle a rank waits on first: the lower
// half of the ranks waits in reverse issue order, the upper half in order,
// on two communicators.
// (A backend that advances an op only while its own handle is polled
// deadlocks here once an op takes several steps: recursive doubling.)
absl::Status WaitInAnyOrderCase(Communicator& c, const SuiteOptions&) {
  const int n = c.size(), r = c.rank();
  auto other = c.Split(0, r, "wait_in_any_order");
  if (!other.ok()) return Annotate(other.status(), "split for the any-order waits");
  constexpr int kOps = 6;
  constexpr int64_t kCount = 16;  // small: the latency path of every backend
  std::vector<Tensor> bufs;
  std::vector<WorkPtr> works;
  for (int k = 0; k < kOps; ++k) {
    bufs.push_back(*Make(DType::kF32, kCount, 0));
    for (int64_t i = 0; i < kCount; ++i) SetAt(bufs[k], i, RedVal(ReduceOp::kSum, r, i + k));
    Communicator& on = k % 2 == 0 ? c : **other;
    works.push_back(on.AllReduce(bufs[k], ReduceOp::kSum));
  }
  for (int j = 0; j < kOps; ++j) {
    const bool reverse = r < n / 2;
    const int k = reverse ? kOps - 1 - j : j;
    const std::string label = absl::StrCat("op ", k, " waited ", j, reverse ? " (reverse)" : "");
    LOOM_RETURN_IF_ERROR(Annotate(works[k]->Wait(), label));
    LOOM_RETURN_IF_ERROR(CheckAll(
        bufs[k], kCount, [&](int64_t i) { return Expected(ReduceOp::kSum, DType::kF32, n, i + k); },
        label, c));
  }
  return absl::OkStatus();
}

// Operations progress with only Poll (no Wait): nobody blocks on them.
absl::Status PollOnlyCase(Communicator& c, const SuiteOptions&) {
  const int n = c.size();
  Tensor t = *Make(DType::kF64, 1000, 1);
  Tensor u = *Make(DType::kF64, 1000, 2);
  WorkPtr a = c.AllReduce(t, ReduceOp::kSum);
  WorkPtr b = c.AllReduce(u, ReduceOp::kSum);
  absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!(a->Poll() && b->Poll())) {
    if (absl::Now() > deadline) {
      return absl::InternalError("all_reduce made no progress in 30 s with only Poll()");
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  LOOM_RETURN_IF_ERROR(a->Wait(absl::ZeroDuration()));
  LOOM_RETURN_IF_ERROR(b->Wait(absl::ZeroDuration()));
  LOOM_RETURN_IF_ERROR(CheckAll(t, 1000, [&](int64_t) { return n; }, "poll-only all_reduce", c));
  return CheckAll(u, 1000, [&](int64_t) { return 2 * n; }, "poll-only all_reduce", c);
}

absl::Status SplitCase(Communicator& c, const SuiteOptions&) {
  const int n = c.size(), r = c.rank();
  // Reverse order via key.
  auto rev = c.Split(0, -r, "reversed");
  if (!rev.ok()) return rev.status();
  if ((*rev)->size() != n || (*rev)->rank() != n - 1 - r) {
    return absl::InternalError(absl::StrCat("split(0, -rank): rank ", r, " got rank ",
                                            (*rev)->rank(), " of ", (*rev)->size(),
                                            ", expected ", n - 1 - r, " of ", n));
  }
  // Only even ranks join; odd ranks get nullptr.
  auto even = c.Split(r % 2 == 0 ? 0 : -1, r, "even");
  if (!even.ok()) return even.status();
  if ((r % 2 == 0) != (*even != nullptr)) {
    return absl::InternalError(absl::StrCat("split with color -1: rank ", r, " got ",
                                            *even ? "a group" : "nullptr"));
  }
  if (*even) {
    if ((*even)->rank() != r / 2 || (*even)->size() != (n + 1) / 2) {
      return absl::InternalError("split(even): wrong rank/size");
    }
    // The group sums its world ranks: sum of even numbers < n.
    Tensor t = *Make(DType::kI64, 3, r);
    LOOM_RETURN_IF_ERROR((*even)->AllReduce(t, ReduceOp::kSum)->Wait());
    int64_t want = 0;
    for (int q = 0; q < n; q += 2) want += q;
    LOOM_RETURN_IF_ERROR(CheckAll(
        t, 3, [&](int64_t) { return want; }, "split(even) all_reduce", c));
  }
  // The parent still works after splitting.
  Tensor t = *Make(DType::kI32, 5, r);
  LOOM_RETURN_IF_ERROR((*rev)->AllReduce(t, ReduceOp::kMax)->Wait());
  return CheckAll(t, 5, [&](int64_t) { return n - 1; }, "split(reversed) all_reduce max", c);
}

absl::Status ConcurrentSubgroupsCase(Communicator& c, const SuiteOptions& o) {
  const int r = c.rank(), n = c.size();
  auto a = c.Split(r % 2, r, "parity");
  if (!a.ok()) return a.status();
  auto b = c.Split(r < (n + 1) / 2 ? 0 : 1, r, "halves");
  if (!b.ok()) return b.status();
  absl::Status sa, sb;
  auto run = [&](Communicator* g, absl::Status* out, int salt) {
    std::vector<Tensor> ts;
    std::vector<WorkPtr> ws;
    for (int k = 0; k < 20; ++k) {
      int64_t count = k % 5 == 4 ? static_cast<int64_t>(o.large_bytes / 4 / 4) : 1000;
      Tensor t = *Make(DType::kF32, count, 0);
      for (int64_t i = 0; i < count; ++i) SetAt(t, i, RedVal(ReduceOp::kSum, g->rank(), i + k + salt));
      ts.push_back(t);
      ws.push_back(g->AllReduce(t, ReduceOp::kSum));
    }
    for (int k = 0; k < 20; ++k) {
      std::string label = absl::StrCat("group '", g->group_name(), "' all_reduce ", k);
      *out = Annotate(ws[k]->Wait(), label);
      if (!out->ok()) return;
      *out = CheckAll(ts[k], ts[k].numel(), [&](int64_t i) {
        return Expected(ReduceOp::kSum, DType::kF32, g->size(), i + k + salt);
      }, label, *g);
      if (!out->ok()) return;
    }
  };
  std::thread ta(run, a->get(), &sa, 0);
  std::thread tb(run, b->get(), &sb, 3);
  ta.join();
  tb.join();
  LOOM_RETURN_IF_ERROR(sa);
  return sb;
}

absl::Status BadInputCase(Communicator& world, const SuiteOptions&) {
  // In a child: argument errors abort the communicator they were made on.
  auto child = world.Split(0, world.rank(), "bad_input");
  if (!child.ok()) return child.status();
  Communicator& c = **child;
  const int n = c.size(), r = c.rank();
  Tensor f7 = *Make(DType::kF32, 7, 1), f8 = *Make(DType::kF32, 8, 1), i7 = *Make(DType::kI32, 7, 1);
  struct Bad {
    const char* what;
    WorkPtr work;
    const char* names = nullptr;  // what the error must say, where checked
  };
  std::vector<Bad> bad = {
      {"all_reduce count mismatch", c.AllReduce(f7, f8, ReduceOp::kSum)},
      {"all_reduce dtype mismatch", c.AllReduce(f7, i7, ReduceOp::kSum)},
      {"all_reduce undefined", c.AllReduce(Tensor(), f7, ReduceOp::kSum)},
      {"all_reduce partial overlap", c.AllReduce(*f8.View(0, {7}), *f8.View(1, {7}), ReduceOp::kSum)},
      {"broadcast root -1", c.Broadcast(f7, -1)},
      {"broadcast root == size", c.Broadcast(f7, n)},
      {"reduce root out of range", c.Reduce(f7, f7, ReduceOp::kMax, n + 3)},
      {"all_gather wrong output size", c.AllGather(f7, f7 /* needs 7*size */)},
      {"reduce_scatter wrong input size", c.ReduceScatter(f7, f8, ReduceOp::kSum)},
      {"send peer out of range", c.Send(f7, n)},
      {"recv peer -1", c.Recv(f7, -1)},
      {"send to self", c.Send(f7, r)},
      {"send tag out of range", c.Send(f7, (r + 1) % n, -4)},
      {"batch with bad peer", c.BatchSendRecv({{P2POp::Kind::kRecv, f7, n + 1, 0}})},
  };
  if (n > 1) {
    bad.push_back({"all_to_all not divisible", c.AllToAll(*Make(DType::kF32, n + 1, 0),
                                                          *Make(DType::kF32, n + 1, 0))});
  }
  const std::vector<int64_t> ones(n, 1);
  std::vector<int64_t> negative(n, 1);
  negative[n - 1] = -1;
  const Tensor fn = *Make(DType::kF32, n, 1), fn_out = *Make(DType::kF32, n, 0);
  bad.push_back({"all_to_all_v send_counts of the wrong length",
                 c.AllToAllV(fn, std::vector<int64_t>(n + 1, 0), fn_out, ones),
                 "send_counts has"});
  bad.push_back({"all_to_all_v negative count", c.AllToAllV(fn, ones, fn_out, negative),
                 "is -1, expected >= 0"});
  bad.push_back({"all_to_all_v input not the sum of send_counts",
                 c.AllToAllV(*Make(DType::kF32, n + 1, 1), ones, fn_out, ones),
                 "(the sum of send_counts)"});
  bad.push_back({"all_to_all_v output not the sum of recv_counts",
                 c.AllToAllV(fn, ones, *Make(DType::kF32, 2 * n, 0), ones),
                 "(the sum of recv_counts)"});
  bad.push_back({"all_to_all_v in place", c.AllToAllV(fn, ones, fn, ones), "overlap"});
  if (n == 1) bad[7] = {"all_gather wrong output size", c.AllGather(f7, f8)};
  absl::Status first_error;
  for (Bad& b : bad) {
    absl::Status s = b.work->Wait(absl::Seconds(10));
    if (s.ok()) return absl::InternalError(absl::StrCat(b.what, ": accepted, expected an error"));
    if (!absl::IsInvalidArgument(s)) {
      return absl::InternalError(absl::StrCat(b.what, ": expected InvalidArgument, got ", s.ToString()));
    }
    if (b.names != nullptr && !absl::StrContains(s.message(), b.names)) {
      return absl::InternalError(
          absl::StrCat(b.what, ": the error must say \"", b.names, "\", got ", s.ToString()));
    }
    if (first_error.ok()) first_error = s;
  }
  // The rejected ops took their numbers and aborted the communicator (comm.h):
  // the next op fails at once, naming the first error.
  Tensor t = *Make(DType::kF32, 4, 1);
  {
    absl::Status s = c.AllReduce(t, ReduceOp::kSum)->Wait(absl::Seconds(10));
    if (!absl::IsFailedPrecondition(s) || !absl::StrContains(s.message(), first_error.message())) {
      return absl::InternalError(absl::StrCat("all_reduce after bad input: expected "
                                              "FailedPrecondition naming \"",
                                              first_error.message(), "\", got ", s.ToString()));
    }
  }
  child->reset();
  // The parent is unaffected.
  LOOM_RETURN_IF_ERROR(
      Annotate(world.AllReduce(t, ReduceOp::kSum)->Wait(), "all_reduce after bad input"));
  return CheckAll(t, 4, [&](int64_t) { return world.size(); }, "all_reduce after bad input",
                  world);
}

absl::Status MismatchCase(Communicator& c, const SuiteOptions&) {
  const int n = c.size(), r = c.rank();
  if (n == 1) return absl::OkStatus();
  auto child = c.Split(0, r, "mismatch");
  if (!child.ok()) return child.status();
  // Rank 0 reduces 7 elements, the others 8: nobody may report success.
  Tensor t = *Make(DType::kF32, r == 0 ? 7 : 8, 1);
  absl::Status s = (*child)->AllReduce(t, ReduceOp::kSum)->Wait(absl::Seconds(3));
  if (s.ok()) {
    return absl::InternalError(absl::StrCat("rank ", r, ": all_reduce with mismatched counts ",
                                            "(7 on rank 0, 8 elsewhere) reported success"));
  }
  if (r == 0 && !absl::IsInvalidArgument(s)) {
    return absl::InternalError(absl::StrCat("rank 0: mismatched counts should be reported as ",
                                            "InvalidArgument, got ", s.ToString()));
  }
  child->reset();
  // all_to_all_v: rank 0 expects 2 elements from rank 1, which sends 1. Only
  // rank 0 can tell (the others' messages are as they expect).
  auto v_child = c.Split(0, r, "mismatch_v");
  if (!v_child.ok()) return v_child.status();
  std::vector<int64_t> send(n, 1), recv(n, 1);
  if (r == 0) recv[1] = 2;
  Tensor in = *Make(DType::kF32, n, 1), out = *Make(DType::kF32, r == 0 ? n + 1 : n, 0);
  s = (*v_child)->AllToAllV(in, send, out, recv)->Wait(absl::Seconds(3));
  if (r == 0 && !absl::IsInvalidArgument(s)) {
    return absl::InternalError(absl::StrCat(
        "rank 0: all_to_all_v receiving 2 elements from rank 1, which sends 1, should fail with "
        "InvalidArgument, got ", s.ToString()));
  }
  v_child->reset();
  // The world is unaffected.
  LOOM_RETURN_IF_ERROR(c.Barrier()->Wait());
  return absl::OkStatus();
}

// Issue #14, item 6: rank 0 rejects a broadcast (bad arguments) that the
// others issue correctly; then every rank issues the same broadcast again.
// The rejected op keeps its number, so rank 0's second broadcast must never
// pair with the others' first (before the fix it did, silently: same count,
// dtype and root). The argument error aborts rank 0's communicator: its next
// op fails at once naming that error; the others' first op cannot complete.
// (Rooted at rank 0, so no rank sends rank 0 a message it never receives.)
absl::Status ArgumentErrorOnOneRankCase(Communicator& c, const SuiteOptions&) {
  const int n = c.size(), r = c.rank();
  if (n == 1) return absl::OkStatus();
  auto child = c.Split(0, r, "argument_error");
  if (!child.ok()) return child.status();
  Communicator& g = **child;
  Tensor first = *Make(DType::kF32, 8, 1), second = *Make(DType::kF32, 8, 1);
  Tensor seven = *Make(DType::kF32, 7, 1);
  WorkPtr w1 = r == 0 ? g.Broadcast(seven, first, 0)  // count mismatch
                      : g.Broadcast(first, 0);
  WorkPtr w2 = g.Broadcast(second, 0);
  if (r == 0) {
    absl::Status s1 = w1->Wait(absl::Seconds(10));
    if (!absl::IsInvalidArgument(s1)) {
      return absl::InternalError(absl::StrCat("rank 0: the bad broadcast should fail with "
                                              "InvalidArgument, got ", s1.ToString()));
    }
    absl::Status s2 = w2->Wait(absl::Seconds(10));
    if (s2.ok()) {
      return absl::InternalError(
          "rank 0: the broadcast after its rejected one succeeded: it paired with the other "
          "ranks' first broadcast (the rejected op took no number)");
    }
    if (!absl::IsFailedPrecondition(s2) || !absl::StrContains(s2.message(), s1.message())) {
      return absl::InternalError(absl::StrCat(
          "rank 0: the op after an argument error should fail with FailedPrecondition naming "
          "it (", s1.ToString(), "), got ", s2.ToString()));
    }
  } else {
    absl::Status s1 = w1->Wait(absl::Seconds(2));
    if (s1.ok()) {
      return absl::InternalError(absl::StrCat(
          "rank ", r, ": the first broadcast succeeded although rank 0 rejected its own: it "
          "paired with rank 0's next broadcast"));
    }
  }
  child->reset();
  // The world is unaffected.
  return Annotate(c.Barrier()->Wait(), "barrier after an argument error in a child");
}

}  // namespace

std::vector<Case> Cases(const SuiteOptions& o) {
  auto bind = [o](absl::Status (*f)(Communicator&, const SuiteOptions&)) {
    return [o, f](Communicator& c) { return f(c, o); };
  };
  std::vector<Case> cases = {
      {"AllReduce", bind(AllReduceCase)},
      {"Broadcast", bind(BroadcastCase)},
      {"Reduce", bind(ReduceCase)},
      {"AllGather", bind(AllGatherCase)},
      {"ReduceScatter", bind(ReduceScatterCase)},
      {"AllToAll", bind(AllToAllCase)},
      {"AllToAllV", bind(AllToAllVCase)},
      {"SendRecv", bind(SendRecvCase)},
      {"BatchSendRecv", bind(BatchCase)},
      {"Barrier", bind(BarrierCase)},
      {"WaitOnStream", bind(WaitOnStreamCase)},
      {"PointToPointOrder", bind(PointToPointOrderCase)},
      {"CollectiveAfterUnequalPointToPoint", bind(CollectiveAfterUnequalPointToPointCase)},
      {"ManyInFlight", bind(ManyInFlightCase)},
      {"WaitInAnyOrder", bind(WaitInAnyOrderCase)},
      {"PollOnly", bind(PollOnlyCase)},
      {"Split", bind(SplitCase)},
      {"ConcurrentSubgroups", bind(ConcurrentSubgroupsCase)},
      {"BadInput", bind(BadInputCase)},
  };
  // Every backend: an argument error aborts (MPI and NCCL would otherwise
  // pair the next op with the others' rejected one, silently).
  cases.push_back({"ArgumentErrorOnOneRank", bind(ArgumentErrorOnOneRankCase)});
  if (o.detects_mismatch) cases.push_back({"Mismatch", bind(MismatchCase)});
  return cases;
}

absl::Status DeadPeer(Communicator& world, int victim, const std::function<void()>& die,
                      absl::Duration timeout, absl::Duration slack, bool names_ranks,
                      std::string* observed) {
  // The all-to-all runs in a child: the all-reduce's failure aborts the world.
  auto child = world.Split(0, world.rank(), "dead_peer_all_to_all_v");
  if (!child.ok()) return Annotate(child.status(), "split before the dead-peer test");
  absl::Status s = world.Barrier()->Wait();
  if (!s.ok()) return Annotate(s, "barrier before the dead-peer test");
  if (world.rank() == victim) {
    die();
    return absl::OkStatus();
  }
  std::string who = absl::StrCat("rank ", world.rank(), " (victim ", victim, "): ");
  // Waits for `work` (op `what`): it must fail with DeadlineExceeded naming
  // the op (and the missing ranks) within the timeout + slack.
  auto expect_timeout = [&](const char* what, const WorkPtr& work) -> absl::Status {
    absl::Time start = absl::Now();
    absl::Status s = work->Wait();
    absl::Duration took = absl::Now() - start;
    if (observed) {
      absl::StrAppend(observed, observed->empty() ? "" : "; ", s.ToString(), " [after ",
                      absl::FormatDuration(took), "]");
    }
    if (s.ok()) {
      return absl::InternalError(absl::StrCat(who, what, " succeeded without the dead peer"));
    }
    if (!absl::IsDeadlineExceeded(s)) {
      return absl::InternalError(absl::StrCat(who, what, ": expected DeadlineExceeded, got ",
                                              s.ToString()));
    }
    if (took > timeout + slack) {
      return absl::InternalError(absl::StrCat(who, what, " failed only after ",
                                              absl::FormatDuration(took), " (timeout ",
                                              absl::FormatDuration(timeout), " + slack ",
                                              absl::FormatDuration(slack), ")"));
    }
    if (!absl::StrContains(s.message(), what) ||
        (names_ranks && !absl::StrContains(s.message(), "did not arrive"))) {
      return absl::InternalError(
          absl::StrCat(who, "the error must name the op and missing ranks: ", s.ToString()));
    }
    return absl::OkStatus();
  };
  if (observed) observed->clear();
  const int n = world.size();
  Tensor in = *Make(DType::kF32, 100 * n, 1), out = *Make(DType::kF32, 100 * n, 0);
  const std::vector<int64_t> counts(n, 100);
  LOOM_RETURN_IF_ERROR(
      expect_timeout("all_to_all_v", (*child)->AllToAllV(in, counts, out, counts)));
  Tensor t = *Make(DType::kF32, 1000, 1);
  LOOM_RETURN_IF_ERROR(expect_timeout("all_reduce", world.AllReduce(t, ReduceOp::kSum)));
  // The communicator is now aborted: later ops fail fast.
  absl::Status again = world.AllReduce(t, ReduceOp::kSum)->Wait(timeout + slack);
  if (again.ok()) return absl::InternalError(who + "an op after the failure succeeded");
  return absl::OkStatus();
}

namespace {

// Memory the case owns, lent to a communicator as a tensor: the case sees
// when the communicator lets go of it (the last tensor on it goes) and then
// overwrites it with kReleased, so a later access by the transport shows.
class Probe {
 public:
  static constexpr unsigned char kReleased = 0xAB;
  explicit Probe(size_t floats) : memory_(floats) {}
  Tensor Lend(float fill) {
    auto storage = core::Storage::Borrow(memory_.data(), memory_.size() * sizeof(float),
                                         core::Device::CPU());
    lent_ = storage;
    std::fill(memory_.begin(), memory_.end(), fill);
    return *Tensor::FromStorage(std::move(storage), 0, {static_cast<int64_t>(memory_.size())},
                                DType::kF32);
  }
  // Overwrites the memory if the communicator let go of it; true if it did.
  bool OverwriteIfReleased() {
    if (!lent_.expired()) return false;
    std::memset(memory_.data(), kReleased, memory_.size() * sizeof(float));
    overwritten_ = true;
    return true;
  }
  // False if something wrote into the memory after it was let go.
  bool Intact() const {
    if (!overwritten_) return true;
    const auto* bytes = reinterpret_cast<const unsigned char*>(memory_.data());
    for (size_t i = 0; i < memory_.size() * sizeof(float); ++i) {
      if (bytes[i] != kReleased) return false;
    }
    return true;
  }

 private:
  std::vector<float> memory_;
  std::weak_ptr<core::Storage> lent_;
  bool overwritten_ = false;
};

}  // namespace

absl::Status FailedOpKeepsBuffers(Communicator& world, absl::Duration timeout) {
  const int n = world.size(), r = world.rank();
  if (n < 2) return absl::OkStatus();
  auto side = world.Split(0, r, "side");  // stays healthy: syncs and progress
  if (!side.ok()) return side.status();
  auto slow = world.Split(0, r, "slow");  // rank 1 is late here
  if (!slow.ok()) return slow.status();
  auto doomed = world.Split(0, r, "doomed");  // rank 0 destroys it under a receive
  if (!doomed.ok()) return doomed.status();
  const absl::Duration patience = 4 * timeout + absl::Seconds(30);
  auto sync = [&] { return (*side)->BarrierWithin(patience)->Wait(); };
  constexpr int64_t kBig = 256 << 10;  // floats: 1 MiB, above rendezvous thresholds
  constexpr int64_t kSmall = 64;
  constexpr int kSendTag = 3, kRecvTag = 4;
  constexpr float kPayload = 7, kLate = 9;
  Probe sent(kBig), received(kSmall);
  std::string errors;
  auto error = [&](const std::string& e) {
    absl::StrAppend(&errors, errors.empty() ? "" : "; ", e);
  };

  if (r == 0) {
    Tensor payload = sent.Lend(kPayload);
    Tensor x = *Make(DType::kF32, 4, 1);
    WorkPtr send = (*slow)->BatchSendRecv({{P2POp::Kind::kSend, payload, 1, kSendTag}});
    WorkPtr reduce = (*slow)->AllReduce(x, ReduceOp::kSum);  // queued behind the send
    // The send may complete without its receive (an eager copy); the
    // all-reduce cannot. Whichever fails first aborts the communicator.
    const absl::Status s1 = send->Wait();
    const absl::Time t1 = absl::Now();
    const absl::Status s2 = reduce->Wait();
    const absl::Duration queued_took = absl::Now() - t1;
    const absl::Status first = s1.ok() ? s2 : s1;
    if (!absl::IsDeadlineExceeded(first)) {
      error(absl::StrCat("the first op to a late rank: expected DeadlineExceeded, got ",
                         first.ToString()));
    } else if (!s1.ok() && (!absl::IsFailedPrecondition(s2) ||
                            !absl::StrContains(s2.message(), s1.message()) ||
                            queued_took > absl::Seconds(1))) {
      error(absl::StrCat("the op queued behind a failed one: expected FailedPrecondition naming \"",
                         s1.message(), "\" at once, got ", s2.ToString(), " after ",
                         absl::FormatDuration(queued_took)));
    }
    const absl::Time t3 = absl::Now();
    const absl::Status s3 = (*slow)->Barrier()->Wait(timeout + absl::Seconds(5));
    if (!absl::IsFailedPrecondition(s3) || !absl::StrContains(s3.message(), first.message()) ||
        absl::Now() - t3 > absl::Seconds(1)) {
      error(absl::StrCat("an op after the failure: expected FailedPrecondition naming \"",
                         first.message(), "\" at once, got ", s3.ToString(), " after ",
                         absl::FormatDuration(absl::Now() - t3)));
    }
    // A receive posted when its communicator goes (Shutdown: Cancelled).
    Tensor inbox = received.Lend(0);
    WorkPtr recv = (*doomed)->Recv(inbox, 1, kRecvTag);
    (void)recv->Wait(absl::Milliseconds(300));  // started (posted) by now
    doomed->reset();
    const absl::Status s4 = recv->Wait(absl::Seconds(5));
    if (s4.ok()) error("a receive whose communicator was destroyed succeeded without a sender");
    // The caller lets go of everything (comm.h allows it once ops failed).
    send.reset();
    reduce.reset();
    recv.reset();
    payload = Tensor();
    inbox = Tensor();
    sent.OverwriteIfReleased();
    received.OverwriteIfReleased();
  }
  LOOM_RETURN_IF_ERROR(Annotate(sync(), "sync after rank 0's failures"));
  if (r == 1) {
    // Late: receive rank 0's failed send, send to its destroyed receive.
    Tensor got = *Make(DType::kF32, kBig, 0);
    absl::Status s = (*slow)->Recv(got, 0, kSendTag)->Wait(timeout + absl::Seconds(5));
    for (int64_t i = 0; s.ok() && i < kBig; ++i) {
      if (got.data<float>()[i] != kPayload) {
        error(absl::StrCat(
            "rank 0's failed send delivered ", got.data<float>()[i], " at index ", i,
            " instead of ", kPayload, ": its buffer was let go while the transport still read it"));
        break;
      }
    }
    Tensor late = *Make(DType::kF32, kSmall, kLate);
    (void)(*doomed)->Send(late, 0, kRecvTag)->Wait(timeout + absl::Seconds(5));
  }
  // Late messages reach rank 0 while it progresses here.
  for (int k = 0; k < 3; ++k) LOOM_RETURN_IF_ERROR(Annotate(sync(), "sync after the late rank"));
  if (r == 0) {
    if (!received.Intact()) {
      error("the late message was written into the buffer of a receive whose communicator was "
            "destroyed, after the communicator had let go of it");
    }
  }
  return errors.empty() ? absl::OkStatus()
                        : absl::InternalError(absl::StrCat("rank ", r, ": ", errors));
}

}  // namespace loom::comm::testing
