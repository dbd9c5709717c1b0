#ifndef LOOM_COMM_UCX_SHM_CHANNEL_H_
#define LOOM_COMM_UCX_SHM_CHANNEL_H_

// The ucx transport's same-host channel for small messages (issue #22):
// UCX's shared-memory eager send (uct_mm_ep_am_short) claims a slot of the
// receiver's FIFO with a `lock cmpxchg` on a head every sender shares, and
// cost a third of a 4-byte all-reduce. Here every ordered pair of ranks has
// its own single-producer/single-consumer ring, so a message costs the one
// cache line (per 64 bytes) that carries it.
//
// Memory: every rank creates one segment (shm_open) holding its incoming
// rings, one per sender; peers map it, and it is unlinked once every rank
// has (nothing stays in /dev/shm, even if a rank is killed later). A ring is
// a control line (the consumer's position, which the producer reads only
// when its cached copy says the ring is full) and 64-byte slots. A record
// is a 16-byte header (sequence, length, full tag) and its payload (up to
// 48 bytes: one cache line; then 60 per further slot, whose first word stays
// a sequence); the producer writes the payload, then publishes the header's
// sequence (release); the consumer polls the sequence at its position
// (acquire) and writes nothing but its position. A record that would cross
// the ring's end is preceded by a padding record.
//
// Matching is UCX's as the transport uses it: a receive takes the first
// message from its peer with the same internal::MatchKey, posted before or
// after it arrives (unexpected messages are copied out of the ring), then
// checks the length and signature with the UCX path's messages.
//
// Messages over the channel's limit (and flow-controlled ones) travel on UCX,
// but every message between two same-host ranks takes its place in the
// channel's order: such a send writes a stub (tag and length) here and its
// data to UCX; every receive, of any size, is ordered here. A receive that
// meets a stub takes its data from UCX (the `Other` path), so mismatched
// lengths across the limit report the errors UCX would, and two messages
// with one match key arrive in the order sent whatever their sizes.
//
// Not thread-safe: the transport calls everything but Arrived() under its
// mutex.

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/internal/transport.h"
#include "comm/store/store.h"

namespace loom::comm::ucx {

// The errors of a receive whose message does not fit; the UCX path
// (communicator.cc) reports the same.
absl::Status TruncatedError(size_t expected);
absl::Status SignatureError(uint32_t sent, uint32_t expected);
absl::Status LengthError(size_t sent, size_t expected);
// The error of receive `r` meeting a message of `length` bytes with tag
// `sent_tag` (OK when it fits), in UCX's order: truncation, signature, length.
absl::Status MatchError(const internal::TransportReq& r, uint64_t sent_tag, size_t length);

struct ShmChannelOptions {
  // Largest payload carried by the channel (larger: UCX, with a stub here).
  size_t max_message_bytes = 1024;
  // Bytes of each ring (rounded up to a power of two of slots, at least
  // 8 of the largest messages).
  size_t ring_bytes = 32 << 10;
};

// A mapped POSIX shared-memory segment; unmapped on destruction.
class ShmSegment {
 public:
  ShmSegment() = default;
  ShmSegment(ShmSegment&& o) noexcept { *this = std::move(o); }
  ShmSegment& operator=(ShmSegment&& o) noexcept;
  ~ShmSegment();

  // shm_open(O_CREAT | O_EXCL), sized (blocks reserved: a full /dev/shm is an
  // error here, not a SIGBUS later) and mapped. Errors name the call.
  static absl::StatusOr<ShmSegment> Create(const std::string& name, size_t bytes);
  // Maps an existing segment of exactly `bytes`.
  static absl::StatusOr<ShmSegment> Open(const std::string& name, size_t bytes);
  // Removes the name (the mapping stays). Idempotent.
  void Unlink();

  char* data() const { return static_cast<char*>(data_); }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  void* data_ = nullptr;
  size_t size_ = 0;
  bool linked_ = false;  // created here and not unlinked yet
};

class ShmChannel {
 public:
  // A receive's place in the channel's order (private to the channel; the
  // transport only passes it back).
  struct RecvEntry;
  struct SendEntry;
  struct Unexpected;
  struct Peer;
  struct Slot;  // 64 bytes of a ring

  // The other path (UCX), for receives whose data travels there.
  class Other {
   public:
    virtual ~Other() = default;
    // Posts receive `req` there now. `entry` non-null: the channel still
    // waits for the message's place in its order; when the receive
    // completes first, the transport calls ShmChannel::Detach(entry).
    virtual void PostRecv(internal::TransportReq* req, RecvEntry* entry) = 0;
    // A receive posted with an entry met its place in the order: a stub
    // (`error` OK: the data is coming there), or a message sent on the
    // channel (`error`: complete `req` with it, once the other path lets go).
    virtual void Resolved(internal::TransportReq* req, absl::Status error) = 0;
  };

