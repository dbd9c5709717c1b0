#include "comm/nccl/host_mirror.h"

#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/nccl/device_memory.h"
#include "core/dtype.h"

namespace loom::comm::nccl {
namespace {

using core::Tensor;

struct HostDevice {
  Tensor host;
  Tensor dev;
};

// Device copies of host storages, shared by a communicator and its splits.
class Mirrors {
 public:
  explicit Mirrors(core::Device device) : device_(device) {}

  // The device view matching host tensor `t`; uploads t's bytes.
  absl::StatusOr<Tensor> Upload(const Tensor& t) {
    if (!t.defined() || !t.device().is_cpu()) return t;
    Tensor whole;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (auto it = map_.begin(); it != map_.end();) {  // forget freed host storages
        it = it->second.host.expired() ? map_.erase(it) : std::next(it);
      }
      auto it = map_.find(t.storage().get());
      if (it == map_.end()) {
        const size_t esize = core::DTypeSize(t.dtype());
        absl::StatusOr<Tensor> dev = EmptyOnDevice(
            {static_cast<int64_t>(t.storage()->bytes() / esize)}, t.dtype(), device_);
        if (!dev.ok()) return dev.status();
        it = map_.emplace(t.storage().get(), Entry{t.storage(), *dev}).first;
      }
      whole = it->second.dev;
    }
    if (whole.dtype() != t.dtype()) {
      return absl::InternalError(absl::StrCat("host mirror: one storage viewed as ",
                                              core::DTypeName(whole.dtype()), " and ",
                                              core::DTypeName(t.dtype())));
    }
    absl::StatusOr<Tensor> view = whole.View(
        static_cast<int64_t>(t.storage_offset_bytes() / core::DTypeSize(t.dtype())), t.shape());
    if (!view.ok()) return view.status();
    absl::Status s = CopyBytes(view->raw_data(), t.raw_data(), t.nbytes(), /*to_device=*/true,
                               device_.index);
    if (!s.ok()) return s;
    return *view;
  }

 private:
  struct Entry {
    std::weak_ptr<core::Storage> host;
    Tensor dev;
  };
  core::Device device_;
  std::mutex mu_;
  std::map<const core::Storage*, Entry> map_;
};

class MirrorWork : public Work {
 public:
  MirrorWork(WorkPtr inner, std::vector<HostDevice> pairs)
      : inner_(std::move(inner)), pairs_(std::move(pairs)) {}
  bool Poll() override {
    if (!inner_->Poll()) return false;
    absl::Status s = inner_->Wait(absl::ZeroDuration());
    if (s.ok()) Download().IgnoreError();  // a failed copy shows in Wait
    return true;
  }
  absl::Status Wait(absl::Duration timeout) override {
    absl::Status s = inner_->Wait(timeout);
    if (!s.ok()) return s;
    return Download();
  }
  absl::Status Wait() override {
    absl::Status s = inner_->Wait();
    if (!s.ok()) return s;
    return Download();
  }
  std::string Describe() const override { return inner_->Describe(); }

