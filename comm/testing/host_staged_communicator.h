#ifndef LOOM_COMM_TESTING_HOST_STAGED_COMMUNICATOR_H_
#define LOOM_COMM_TESTING_HOST_STAGED_COMMUNICATOR_H_

// A device communicator made of a host one, for multi-rank --device=cuda
// tests without a GPU (the fake device of //core/ops:fake_device, where a
// host read of device memory crashes). Target //comm/testing:host_staged,
// testonly.
//
// It reports `device` and accepts only tensors there (the checks every
// backend runs: a host tensor handed to it is the InvalidArgument NCCL's
// would be, and aborts it alike). Each op copies its device inputs to the
// host when it is issued (the device's kernels ran when they were called,
// so that is what NCCL's stream would read), issues the wrapped host op
// asynchronously, and its Work copies the host outputs into the device
// outputs once the host op completes (Wait, WaitOnStream, or a Poll that
// finds it done). Receives issued before sends, sends left in flight, waits
// long after: everything that runs on the wrapped backend runs here, in the
// same order.
//
// What would be a race on a GPU fails here instead of passing by luck:
//  * until the op completes its device outputs hold NaN bytes (0xff), so a
//    caller that reads an output before waiting reads NaN;
//  * when the op completes, its inputs (those not also its outputs) must
//    still hold what they held at issue, else the Work fails
//    (FailedPrecondition): NCCL's stream may read them any time until then.
// Split wraps the child.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/comm.h"
#include "core/device.h"
#include "core/tensor.h"

namespace loom::comm::testing {

class HostStagedCommunicator final : public Communicator {
 public:
  // `host` moves host memory and stays the caller's (it must outlive this).
  HostStagedCommunicator(Communicator* host, core::Device device);
  // The same, owning `host` (what Split returns).
  HostStagedCommunicator(std::unique_ptr<Communicator> host, core::Device device);

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  core::Device device() const override { return device_; }
  const std::string& group_name() const override { return host_->group_name(); }
  const char* backend_name() const override { return "host-staged"; }

  WorkPtr AllReduce(const core::Tensor& input, const core::Tensor& output, ReduceOp op) override;
  WorkPtr Broadcast(const core::Tensor& input, const core::Tensor& output, int root) override;
  WorkPtr Reduce(const core::Tensor& input, const core::Tensor& output, ReduceOp op,
                 int root) override;
  WorkPtr AllGather(const core::Tensor& input, const core::Tensor& output) override;
  WorkPtr ReduceScatter(const core::Tensor& input, const core::Tensor& output,
                        ReduceOp op) override;
  WorkPtr AllToAll(const core::Tensor& input, const core::Tensor& output) override;
  WorkPtr AllToAllV(const core::Tensor& input, const std::vector<int64_t>& send_counts,
                    const core::Tensor& output, const std::vector<int64_t>& recv_counts) override;
  WorkPtr Send(const core::Tensor& tensor, int peer, int tag) override;
  WorkPtr Recv(const core::Tensor& tensor, int peer, int tag) override;
  WorkPtr BatchSendRecv(const std::vector<P2POp>& ops) override;
  WorkPtr Barrier() override;
  WorkPtr BarrierWithin(absl::Duration op_timeout) override;
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key,
                                                      const std::string& name) override;

  using Communicator::AllReduce;
  using Communicator::Broadcast;

 private:
  // The op's argument check (`checked`) and, once one failed, every later
  // op's FailedPrecondition naming it (comm.h: a rejected op aborts).
  absl::Status Admit(absl::Status checked);

  std::unique_ptr<Communicator> owned_;
  Communicator* host_;
  core::Device device_;
  absl::Status aborted_;
};

}  // namespace loom::comm::testing

#endif  // LOOM_COMM_TESTING_HOST_STAGED_COMMUNICATOR_H_
