#ifndef LOOM_COMM_INTERNAL_CHECKS_H_
#define LOOM_COMM_INTERNAL_CHECKS_H_

// Argument validation shared by every backend, so they all reject the same
// bad input with the same message before anything is sent.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "comm/comm.h"
#include "core/tensor.h"

namespace loom::comm::internal {

// `what` names the op ("all_reduce"), used in messages.
absl::Status CheckTensor(const char* what, const char* arg, const core::Tensor& t);
absl::Status CheckSameDType(const char* what, const core::Tensor& in, const core::Tensor& out);
absl::Status CheckRoot(const char* what, int root, int size);
absl::Status CheckPeer(const char* what, int peer, int rank, int size);
absl::Status CheckTag(const char* what, int tag);

absl::Status CheckAllReduce(const core::Tensor& in, const core::Tensor& out);
absl::Status CheckBroadcast(const core::Tensor& in, const core::Tensor& out, int root, int size);
absl::Status CheckReduce(const core::Tensor& in, const core::Tensor& out, int root, int size);
absl::Status CheckAllGather(const core::Tensor& in, const core::Tensor& out, int rank, int size);
absl::Status CheckReduceScatter(const core::Tensor& in, const core::Tensor& out, int rank,
                                int size);
absl::Status CheckAllToAll(const core::Tensor& in, const core::Tensor& out, int size);
absl::Status CheckP2P(const char* what, const core::Tensor& t, int peer, int tag, int rank,
                      int size);
absl::Status CheckBatch(const std::vector<P2POp>& ops, int rank, int size);

// Rejects input/output memory that overlaps other than in the documented
// in-place layout (`in_place` says whether it is that layout).
absl::Status CheckAlias(const char* what, const core::Tensor& in, const core::Tensor& out,
                        bool in_place);

// True if [a, a+an) and [b, b+bn) overlap.
bool Overlaps(const void* a, size_t an, const void* b, size_t bn);

}  // namespace loom::comm::internal

#endif  // LOOM_COMM_INTERNAL_CHECKS_H_
