#ifndef LOOM_COMM_NCCL_CHECKS_H_
#define LOOM_COMM_NCCL_CHECKS_H_

// Argument checks of the nccl backend: the same checks and messages as
// comm/internal/checks.h (dtype, counts, root, peer, tag, aliasing), except
// that tensors must live on the communicator's CUDA device instead of the
// host. No CUDA calls: these run (and are tested) on machines without a GPU.

#include <vector>

#include "absl/status/status.h"
#include "comm/comm.h"
#include "core/device.h"
#include "core/tensor.h"

namespace loom::comm::nccl {

// `t` is defined and on `device`; otherwise InvalidArgument naming the op
// (`what`), the argument and the tensor's device.
absl::Status CheckOnDevice(const char* what, const char* arg, const core::Tensor& t,
                           core::Device device);

absl::Status CheckAllReduce(const core::Tensor& in, const core::Tensor& out, core::Device d);
absl::Status CheckBroadcast(const core::Tensor& in, const core::Tensor& out, int root, int size,
                            core::Device d);
absl::Status CheckReduce(const core::Tensor& in, const core::Tensor& out, int root, int size,
                         core::Device d);
absl::Status CheckAllGather(const core::Tensor& in, const core::Tensor& out, int rank, int size,
                            core::Device d);
absl::Status CheckReduceScatter(const core::Tensor& in, const core::Tensor& out, int rank,
                                int size, core::Device d);
absl::Status CheckAllToAll(const core::Tensor& in, const core::Tensor& out, int size,
                           core::Device d);
absl::Status CheckP2P(const char* what, const core::Tensor& t, int peer, int tag, int rank,
                      int size, core::Device d);
absl::Status CheckBatch(const std::vector<P2POp>& ops, int rank, int size, core::Device d);

}  // namespace loom::comm::nccl

#endif  // LOOM_COMM_NCCL_CHECKS_H_
