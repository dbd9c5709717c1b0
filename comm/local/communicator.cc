#include "comm/local/communicator.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "comm/internal/engine.h"
#include "comm/internal/transport.h"

namespace loom::comm::local {
namespace {

using internal::TransportReq;

struct Message {
  uint64_t tag;
  std::vector<char> data;
};

struct Mailbox {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t version = 0;
  std::unordered_map<uint64_t, std::deque<Message>> queues;  // by MatchKey
};

struct Hub {
  explicit Hub(int size) {
    for (int i = 0; i < size; ++i) boxes.push_back(std::make_unique<Mailbox>());
  }
  std::vector<std::unique_ptr<Mailbox>> boxes;
};

class LocalTransport : public internal::Transport {
 public:
  LocalTransport(std::shared_ptr<Hub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(hub_->boxes.size()); }

  void Post(TransportReq* r) override {
    if (!r->is_send) return;
    Mailbox& box = *hub_->boxes[r->peer];
    Message m{r->tag, std::vector<char>(static_cast<char*>(r->buf),
                                        static_cast<char*>(r->buf) + r->bytes)};
    {
      std::lock_guard<std::mutex> l(box.mu);
      box.queues[internal::MatchKey(r->tag)].push_back(std::move(m));
      ++box.version;
    }
    box.cv.notify_all();
    r->done = true;  // eager: the bytes are copied
  }

  void Test(const std::vector<TransportReq*>& reqs) override {
    Mailbox& box = *hub_->boxes[rank_];
    std::lock_guard<std::mutex> l(box.mu);
    for (TransportReq* r : reqs) {
      if (r->done || r->is_send) continue;
      auto it = box.queues.find(internal::MatchKey(r->tag));
      if (it == box.queues.end() || it->second.empty()) continue;
      Message m = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) box.queues.erase(it);
      if (internal::TagSig(m.tag) != internal::TagSig(r->tag)) {
        r->status = absl::InvalidArgumentError(absl::StrFormat(
            "the peer issued a different call (signature %05x, this rank expected %05x): every "
            "rank must call the same collectives in the same order with the same count, dtype, "
            "reduce op and root",
            internal::TagSig(m.tag), internal::TagSig(r->tag)));
      } else if (m.data.size() != r->bytes) {
        r->status = absl::InvalidArgumentError(
            absl::StrCat("message of ", m.data.size(), " bytes, this rank expected ", r->bytes,
                         " (element counts differ across ranks?)"));
      } else if (r->bytes) {
        std::memcpy(r->buf, m.data.data(), r->bytes);
      }
      r->done.store(true, std::memory_order_release);  // last (transport.h)
    }
  }

  absl::Status WaitAll(const std::vector<TransportReq*>& reqs, absl::Time deadline,
                       const std::atomic<bool>& abort) override {
    Mailbox& box = *hub_->boxes[rank_];
    for (;;) {
      uint64_t seen;
      {
        std::lock_guard<std::mutex> l(box.mu);
        seen = box.version;
      }
      Test(reqs);
      bool all = true;
      for (TransportReq* r : reqs) all = all && r->done;
      if (all) return absl::OkStatus();
      if (abort) return absl::CancelledError("communicator shut down");
      absl::Time now = internal::Now();
      if (now >= deadline) return absl::DeadlineExceededError("deadline");
      std::unique_lock<std::mutex> l(box.mu);
      if (box.version == seen) {
        box.cv.wait_for(l, absl::ToChronoNanoseconds(
                               std::min(deadline - now, absl::Milliseconds(20))));
      }
    }
  }

  void Cancel(TransportReq*) override {}

 private:
  std::shared_ptr<Hub> hub_;
  int rank_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> Create(int rank, int size, MemoryStore& store,
                                                     const LocalOptions& options) {
  if (size < 1 || size > internal::kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("local backend: world size ", size,
                                                   " is out of range [1, ",
                                                   internal::kMaxWorldSize, "]"));
  }
  if (rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("local backend: rank ", rank, " is out of range [0, ", size, ")"));
  }
  auto hub = std::static_pointer_cast<Hub>(store.GetOrCreateObject(
      "loom/comm/local/hub", [size] { return std::make_shared<Hub>(size); }));
  if (static_cast<int>(hub->boxes.size()) != size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "local backend: rank ", rank, " says the world has ", size,
        " ranks but an earlier rank created it with ", hub->boxes.size()));
  }
  std::vector<int> members(size);
  for (int i = 0; i < size; ++i) members[i] = i;
  internal::EngineOptions eo{options.comm, options.small_bytes};
  return std::unique_ptr<Communicator>(new internal::Engine(
      std::make_shared<LocalTransport>(hub, rank), std::move(members), 1, eo, "local"));
}

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateWorld(
    int size, const LocalOptions& options) {
  MemoryStore store;
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r) {
    auto c = Create(r, size, store, options);
    if (!c.ok()) return c.status();
    out.push_back(std::move(*c));
  }
  return out;
}

}  // namespace loom::comm::local
