#include "comm/comm.h"

#include <cstring>
#include <utility>

namespace loom::comm {
namespace {

class DoneWork : public Work {
 public:
  DoneWork(absl::Status status, std::string description)
      : status_(std::move(status)), description_(std::move(description)) {}
  bool Poll() override { return true; }
  absl::Status Wait(absl::Duration) override { return status_; }
  absl::Status Wait() override { return status_; }
  std::string Describe() const override { return description_; }

 private:
  absl::Status status_;
  std::string description_;
};

}  // namespace

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kProd: return "prod";
  }
  return "?";
}

WorkPtr CompletedWork(absl::Status status, std::string description) {
  return std::make_shared<DoneWork>(std::move(status), std::move(description));
}

namespace {
// Waits for every handle with `wait` (even after an error); the first error.
template <typename F>
absl::Status WaitEach(const std::vector<WorkPtr>& works, F wait) {
  absl::Status first;
  for (const WorkPtr& w : works) {
    absl::Status s = wait(*w);
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}
}  // namespace

absl::Status WaitAll(const std::vector<WorkPtr>& works) {
  return WaitEach(works, [](Work& w) { return w.Wait(); });
}

absl::Status WaitAllOnStream(const std::vector<WorkPtr>& works) {
  return WaitEach(works, [](Work& w) { return w.WaitOnStream(); });
}

absl::Status AllGatherHost(Communicator* c, const core::Tensor& in, const core::Tensor& out) {
  if (c->device().is_cpu()) return c->AllGather(in, out)->Wait();
  absl::StatusOr<core::Tensor> din = in.To(c->device());
  if (!din.ok()) return din.status();
  absl::StatusOr<core::Tensor> dout = core::Tensor::Empty(out.shape(), out.dtype(), c->device());
  if (!dout.ok()) return dout.status();
  absl::Status s = c->AllGather(*din, *dout)->Wait();
  if (!s.ok()) return s;
  absl::StatusOr<core::Tensor> back = dout->To(core::Device::CPU());
  if (!back.ok()) return back.status();
  std::memcpy(out.raw_data(), back->raw_data(), out.nbytes());
  return absl::OkStatus();
}

absl::Status AllReduceScalar(Communicator* c, ReduceOp op, double* value) {
  if (c == nullptr || c->size() == 1) return absl::OkStatus();
  absl::StatusOr<core::Tensor> host = core::Tensor::Empty(core::Shape{1}, core::DType::kF64);
  if (!host.ok()) return host.status();
  host->data<double>()[0] = *value;
  // A device backend (NCCL) reduces device memory: move the value there and back.
  absl::StatusOr<core::Tensor> t = c->device().is_cpu() ? host : host->To(c->device());
  if (!t.ok()) return t.status();
  absl::Status s = c->AllReduce(*t, op)->Wait();
  if (!s.ok()) return s;
  if (!c->device().is_cpu()) {
    host = t->To(core::Device::CPU());
    if (!host.ok()) return host.status();
  }
  *value = host->data<double>()[0];
  return absl::OkStatus();
}

}  // namespace loom::comm
