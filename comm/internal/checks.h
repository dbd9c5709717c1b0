#ifndef LOOM_COMM_INTERNAL_CHECKS_H_
#define LOOM_COMM_INTERNAL_CHECKS_H_

// Argument validation shared by every backend, so they all reject the same
// bad input with the same message before anything is sent. One set of checks
// per op, parameterised by the device the communicator's tensors must live
// on (`device`: cpu for local, mpi and ucx; the communicator's cuda:N for
// nccl). No device code: these run, and are tested, on any machine.
// Every failure is an InvalidArgument that starts with the op's name.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "comm/comm.h"
#include "core/device.h"
#include "core/tensor.h"

namespace loom::comm::internal {

// Per op: tensors defined and on `device`, dtypes and element counts as
// comm.h says, root/peer/tag in range, and input/output memory that overlaps
// only in comm.h's in-place layout.
absl::Status CheckAllReduce(const core::Tensor& in, const core::Tensor& out, core::Device device);
absl::Status CheckBroadcast(const core::Tensor& in, const core::Tensor& out, int root, int size,
                            core::Device device);
absl::Status CheckReduce(const core::Tensor& in, const core::Tensor& out, int root, int size,
                         core::Device device);
absl::Status CheckAllGather(const core::Tensor& in, const core::Tensor& out, int rank, int size,
                            core::Device device);
absl::Status CheckReduceScatter(const core::Tensor& in, const core::Tensor& out, int rank,
                                int size, core::Device device);
absl::Status CheckAllToAll(const core::Tensor& in, const core::Tensor& out, int size,
                           core::Device device);
absl::Status CheckAllToAllV(const core::Tensor& in, const std::vector<int64_t>& send_counts,
                            const core::Tensor& out, const std::vector<int64_t>& recv_counts,
                            int rank, int size, core::Device device);
// `what`: "send" or "recv".
absl::Status CheckP2P(const char* what, const core::Tensor& t, int peer, int tag, int rank,
                      int size, core::Device device);
absl::Status CheckBatch(const std::vector<P2POp>& ops, int rank, int size, core::Device device);

}  // namespace loom::comm::internal

#endif  // LOOM_COMM_INTERNAL_CHECKS_H_
