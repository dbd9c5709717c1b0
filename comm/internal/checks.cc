#include "comm/internal/checks.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"

namespace loom::comm::internal {

absl::Status CheckTensor(const char* what, const char* arg, const core::Tensor& t) {
  if (!t.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", arg, " is an undefined tensor"));
  }
  if (!t.device().is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", arg, " is on ", t.device().ToString(),
                                                   "; these backends move host memory (cpu)"));
  }
  return absl::OkStatus();
}

absl::Status CheckSameDType(const char* what, const core::Tensor& in, const core::Tensor& out) {
  if (in.dtype() != out.dtype()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": input dtype ", core::DTypeName(in.dtype()),
                                                   " != output dtype ", core::DTypeName(out.dtype())));
  }
  return absl::OkStatus();
}

absl::Status CheckRoot(const char* what, int root, int size) {
  if (root < 0 || root >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": root ", root, " is out of range [0, ", size, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckPeer(const char* what, int peer, int rank, int size) {
  if (peer < 0 || peer >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": peer ", peer, " is out of range [0, ", size, ")"));
  }
  if (peer == rank) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": peer ", peer, " is this rank; copy the tensor instead"));
  }
  return absl::OkStatus();
}

absl::Status CheckTag(const char* what, int tag) {
  if (tag < 0 || tag >= kMaxTag) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": tag ", tag, " is out of range [0, ", kMaxTag, ")"));
  }
  return absl::OkStatus();
}

#define LOOM_RETURN_IF_ERROR(expr)      \
  do {                                  \
    absl::Status _s = (expr);           \
    if (!_s.ok()) return _s;            \
  } while (0)

static absl::Status Pair(const char* what, const core::Tensor& in, const core::Tensor& out) {
  LOOM_RETURN_IF_ERROR(CheckTensor(what, "input", in));
  LOOM_RETURN_IF_ERROR(CheckTensor(what, "output", out));
  return CheckSameDType(what, in, out);
}

static absl::Status NumelIs(const char* what, const char* arg, const core::Tensor& t,
                            int64_t expected, const char* why) {
  if (t.numel() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", arg, " has ", t.numel(),
                                                   " elements, expected ", expected, " (", why,
                                                   ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckAlias(const char* what, const core::Tensor& in, const core::Tensor& out,
                        bool in_place) {
  if (!in_place && Overlaps(in.raw_data(), in.nbytes(), out.raw_data(), out.nbytes())) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": input and output overlap but are not the in-place layout (see comm.h: same "
              "memory for all_reduce/broadcast/reduce/all_to_all, input at output slot `rank` for "
              "all_gather, output at input slot `rank` for reduce_scatter)"));
  }
  return absl::OkStatus();
}

absl::Status CheckAllReduce(const core::Tensor& in, const core::Tensor& out) {
  LOOM_RETURN_IF_ERROR(Pair("all_reduce", in, out));
  LOOM_RETURN_IF_ERROR(NumelIs("all_reduce", "output", out, in.numel(), "same as input"));
  return CheckAlias("all_reduce", in, out, in.raw_data() == out.raw_data());
}

absl::Status CheckBroadcast(const core::Tensor& in, const core::Tensor& out, int root, int size) {
  LOOM_RETURN_IF_ERROR(Pair("broadcast", in, out));
  LOOM_RETURN_IF_ERROR(CheckRoot("broadcast", root, size));
  LOOM_RETURN_IF_ERROR(NumelIs("broadcast", "output", out, in.numel(), "same as input"));
  return CheckAlias("broadcast", in, out, in.raw_data() == out.raw_data());
}

absl::Status CheckReduce(const core::Tensor& in, const core::Tensor& out, int root, int size) {
  LOOM_RETURN_IF_ERROR(Pair("reduce", in, out));
  LOOM_RETURN_IF_ERROR(CheckRoot("reduce", root, size));
  LOOM_RETURN_IF_ERROR(NumelIs("reduce", "output", out, in.numel(), "same as input"));
  return CheckAlias("reduce", in, out, in.raw_data() == out.raw_data());
}

absl::Status CheckAllGather(const core::Tensor& in, const core::Tensor& out, int rank, int size) {
  LOOM_RETURN_IF_ERROR(Pair("all_gather", in, out));
  LOOM_RETURN_IF_ERROR(NumelIs("all_gather", "output", out, in.numel() * size, "group size x input"));
  return CheckAlias("all_gather", in, out,
                    in.raw_data() == static_cast<char*>(out.raw_data()) + rank * in.nbytes());
}

absl::Status CheckReduceScatter(const core::Tensor& in, const core::Tensor& out, int rank,
                                int size) {
  LOOM_RETURN_IF_ERROR(Pair("reduce_scatter", in, out));
  LOOM_RETURN_IF_ERROR(
      NumelIs("reduce_scatter", "input", in, out.numel() * size, "group size x output"));
  return CheckAlias("reduce_scatter", in, out,
                    out.raw_data() == static_cast<char*>(in.raw_data()) + rank * out.nbytes());
}

absl::Status CheckAllToAll(const core::Tensor& in, const core::Tensor& out, int size) {
  LOOM_RETURN_IF_ERROR(Pair("all_to_all", in, out));
  LOOM_RETURN_IF_ERROR(NumelIs("all_to_all", "output", out, in.numel(), "same as input"));
  if (in.numel() % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("all_to_all: input has ", in.numel(),
                                                   " elements, not a multiple of the group size ",
                                                   size));
  }
  return CheckAlias("all_to_all", in, out, in.raw_data() == out.raw_data());
}

absl::Status CheckP2P(const char* what, const core::Tensor& t, int peer, int tag, int rank,
                      int size) {
  LOOM_RETURN_IF_ERROR(CheckTensor(what, "tensor", t));
  LOOM_RETURN_IF_ERROR(CheckPeer(what, peer, rank, size));
  return CheckTag(what, tag);
}

absl::Status CheckBatch(const std::vector<P2POp>& ops, int rank, int size) {
  for (const P2POp& op : ops) {
    LOOM_RETURN_IF_ERROR(CheckP2P(op.kind == P2POp::Kind::kSend ? "batch_send_recv(send)"
                                                                : "batch_send_recv(recv)",
                                  op.tensor, op.peer, op.tag, rank, size));
  }
  return absl::OkStatus();
}

bool Overlaps(const void* a, size_t an, const void* b, size_t bn) {
  if (an == 0 || bn == 0) return false;
  auto pa = reinterpret_cast<uintptr_t>(a);
  auto pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + bn && pb < pa + an;
}

}  // namespace loom::comm::internal
