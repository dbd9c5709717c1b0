#include "comm/internal/checks.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/status_macros.h"

namespace loom::comm::internal {
namespace {

using core::Device;
using core::Tensor;

absl::Status CheckTensor(const char* what, const char* arg, const Tensor& t, Device device) {
  if (!t.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", arg, " is an undefined tensor"));
  }
  // Host memory is one place whatever a CPU device's index says.
  const bool on_device = device.is_cpu() ? t.device().is_cpu() : t.device() == device;
  if (!on_device) {
    const char* hint = device.is_cpu() ? " (the local, mpi and ucx backends move host memory; "
                                         "copy device tensors to the host, or use nccl)"
                       : t.device().is_cpu() ? " (copy host tensors to the GPU first)"
                                             : "";
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", arg, " is on ", t.device().ToString(),
                     "; this communicator moves memory of its device (", device.ToString(),
                     ") only", hint));
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

bool Overlaps(const void* a, size_t an, const void* b, size_t bn) {
  if (an == 0 || bn == 0) return false;
  auto pa = reinterpret_cast<uintptr_t>(a);
  auto pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + bn && pb < pa + an;
}

const char* Slot(const Tensor& t, int64_t index, size_t bytes) {
  return static_cast<const char*>(t.raw_data()) + index * bytes;
}

// Both tensors on `device`, with one dtype.
absl::Status CheckPair(const char* what, const Tensor& in, const Tensor& out, Device device) {
  LOOM_RETURN_IF_ERROR(CheckTensor(what, "input", in, device));
  LOOM_RETURN_IF_ERROR(CheckTensor(what, "output", out, device));
  if (in.dtype() != out.dtype()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": input dtype ",
                                                   core::DTypeName(in.dtype()), " != output dtype ",
                                                   core::DTypeName(out.dtype())));
  }
  return absl::OkStatus();
}

// `t` (the op's argument `arg`) has `expected` elements; `why` says where
// that number comes from.
absl::Status CheckCount(const char* what, const char* arg, const Tensor& t, int64_t expected,
                        const char* why) {
  if (t.numel() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", arg, " has ", t.numel(),
                                                   " elements, expected ", expected, " (", why,
                                                   ")"));
  }
  return absl::OkStatus();
}

// Input and output memory overlap only if it is the op's in-place layout
// (`in_place` says whether it is).
absl::Status CheckOverlap(const char* what, const Tensor& in, const Tensor& out, bool in_place) {
  if (!in_place && Overlaps(in.raw_data(), in.nbytes(), out.raw_data(), out.nbytes())) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": input and output overlap but are not the in-place layout (see comm.h: same "
              "memory for all_reduce/broadcast/reduce/all_to_all, input at output slot `rank` for "
              "all_gather, output at input slot `rank` for reduce_scatter, none for "
              "all_to_all_v)"));
  }
  return absl::OkStatus();
}

// `counts` (the op's argument `arg`) has one entry >= 0 per rank, and they
// add up to the elements of `t` (the op's argument `tensor_arg`).
absl::Status CheckCounts(const char* what, const char* arg, const std::vector<int64_t>& counts,
                         const char* tensor_arg, const Tensor& t, int size) {
  if (counts.size() != static_cast<size_t>(size)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", arg, " has ", counts.size(),
                                                   " entries, expected ", size,
                                                   " (one per rank of the group)"));
  }
  int64_t sum = 0;
  for (int j = 0; j < size; ++j) {
    if (counts[j] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", arg, "[", j, "] is ", counts[j], ", expected >= 0"));
    }
    // Saturates instead of overflowing: the sum then differs from numel.
    sum = counts[j] > t.numel() - sum ? t.numel() + 1 : sum + counts[j];
  }
  if (sum != t.numel()) {
    const std::string expected =
        sum > t.numel() ? absl::StrCat("more than ", t.numel()) : absl::StrCat(sum);
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", tensor_arg, " has ", t.numel(),
                                                   " elements, expected ", expected,
                                                   " (the sum of ", arg, ")"));
  }
  return absl::OkStatus();
}

// The ops whose output has the input's size; in place is the same memory.
absl::Status CheckSameSize(const char* what, const Tensor& in, const Tensor& out) {
  LOOM_RETURN_IF_ERROR(CheckCount(what, "output", out, in.numel(), "same as input"));
  return CheckOverlap(what, in, out, in.raw_data() == out.raw_data());
}

}  // namespace