 private:
  absl::Status Download() {
    if (downloaded_) return download_status_;
    downloaded_ = true;
    for (const HostDevice& p : pairs_) {
      download_status_ = CopyBytes(p.host.raw_data(), p.dev.raw_data(), p.host.nbytes(),
                                   /*to_device=*/false, p.dev.device().index);
      if (!download_status_.ok()) break;
    }
    pairs_.clear();
    return download_status_;
  }
  WorkPtr inner_;
  std::vector<HostDevice> pairs_;
  bool downloaded_ = false;
  absl::Status download_status_;
};

class MirrorCommunicator : public Communicator {
 public:
  MirrorCommunicator(std::shared_ptr<Communicator> inner, std::shared_ptr<Mirrors> mirrors)
      : inner_(std::move(inner)), mirrors_(std::move(mirrors)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  core::Device device() const override { return inner_->device(); }
  const std::string& group_name() const override { return inner_->group_name(); }
  const char* backend_name() const override { return inner_->backend_name(); }
  using Communicator::AllReduce;
  using Communicator::Broadcast;

  WorkPtr AllReduce(const Tensor& in, const Tensor& out, ReduceOp op) override {
    return Run({in, out}, [&](const std::vector<Tensor>& d) {
      return inner_->AllReduce(d[0], d[1], op);
    });
  }
  WorkPtr Broadcast(const Tensor& in, const Tensor& out, int root) override {
    return Run({in, out}, [&](const std::vector<Tensor>& d) {
      return inner_->Broadcast(d[0], d[1], root);
    });
  }
  WorkPtr Reduce(const Tensor& in, const Tensor& out, ReduceOp op, int root) override {
    return Run({in, out}, [&](const std::vector<Tensor>& d) {
      return inner_->Reduce(d[0], d[1], op, root);
    });
  }
  WorkPtr AllGather(const Tensor& in, const Tensor& out) override {
    return Run({in, out}, [&](const std::vector<Tensor>& d) { return inner_->AllGather(d[0], d[1]); });
  }
  WorkPtr ReduceScatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    return Run({in, out}, [&](const std::vector<Tensor>& d) {
      return inner_->ReduceScatter(d[0], d[1], op);
    });
  }
  WorkPtr AllToAll(const Tensor& in, const Tensor& out) override {
    return Run({in, out}, [&](const std::vector<Tensor>& d) { return inner_->AllToAll(d[0], d[1]); });
  }
  WorkPtr AllToAllV(const Tensor& in, const std::vector<int64_t>& send_counts, const Tensor& out,
                    const std::vector<int64_t>& recv_counts) override {
    return Run({in, out}, [&](const std::vector<Tensor>& d) {
      return inner_->AllToAllV(d[0], send_counts, d[1], recv_counts);
    });
  }
  WorkPtr Send(const Tensor& t, int peer, int tag) override {
    return Run({t}, [&](const std::vector<Tensor>& d) { return inner_->Send(d[0], peer, tag); });
  }
  WorkPtr Recv(const Tensor& t, int peer, int tag) override {
    return Run({t}, [&](const std::vector<Tensor>& d) { return inner_->Recv(d[0], peer, tag); });
  }
  WorkPtr BatchSendRecv(const std::vector<P2POp>& ops) override {
    std::vector<Tensor> ts;
    for (const P2POp& op : ops) ts.push_back(op.tensor);
    return Run(ts, [&](const std::vector<Tensor>& d) {
      std::vector<P2POp> dev_ops = ops;
      for (size_t i = 0; i < ops.size(); ++i) dev_ops[i].tensor = d[i];
      return inner_->BatchSendRecv(dev_ops);
    });
  }
  WorkPtr Barrier() override { return inner_->Barrier(); }
  WorkPtr BarrierWithin(absl::Duration op_timeout) override {
    return inner_->BarrierWithin(op_timeout);
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key,
                                                       const std::string& name) override {
    auto child = inner_->Split(color, key, name);
    if (!child.ok() || *child == nullptr) return child;
    return std::unique_ptr<Communicator>(new MirrorCommunicator(std::shared_ptr<Communicator>(std::move(*child)), mirrors_));
  }

 private:
  template <typename F>
  WorkPtr Run(const std::vector<Tensor>& host, F issue) {
    std::vector<Tensor> dev;
    std::vector<HostDevice> pairs;
    for (const Tensor& t : host) {
      absl::StatusOr<Tensor> d = mirrors_->Upload(t);
      if (!d.ok()) return CompletedWork(d.status(), "host mirror upload");
      dev.push_back(*d);
      if (t.defined() && t.device().is_cpu()) pairs.push_back({t, *d});
    }
    return std::make_shared<MirrorWork>(issue(dev), std::move(pairs));
  }

  std::shared_ptr<Communicator> inner_;
  std::shared_ptr<Mirrors> mirrors_;
};

}  // namespace

std::unique_ptr<Communicator> MirrorHostTensors(std::shared_ptr<Communicator> device_comm) {
  auto mirrors = std::make_shared<Mirrors>(device_comm->device());
  return std::unique_ptr<Communicator>(
      new MirrorCommunicator(std::move(device_comm), std::move(mirrors)));
}

}  // namespace loom::comm::nccl
