#ifndef LOOM_COMM_INTERNAL_TRANSPORT_H_
#define LOOM_COMM_INTERNAL_TRANSPORT_H_

// The point-to-point layer under our own collective algorithms (engine.h).
// A transport connects the `size()` endpoints of one world (threads for the
// local backend, processes for UCX) and moves tagged byte messages. Sub-groups
// from Split share their parent's transport and get their own tag space.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/internal/clock.h"

namespace loom::comm::internal {


// Tag layout (64 bits): ctx(12) | src(12) | p2p(1) | payload(19) | sig(20).
// Receivers match on everything above `sig`; `sig` is a hash of the call's
// (op, dtype, count, op/root) that the receiver checks, so two ranks that
// issued different calls get an error instead of corrupted data.
constexpr int kSigBits = 20;
constexpr uint64_t kSigMask = (uint64_t{1} << kSigBits) - 1;
constexpr int kMaxContexts = 1 << 12;
constexpr int kMaxWorldSize = 1 << 12;

inline uint64_t MakeTag(uint32_t ctx, uint32_t src, bool p2p, uint32_t payload, uint32_t sig) {
  return (uint64_t{ctx & 0xfffu} << 52) | (uint64_t{src & 0xfffu} << 40) |
         (uint64_t{p2p ? 1u : 0u} << 39) | (uint64_t{payload & 0x7ffffu} << 20) |
         (sig & kSigMask);
}
inline uint64_t MatchKey(uint64_t tag) { return tag >> kSigBits; }
inline uint32_t TagSig(uint64_t tag) { return static_cast<uint32_t>(tag & kSigMask); }

struct TransportReq {
  bool is_send = false;
  int peer = 0;          // transport rank
  uint64_t tag = 0;      // full tag; for a recv, the expected signature is in it
  void* buf = nullptr;   // send: read until done; recv: written
  size_t bytes = 0;      // recv: the exact length expected
  // Completion, written by the transport, maybe on another thread: any
  // progress call on this endpoint (a sibling communicator's too) may
  // complete any request. The hand-off: the transport writes `status` (and
  // clears `impl`), then stores `done` (release), and touches neither the
  // request nor its buffer after that; readers load `done` (acquire) before
  // they read `status` or free the request.
  std::atomic<bool> done{false};
  absl::Status status;   // recv: signature/length mismatch, peer failure, ...
  void* impl = nullptr;  // transport-private
  // Owns `buf` (the op's tensors, staging) for a request given up before it
  // is done: Cancel hands it to the transport, which holds it while it may
  // still touch `buf`. Set by whoever may cancel the request.
  std::shared_ptr<const void> keep_alive;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Starts a request; it completes later (see Test / WaitAll).
  virtual void Post(TransportReq* req) = 0;
  // Starts `n` requests in this order (one lock for all where the transport
  // takes one).
  virtual void PostAll(TransportReq* const* reqs, size_t n) {
    for (size_t i = 0; i < n; ++i) Post(reqs[i]);
  }
  // Non-blocking progress; marks finished requests done.
  virtual void Test(const std::vector<TransportReq*>& reqs) = 0;
  // Blocks until every request is done (OK; look at each status), the
  // deadline passes (DeadlineExceeded) or `abort` becomes true (Cancelled),
  // whatever other traffic the endpoint has. Cancels nothing: the caller
  // cancels every request that is not done before it frees it.
  virtual absl::Status WaitAll(const std::vector<TransportReq*>& reqs, absl::Time deadline,
                               const std::atomic<bool>& abort) = 0;
  // Gives up a request that is not done (no-op if it is). From the return
  // on, the transport never touches `req` (the caller may free it); it takes
  // `req->keep_alive` and holds it while it may still touch `buf`: until the
  // underlying operation completes or its cancellation is confirmed (a
  // receive not yet matched: at once; a send, or a receive whose message is
  // arriving: when it ends), at the latest until the transport is destroyed.
  virtual void Cancel(TransportReq* req) = 0;
};

}  // namespace loom::comm::internal

#endif  // LOOM_COMM_INTERNAL_TRANSPORT_H_