absl::Status CheckAllReduce(const Tensor& in, const Tensor& out, Device device) {
  LOOM_RETURN_IF_ERROR(CheckPair("all_reduce", in, out, device));
  return CheckSameSize("all_reduce", in, out);
}

absl::Status CheckBroadcast(const Tensor& in, const Tensor& out, int root, int size,
                            Device device) {
  LOOM_RETURN_IF_ERROR(CheckPair("broadcast", in, out, device));
  LOOM_RETURN_IF_ERROR(CheckRoot("broadcast", root, size));
  return CheckSameSize("broadcast", in, out);
}

absl::Status CheckReduce(const Tensor& in, const Tensor& out, int root, int size, Device device) {
  LOOM_RETURN_IF_ERROR(CheckPair("reduce", in, out, device));
  LOOM_RETURN_IF_ERROR(CheckRoot("reduce", root, size));
  return CheckSameSize("reduce", in, out);
}

absl::Status CheckAllGather(const Tensor& in, const Tensor& out, int rank, int size,
                            Device device) {
  LOOM_RETURN_IF_ERROR(CheckPair("all_gather", in, out, device));
  LOOM_RETURN_IF_ERROR(
      CheckCount("all_gather", "output", out, in.numel() * size, "group size x input"));
  return CheckOverlap("all_gather", in, out, in.raw_data() == Slot(out, rank, in.nbytes()));
}

absl::Status CheckReduceScatter(const Tensor& in, const Tensor& out, int rank, int size,
                                Device device) {
  LOOM_RETURN_IF_ERROR(CheckPair("reduce_scatter", in, out, device));
  LOOM_RETURN_IF_ERROR(
      CheckCount("reduce_scatter", "input", in, out.numel() * size, "group size x output"));
  return CheckOverlap("reduce_scatter", in, out, out.raw_data() == Slot(in, rank, out.nbytes()));
}

absl::Status CheckAllToAll(const Tensor& in, const Tensor& out, int size, Device device) {
  LOOM_RETURN_IF_ERROR(CheckPair("all_to_all", in, out, device));
  LOOM_RETURN_IF_ERROR(CheckCount("all_to_all", "output", out, in.numel(), "same as input"));
  if (in.numel() % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("all_to_all: input has ", in.numel(),
                                                   " elements, not a multiple of the group size ",
                                                   size));
  }
  return CheckOverlap("all_to_all", in, out, in.raw_data() == out.raw_data());
}

absl::Status CheckAllToAllV(const Tensor& in, const std::vector<int64_t>& send_counts,
                            const Tensor& out, const std::vector<int64_t>& recv_counts,
                            int rank, int size, Device device) {
  LOOM_RETURN_IF_ERROR(CheckPair("all_to_all_v", in, out, device));
  LOOM_RETURN_IF_ERROR(CheckCounts("all_to_all_v", "send_counts", send_counts, "input", in, size));
  LOOM_RETURN_IF_ERROR(
      CheckCounts("all_to_all_v", "recv_counts", recv_counts, "output", out, size));
  // The block a rank sends itself is the one it receives from itself.
  if (send_counts[rank] != recv_counts[rank]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "all_to_all_v: send_counts[", rank, "] is ", send_counts[rank], " but recv_counts[", rank,
        "] is ", recv_counts[rank], " (this rank's block to itself; they must be equal)"));
  }
  return CheckOverlap("all_to_all_v", in, out, /*in_place=*/false);
}

absl::Status CheckP2P(const char* what, const Tensor& t, int peer, int tag, int rank, int size,
                      Device device) {
  LOOM_RETURN_IF_ERROR(CheckTensor(what, "tensor", t, device));
  LOOM_RETURN_IF_ERROR(CheckPeer(what, peer, rank, size));
  return CheckTag(what, tag);
}

absl::Status CheckBatch(const std::vector<P2POp>& ops, int rank, int size, Device device) {
  for (const P2POp& op : ops) {
    LOOM_RETURN_IF_ERROR(CheckP2P(op.kind == P2POp::Kind::kSend ? "batch_send_recv(send)"
                                                                : "batch_send_recv(recv)",
                                  op.tensor, op.peer, op.tag, rank, size, device));
  }
  return absl::OkStatus();
}

}  // namespace loom::comm::internal
