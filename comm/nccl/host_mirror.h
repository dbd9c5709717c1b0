#ifndef LOOM_COMM_NCCL_HOST_MIRROR_H_
#define LOOM_COMM_NCCL_HOST_MIRROR_H_

// Runs host-tensor code (the conformance suite) against a device
// communicator, for tests: each host storage passed to an op gets a device
// copy (same byte offsets, so views, in-place layouts and overlaps stay what
// they are on the host); an op uploads its tensors' bytes before it is
// issued and, once its handle reports success, downloads all of them again
// (inputs too, so "input unchanged" and "non-root output untouched" are
// checked on the device's bytes). Downloads run on the caller's compute
// stream after Work::Wait ordered it after the op, so they also test that
// ordering. Undefined and non-CPU tensors pass through unchanged.

#include <memory>

#include "comm/comm.h"

namespace loom::comm::nccl {

// `device_comm` may be borrowed (a shared_ptr with a no-op deleter).
std::unique_ptr<Communicator> MirrorHostTensors(std::shared_ptr<Communicator> device_comm);

}  // namespace loom::comm::nccl

#endif  // LOOM_COMM_NCCL_HOST_MIRROR_H_