  // The same-host channel of rank `rank` of `size` (all on this host):
  // creates this rank's segment ("<name_base>-<rank>-<n>", n unique in the
  // process), publishes its name under `key_prefix` in `store`, maps the
  // peers', and unlinks its own once every rank mapped it (a barrier). When
  // any rank cannot create or map a segment, every rank gets nullptr (use
  // UCX only) and the ranks that failed print a one-line warning why.
  // Store errors (a peer that never came) are errors.
  static absl::StatusOr<std::unique_ptr<ShmChannel>> Connect(
      int rank, int size, Store& store, const std::string& key_prefix, const std::string& name_base,
      absl::Duration timeout, const ShmChannelOptions& options, Other* other);
  ~ShmChannel();

  size_t max_message_bytes() const { return max_bytes_; }
  size_t ring_slots() const { return slots_; }
  // Slots a record of `payload` bytes takes.
  static size_t SlotsFor(size_t payload);

  // A send of at most max_message_bytes() to another rank: copied into the
  // ring and done at once when it has room, else pending (in order) until a
  // Progress finds room.
  void PostSend(internal::TransportReq* req);
  // Announces a message sent on the other path (a stub, in order).
  void PostStub(int peer, uint64_t tag, uint64_t bytes);
  // A receive from another rank. At most max_message_bytes(): matched here;
  // larger: ordered here, its data taken on the other path.
  void PostRecv(internal::TransportReq* req);
  // Polls every incoming ring (matching what arrived) and retries pending
  // sends; returns how many records and sends it handled.
  int Progress();
  // Whether a record may be waiting in an incoming ring: a hint, read
  // without the transport's lock (a spin loop calls Progress, under the
  // lock, only when it says so). Touches no shared line but the slots
  // polled anyway.
  bool Arrived() const;
  // Whether `req` is held by the channel (a receive not matched, a send not
  // copied yet): Cancel it here.
  static bool Holds(const internal::TransportReq* req);
  // Removes a held request: the channel never touches it again.
  void Cancel(internal::TransportReq* req);
  // Removes the entry of a receive posted on the other path (it was
  // cancelled there).
  void Remove(RecvEntry* entry);
  // The other path completed the entry's receive first: the entry stays to
  // take its stub, and forgets the request.
  static void Detach(RecvEntry* entry);

  // Slots written to `peer` so far (tests).
  uint64_t sent_slots(int peer) const;

 private:
  ShmChannel(int rank, int size, size_t max_bytes, size_t slots, Other* other);

  struct Ring;
  Ring* RingOf(char* segment, int sender) const;
  // Writes one record to `peer`'s ring if it has room.
  bool TryWrite(Peer& p, uint64_t tag, uint32_t len, const void* a, size_t alen);
  bool TrySend(Peer& p, SendEntry* e);
  int Poll(int peer);
  // A record from `peer` (stub: `length` is the UCX message's) met `e`.
  void Deliver(Peer& p, RecvEntry* e, uint64_t tag, bool stub, uint64_t length, Slot* record);
  // Unlinks `e`; the next entry with its key may now post on the other path.
  void Unlink(Peer& p, RecvEntry* e);
  void Finish(internal::TransportReq* req, absl::Status status);
  void FreeRecv(RecvEntry* e);
  void FreeSend(SendEntry* e);

  // Finished entries kept for reuse: no allocation per message. Give takes
  // an entry as it is (a reused Unexpected keeps its buffer's capacity).
  template <typename T>
  class Pool {
   public:
    Pool() = default;
    Pool(const Pool&) = delete;
    Pool& operator=(const Pool&) = delete;
    ~Pool() {
      for (T* e : free_) delete e;
    }
    T* Take() {
      if (free_.empty()) return new T;
      T* e = free_.back();
      free_.pop_back();
      return e;
    }
    void Give(T* e) { free_.push_back(e); }

   private:
    std::vector<T*> free_;
  };

  const int rank_, size_;
  const size_t max_bytes_;
  const size_t slots_;  // per ring, a power of two
  const int shift_;     // log2(slots_)
  Other* const other_;
  ShmSegment own_;                           // this rank's incoming rings
  std::vector<ShmSegment> peers_;            // by rank (own slot empty)
  std::vector<std::unique_ptr<Peer>> peer_;  // by rank (own slot null)
  int pending_sends_ = 0;
  Pool<RecvEntry> recvs_;
  Pool<SendEntry> sends_;
  Pool<Unexpected> unexpected_;
};

}  // namespace loom::comm::ucx

#endif  // LOOM_COMM_UCX_SHM_CHANNEL_H_
