#include "comm/nccl/checks.h"

#include "absl/strings/str_cat.h"
#include "comm/internal/checks.h"

namespace loom::comm::nccl {
namespace {

#define NCCL_CHECKS_RETURN_IF_ERROR(expr) \
  do {                                    \
    absl::Status _s = (expr);             \
    if (!_s.ok()) return _s;              \
  } while (0)

absl::Status Pair(const char* what, const core::Tensor& in, const core::Tensor& out,
                  core::Device d) {
  NCCL_CHECKS_RETURN_IF_ERROR(CheckOnDevice(what, "input", in, d));
  NCCL_CHECKS_RETURN_IF_ERROR(CheckOnDevice(what, "output", out, d));
  return internal::CheckSameDType(what, in, out);
}

absl::Status NumelIs(const char* what, const char* arg, const core::Tensor& t, int64_t expected,
                     const char* why) {
  if (t.numel() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", arg, " has ", t.numel(),
                                                   " elements, expected ", expected, " (", why,
                                                   ")"));
  }
  return absl::OkStatus();
}

const char* Slot(const core::Tensor& t, int64_t index, size_t bytes) {
  return static_cast<const char*>(t.raw_data()) + index * bytes;
}

}  // namespace

absl::Status CheckOnDevice(const char* what, const char* arg, const core::Tensor& t,
                           core::Device device) {
  if (!t.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", arg, " is an undefined tensor"));
  }
  if (t.device() != device) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", arg, " is on ", t.device().ToString(), "; the nccl backend moves memory of ",
        "this communicator's device (", device.ToString(), ") only",
        t.device().is_cpu() ? " (copy host tensors to the GPU first)" : ""));
  }
  return absl::OkStatus();
}

absl::Status CheckAllReduce(const core::Tensor& in, const core::Tensor& out, core::Device d) {
  NCCL_CHECKS_RETURN_IF_ERROR(Pair("all_reduce", in, out, d));
  NCCL_CHECKS_RETURN_IF_ERROR(NumelIs("all_reduce", "output", out, in.numel(), "same as input"));
  return internal::CheckAlias("all_reduce", in, out, in.raw_data() == out.raw_data());
}

absl::Status CheckBroadcast(const core::Tensor& in, const core::Tensor& out, int root, int size,
                            core::Device d) {
  NCCL_CHECKS_RETURN_IF_ERROR(Pair("broadcast", in, out, d));
  NCCL_CHECKS_RETURN_IF_ERROR(internal::CheckRoot("broadcast", root, size));
  NCCL_CHECKS_RETURN_IF_ERROR(NumelIs("broadcast", "output", out, in.numel(), "same as input"));
  return internal::CheckAlias("broadcast", in, out, in.raw_data() == out.raw_data());
}

absl::Status CheckReduce(const core::Tensor& in, const core::Tensor& out, int root, int size,
                         core::Device d) {
  NCCL_CHECKS_RETURN_IF_ERROR(Pair("reduce", in, out, d));
  NCCL_CHECKS_RETURN_IF_ERROR(internal::CheckRoot("reduce", root, size));
  NCCL_CHECKS_RETURN_IF_ERROR(NumelIs("reduce", "output", out, in.numel(), "same as input"));
  return internal::CheckAlias("reduce", in, out, in.raw_data() == out.raw_data());
}

absl::Status CheckAllGather(const core::Tensor& in, const core::Tensor& out, int rank, int size,
                            core::Device d) {
  NCCL_CHECKS_RETURN_IF_ERROR(Pair("all_gather", in, out, d));
  NCCL_CHECKS_RETURN_IF_ERROR(
      NumelIs("all_gather", "output", out, in.numel() * size, "group size x input"));
  return internal::CheckAlias("all_gather", in, out, in.raw_data() == Slot(out, rank, in.nbytes()));
}

absl::Status CheckReduceScatter(const core::Tensor& in, const core::Tensor& out, int rank,
                                int size, core::Device d) {
  NCCL_CHECKS_RETURN_IF_ERROR(Pair("reduce_scatter", in, out, d));
  NCCL_CHECKS_RETURN_IF_ERROR(
      NumelIs("reduce_scatter", "input", in, out.numel() * size, "group size x output"));
  return internal::CheckAlias("reduce_scatter", in, out,
                              out.raw_data() == Slot(in, rank, out.nbytes()));
}

absl::Status CheckAllToAll(const core::Tensor& in, const core::Tensor& out, int size,
                           core::Device d) {
  NCCL_CHECKS_RETURN_IF_ERROR(Pair("all_to_all", in, out, d));
  NCCL_CHECKS_RETURN_IF_ERROR(NumelIs("all_to_all", "output", out, in.numel(), "same as input"));
  if (in.numel() % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("all_to_all: input has ", in.numel(),
                                                   " elements, not a multiple of the group size ",
                                                   size));
  }
  return internal::CheckAlias("all_to_all", in, out, in.raw_data() == out.raw_data());
}

absl::Status CheckP2P(const char* what, const core::Tensor& t, int peer, int tag, int rank,
                      int size, core::Device d) {
  NCCL_CHECKS_RETURN_IF_ERROR(CheckOnDevice(what, "tensor", t, d));
  NCCL_CHECKS_RETURN_IF_ERROR(internal::CheckPeer(what, peer, rank, size));
  return internal::CheckTag(what, tag);
}

absl::Status CheckBatch(const std::vector<P2POp>& ops, int rank, int size, core::Device d) {
  for (const P2POp& op : ops) {
    NCCL_CHECKS_RETURN_IF_ERROR(CheckP2P(op.kind == P2POp::Kind::kSend ? "batch_send_recv(send)"
                                                                       : "batch_send_recv(recv)",
                                         op.tensor, op.peer, op.tag, rank, size, d));
  }
  return absl::OkStatus();
}

}  // namespace loom::comm::nccl
