#include "comm/ucx/shm_channel.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace loom::comm::ucx {

using internal::TransportReq;

absl::Status TruncatedError(size_t expected) {
  return absl::InvalidArgumentError(
      absl::StrCat("the peer sent a larger message than the ", expected,
                   " bytes this rank expected (element counts differ across ranks?)"));
}

absl::Status SignatureError(uint32_t sent, uint32_t expected) {
  return absl::InvalidArgumentError(absl::StrFormat(
      "the peer issued a different call (signature %05x, this rank expected %05x): every "
      "rank must call the same collectives in the same order with the same count, dtype, "
      "reduce op and root",
      sent, expected));
}

absl::Status LengthError(size_t sent, size_t expected) {
  return absl::InvalidArgumentError(absl::StrCat("message of ", sent, " bytes, this rank expected ",
                                                 expected,
                                                 " (element counts differ across ranks?)"));
}

absl::Status MatchError(const TransportReq& r, uint64_t sent_tag, size_t length) {
  if (length > r.bytes) return TruncatedError(r.bytes);
  if (internal::TagSig(sent_tag) != internal::TagSig(r.tag)) {
    return SignatureError(internal::TagSig(sent_tag), internal::TagSig(r.tag));
  }
  if (length != r.bytes) return LengthError(length, r.bytes);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// ShmSegment

namespace {

std::string Errno(const char* call, const std::string& name) {
  return absl::StrCat(call, "(", name, "): ", std::strerror(errno));
}

}  // namespace

ShmSegment& ShmSegment::operator=(ShmSegment&& o) noexcept {
  if (this != &o) {
    this->~ShmSegment();
    name_ = std::move(o.name_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    linked_ = std::exchange(o.linked_, false);
  }
  return *this;
}

ShmSegment::~ShmSegment() {
  Unlink();
  if (data_ != nullptr) munmap(data_, size_);
  data_ = nullptr;
}

void ShmSegment::Unlink() {
  if (linked_) shm_unlink(name_.c_str());
  linked_ = false;
}

namespace {

// Maps `bytes` of the open segment `fd` (named `name`, for errors) shared,
// and closes `fd` either way.
absl::StatusOr<void*> MapAndClose(int fd, const std::string& name, size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const absl::Status error =
      p == MAP_FAILED ? absl::UnavailableError(Errno("mmap", name)) : absl::OkStatus();
  close(fd);
  if (!error.ok()) return error;
  return p;
}

}  // namespace

absl::StatusOr<ShmSegment> ShmSegment::Create(const std::string& name, size_t bytes) {
  ShmSegment s;
  s.name_ = name;
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 && errno == EEXIST) return absl::AlreadyExistsError(Errno("shm_open", name));
  if (fd < 0) return absl::UnavailableError(Errno("shm_open", name));
  s.linked_ = true;  // from here on, ~ShmSegment unlinks it
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    absl::Status e =
        absl::UnavailableError(absl::StrCat(Errno("ftruncate", name), " (", bytes, " bytes)"));
    close(fd);
    return e;
  }
  // Reserve the pages now: a full /dev/shm (a container's 64 MiB) is an
  // error here instead of a SIGBUS at the first message.
  if (const int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); rc != 0) {
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("posix_fallocate(", name, ", ", bytes, " bytes): ", std::strerror(rc)));
  }
  absl::StatusOr<void*> p = MapAndClose(fd, name, bytes);
  if (!p.ok()) return p.status();
  s.data_ = *p;
  s.size_ = bytes;
  return s;
}

absl::StatusOr<ShmSegment> ShmSegment::Open(const std::string& name, size_t bytes) {
  ShmSegment s;
  s.name_ = name;
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return absl::UnavailableError(Errno("shm_open", name));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    absl::Status e = absl::UnavailableError(Errno("fstat", name));
    close(fd);
    return e;
  }
  if (static_cast<size_t>(st.st_size) != bytes) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("shared-memory segment ", name, " has ", st.st_size, " bytes, expected ",
                     bytes, " (ranks with different same-host channel settings?)"));
  }
  absl::StatusOr<void*> p = MapAndClose(fd, name, bytes);
  if (!p.ok()) return p.status();
  s.data_ = *p;
  s.size_ = bytes;
  return s;
}

// ---------------------------------------------------------------------------
// Layout in shared memory

namespace {

constexpr size_t kSlotBytes = 64;
constexpr size_t kHeaderBytes = 16;
constexpr size_t kFirstBytes = kSlotBytes - kHeaderBytes;  // payload in a record's first slot
constexpr size_t kMoreBytes = kSlotBytes - 4;              // in each further slot
constexpr uint32_t kPad = 0xffffffffu;                     // `len` of a padding record
constexpr uint32_t kStub = 0x80000000u;  // `len` bit: a stub (payload: u64 length)
constexpr size_t kMaxMessageBytes = 1 << 20;
constexpr uint64_t kMagic = 0x316d68736d6f6f6cull;  // "loomshm1"

// The segment's first cache line, for a check by the peers that map it.
struct SegmentHeader {
  uint64_t magic;
  uint64_t world_size;
  uint64_t ring_slots;
  char pad[40];
};
static_assert(sizeof(SegmentHeader) == 64);

// Doubly linked, intrusive (entries come from free lists: no allocation per
// message).
template <typename T>
struct List {
  T* head = nullptr;
  T* tail = nullptr;
  bool empty() const { return head == nullptr; }
  void PushBack(T* e) {
    e->prev = tail;
    e->next = nullptr;
    (tail ? tail->next : head) = e;
    tail = e;
  }
  void Remove(T* e) {
    (e->prev ? e->prev->next : head) = e->next;
    (e->next ? e->next->prev : tail) = e->prev;
    e->prev = e->next = nullptr;
  }
};

// A request held by the channel has its entry in `impl`, low bit set (the
// transport's own states are aligned: bit clear).
void* Mark(void* entry) { return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(entry) | 1); }
template <typename T>
T* Unmark(void* impl) {
  return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(impl) & ~uintptr_t{1});
}

std::atomic<uint64_t> g_segments{0};  // makes segment names unique in the process

}  // namespace

// A record starts in a slot: header, then the payload, which continues in
// the following slots after their own `seq` word. Every slot's `seq` is
// written by the producer alone, once per lap: the lap of the record that
// starts there, else 0 (a continuation, or skipped by padding). So the value
// the consumer polls before the producer got there is the previous lap's or
// 0, never the current lap, and the consumer writes nothing to the slots
// (a write there would cost it a cache-line transfer per message).
struct ShmChannel::Slot {
  std::atomic<uint32_t> seq;  // Lap(position) of the record starting here, or 0
  uint32_t len;               // payload bytes, kPad, or kStub
  uint64_t tag;
  char payload[kFirstBytes];
  char* more() { return reinterpret_cast<char*>(this) + 4; }  // a continuation's payload
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// A ring in the receiver's segment: the consumer's position on its own
// line (and a spare one: adjacent-line prefetch), then the slots.
struct ShmChannel::Ring {
  alignas(64) std::atomic<uint64_t> tail;  // slots consumed
  char pad[2 * 64 - sizeof(std::atomic<uint64_t>)];
  Slot* slots() { return reinterpret_cast<Slot*>(this + 1); }
};

struct ShmChannel::RecvEntry {
  RecvEntry* prev = nullptr;
  RecvEntry* next = nullptr;
  TransportReq* req = nullptr;  // null: detached (completed on the other path)
  uint64_t key = 0;
  int peer = 0;
  bool large = false;     // data on the other path
  bool deferred = false;  // large, and not posted there yet (an earlier entry has its key)
};

struct ShmChannel::SendEntry {
  SendEntry* prev = nullptr;
  SendEntry* next = nullptr;
  TransportReq* req = nullptr;  // null: a stub
  uint64_t tag = 0;
  uint64_t stub_bytes = 0;
};

struct ShmChannel::Unexpected {
  Unexpected* prev = nullptr;
  Unexpected* next = nullptr;
  uint64_t tag = 0;
  uint64_t length = 0;
  bool stub = false;
  std::vector<char> data;
};

struct ShmChannel::Peer {
  // To the peer: its segment's ring from this rank.
  Slot* out = nullptr;
  Ring* out_ring = nullptr;
  uint64_t head = 0;         // slots written
  uint64_t cached_tail = 0;  // the consumer's position when last read
  List<SendEntry> pending;
  // From the peer: this rank's ring from it.
  Slot* in = nullptr;
  Ring* in_ring = nullptr;
  uint64_t pos = 0;               // slots consumed
  std::atomic<uint64_t> seen{0};  // `pos` for Arrived (another thread)
  List<RecvEntry> posted;
  List<Unexpected> unexpected;
};

namespace {

// Publication mark of the record at absolute slot `pos`: its lap, never 0
// (the mark of continuations and skipped slots), so what a slot held before
// (0 or the previous lap's) never looks published.
inline uint32_t Lap(uint64_t pos, int shift) {
  return static_cast<uint32_t>((pos >> shift) % 0xffffffffull) + 1;
}

int Log2(size_t x) {
  int s = 0;
  while ((size_t{1} << s) < x) ++s;
  return s;
}

}  // namespace

size_t ShmChannel::SlotsFor(size_t payload) {
  return payload <= kFirstBytes ? 1 : 1 + (payload - kFirstBytes + kMoreBytes - 1) / kMoreBytes;
}

namespace {

// Payload into the record at `s` (and the slots after it), whose `seq`
// words it zeroes; and out of it.
void CopyIn(ShmChannel::Slot* s, const char* src, size_t n) {
  size_t c = std::min(n, kFirstBytes);
  std::memcpy(s->payload, src, c);
  for (src += c, n -= c; n > 0; src += c, n -= c) {
    ++s;
    c = std::min(n, kMoreBytes);
    s->seq.store(0, std::memory_order_relaxed);
    std::memcpy(s->more(), src, c);
  }
}
void CopyOut(char* dst, ShmChannel::Slot* s, size_t n) {
  size_t c = std::min(n, kFirstBytes);
  std::memcpy(dst, s->payload, c);
  for (dst += c, n -= c; n > 0; dst += c, n -= c) {
    ++s;
    c = std::min(n, kMoreBytes);
    std::memcpy(dst, s->more(), c);
  }
}

}  // namespace

ShmChannel::Ring* ShmChannel::RingOf(char* segment, int sender) const {
  const size_t stride = sizeof(Ring) + slots_ * kSlotBytes;
  return reinterpret_cast<Ring*>(segment + sizeof(SegmentHeader) + sender * stride);
}

ShmChannel::ShmChannel(int rank, int size, size_t max_bytes, size_t slots, Other* other)
    : rank_(rank),
      size_(size),
      max_bytes_(max_bytes),
      slots_(slots),
      shift_(Log2(slots)),
      other_(other) {
  static_assert(sizeof(Slot) == kSlotBytes);
  static_assert(sizeof(Ring) == 128);
}

ShmChannel::~ShmChannel() {
  for (auto& p : peer_) {
    if (!p) continue;
    while (!p->pending.empty()) {
      SendEntry* e = p->pending.head;
      p->pending.Remove(e);
      delete e;
    }
    while (!p->posted.empty()) {
      RecvEntry* e = p->posted.head;
      p->posted.Remove(e);
      delete e;
    }
    while (!p->unexpected.empty()) {
      Unexpected* u = p->unexpected.head;
      p->unexpected.Remove(u);
      delete u;
    }
  }
}

absl::StatusOr<std::unique_ptr<ShmChannel>> ShmChannel::Connect(
    int rank, int size, Store& store, const std::string& key_prefix, const std::string& name_base,
    absl::Duration timeout, const ShmChannelOptions& options, Other* other) {
  const size_t max_bytes = options.max_message_bytes;
  if (max_bytes == 0 || max_bytes > kMaxMessageBytes) {
    return absl::InvalidArgumentError(absl::StrCat("same-host channel: a message limit of ",
                                                   max_bytes, " bytes is not in [1, ",
                                                   kMaxMessageBytes, "]"));
  }
  size_t slots = std::max<size_t>(8 * SlotsFor(max_bytes), options.ring_bytes / kSlotBytes);
  slots = size_t{1} << Log2(slots);
  const size_t bytes = sizeof(SegmentHeader) + size * (sizeof(Ring) + slots * kSlotBytes);
  std::unique_ptr<ShmChannel> ch(new ShmChannel(rank, size, max_bytes, slots, other));

  // This rank's segment; its name (or why there is none) to the store.
  std::string error;
  std::string name;
  absl::StatusOr<ShmSegment> own;
  // A name taken (a process of the same pid in another PID namespace, as in
  // a sandbox, sharing /dev/shm): the next one.
  for (int attempt = 0; attempt < 64; ++attempt) {
    name = absl::StrCat(name_base, "-", rank, "-", g_segments.fetch_add(1));
    own = ShmSegment::Create(name, bytes);
    if (!absl::IsAlreadyExists(own.status())) break;
  }
  if (own.ok()) {
    ch->own_ = std::move(*own);
    auto* h = reinterpret_cast<SegmentHeader*>(ch->own_.data());
    h->magic = kMagic;
    h->world_size = size;
    h->ring_slots = slots;
  } else {
    error = std::string(own.status().message());
  }
  absl::Status s =
      store.Set(absl::StrCat(key_prefix, "seg/", rank), error.empty() ? name : "!" + error);
  if (!s.ok()) return s;
  // The peers' segments (a peer's failure is its to report).
  ch->peers_.resize(size);
  bool peer_failed = false;
  for (int q = 0; q < size && error.empty(); ++q) {
    if (q == rank) continue;
    absl::StatusOr<std::string> peer_name = store.Get(absl::StrCat(key_prefix, "seg/", q), timeout);
    if (!peer_name.ok()) {
      return absl::Status(peer_name.status().code(),
                          absl::StrCat("ucx backend: rank ", rank, " waiting for rank ", q,
                                       "'s shared-memory segment: ", peer_name.status().message()));
    }
    if (!peer_name->empty() && (*peer_name)[0] == '!') {
      peer_failed = true;
      break;
    }
    absl::StatusOr<ShmSegment> seg = ShmSegment::Open(*peer_name, bytes);
    if (!seg.ok()) {
      error = std::string(seg.status().message());
      break;
    }
    const auto* h = reinterpret_cast<const SegmentHeader*>(seg->data());
    if (h->magic != kMagic || h->world_size != static_cast<uint64_t>(size) ||
        h->ring_slots != slots) {
      error = absl::StrCat("shared-memory segment ", *peer_name, " of rank ", q,
                           " has another layout (ranks with different settings?)");
      break;
    }
    ch->peers_[q] = std::move(*seg);
  }
  const bool failed_here = !error.empty() || peer_failed;
  if (failed_here) {
    absl::StatusOr<int64_t> n = store.Add(key_prefix + "failed", 1);
    if (!n.ok()) return n.status();
  }
  // Every rank mapped every segment it will (or gave up): the names go.
  s = StoreBarrier(store, key_prefix + "mapped", size, timeout);
  if (!s.ok()) return s;
  ch->own_.Unlink();
  absl::StatusOr<int64_t> failed = store.Add(key_prefix + "failed", 0);
  if (!failed.ok()) return failed.status();
  if (*failed > 0) {
    if (!error.empty()) {
      std::fprintf(stderr,
                   "loom: ucx backend rank %d: same-host channel off, UCX carries every "
                   "message: %s\n",
                   rank, error.c_str());
    }
    return std::unique_ptr<ShmChannel>();
  }
  ch->peer_.resize(size);
  for (int q = 0; q < size; ++q) {
    if (q == rank) continue;
    auto p = std::make_unique<Peer>();
    p->out_ring = ch->RingOf(ch->peers_[q].data(), rank);
    p->out = p->out_ring->slots();
    p->in_ring = ch->RingOf(ch->own_.data(), q);
    p->in = p->in_ring->slots();
    ch->peer_[q] = std::move(p);
  }
  return ch;
}

uint64_t ShmChannel::sent_slots(int peer) const { return peer_[peer]->head; }

bool ShmChannel::Holds(const TransportReq* req) {
  return (reinterpret_cast<uintptr_t>(req->impl) & 1) != 0;
}

void ShmChannel::Detach(RecvEntry* entry) { entry->req = nullptr; }

void ShmChannel::Finish(TransportReq* req, absl::Status status) {
  req->impl = nullptr;
  if (!status.ok()) req->status = std::move(status);
  req->done.store(true, std::memory_order_release);  // last: the owner may free `req`
}

bool ShmChannel::TryWrite(Peer& p, uint64_t tag, uint32_t len, const void* a, size_t alen) {
  const int shift = shift_;
  const size_t k = SlotsFor(alen);
  size_t idx = p.head & (slots_ - 1);
  const size_t to_end = slots_ - idx;
  const size_t need = k <= to_end ? k : to_end + k;  // with a padding record
  if (slots_ - (p.head - p.cached_tail) < need) {
    // Only now the consumer's line: it stays in the consumer's cache otherwise.
    p.cached_tail = p.out_ring->tail.load(std::memory_order_acquire);
    if (slots_ - (p.head - p.cached_tail) < need) return false;
  }
  if (k > to_end) {
    // Padding to the ring's end; the slots it skips get their 0 of this lap.
    for (size_t j = idx + 1; j < slots_; ++j) p.out[j].seq.store(0, std::memory_order_relaxed);
    Slot& pad = p.out[idx];
    pad.len = kPad;
    pad.seq.store(Lap(p.head, shift), std::memory_order_release);
    p.head += to_end;
    idx = 0;
  }
  Slot& s = p.out[idx];
  s.len = len;
  s.tag = tag;
  CopyIn(&s, static_cast<const char*>(a), alen);
  s.seq.store(Lap(p.head, shift), std::memory_order_release);  // publishes the record
  p.head += k;
  return true;
}

bool ShmChannel::TrySend(Peer& p, SendEntry* e) {
  if (e->req == nullptr) return TryWrite(p, e->tag, kStub, &e->stub_bytes, sizeof(uint64_t));
  return TryWrite(p, e->req->tag, static_cast<uint32_t>(e->req->bytes), e->req->buf, e->req->bytes);
}

void ShmChannel::PostSend(TransportReq* req) {
  Peer& p = *peer_[req->peer];
  if (p.pending.empty() &&
      TryWrite(p, req->tag, static_cast<uint32_t>(req->bytes), req->buf, req->bytes)) {
    Finish(req, absl::OkStatus());
    return;
  }
  SendEntry* e = sends_.Take();
  e->req = req;
  p.pending.PushBack(e);  // behind earlier pending records: order per peer
  ++pending_sends_;
  req->impl = Mark(e);
}

void ShmChannel::PostStub(int peer, uint64_t tag, uint64_t bytes) {
  Peer& p = *peer_[peer];
  if (p.pending.empty() && TryWrite(p, tag, kStub, &bytes, sizeof(bytes))) return;
  SendEntry* e = sends_.Take();
  e->tag = tag;
  e->stub_bytes = bytes;
  p.pending.PushBack(e);
  ++pending_sends_;
}

void ShmChannel::PostRecv(TransportReq* req) {
  Peer& p = *peer_[req->peer];
  const uint64_t key = internal::MatchKey(req->tag);
  // A message that came first (none of the posted entries wanted it).
  for (Unexpected* u = p.unexpected.head; u != nullptr; u = u->next) {
    if (internal::MatchKey(u->tag) != key) continue;
    p.unexpected.Remove(u);
    if (u->stub) {
      other_->PostRecv(req, nullptr);  // its data comes there
    } else {
      absl::Status s = MatchError(*req, u->tag, u->length);
      if (s.ok() && u->length > 0) std::memcpy(req->buf, u->data.data(), u->length);
      Finish(req, std::move(s));
    }
    u->data.clear();
    unexpected_.Give(u);
    return;
  }
  RecvEntry* e = recvs_.Take();
  e->req = req;
  e->key = key;
  e->peer = req->peer;
  e->large = req->bytes > max_bytes_;
  bool first = true;
  if (e->large) {
    for (RecvEntry* o = p.posted.head; o != nullptr && first; o = o->next) first = o->key != key;
  }
  p.posted.PushBack(e);
  if (e->large && first) {
    // Posted there at once (no copy through UCX's unexpected queue); its
    // stub, when it comes here, only takes the entry.
    other_->PostRecv(req, e);
    return;
  }
  // Large behind an earlier receive of its key: posted there once that one
  // is matched (UCX must see the receives of one key in this order).
  e->deferred = e->large;
  req->impl = Mark(e);
}

void ShmChannel::Unlink(Peer& p, RecvEntry* e) {
  // The next entry of the key becomes the first: a deferred large receive
  // posts on the other path now. (Only if `e` was the first.)
  RecvEntry* next = nullptr;
  bool was_first = true;
  for (RecvEntry* o = e->prev; o != nullptr && was_first; o = o->prev) was_first = o->key != e->key;
  if (was_first) {
    for (RecvEntry* o = e->next; o != nullptr; o = o->next) {
      if (o->key == e->key) {
        next = o;
        break;
      }
    }
  }
  p.posted.Remove(e);
  if (next != nullptr && next->deferred) {
    next->deferred = false;
    next->req->impl = nullptr;
    other_->PostRecv(next->req, next);
  }
}

void ShmChannel::Deliver(Peer& p, RecvEntry* e, uint64_t tag, bool stub, uint64_t length,
                         Slot* record) {
  TransportReq* r = e->req;
  const bool large = e->large;
  // Out of the list first, and the request handled before the next entry
  // of the key may post on the other path (order there).
  RecvEntry* next = nullptr;
  for (RecvEntry* o = e->next; o != nullptr; o = o->next) {
    if (o->key == e->key) {
      next = o;
      break;
    }
  }
  p.posted.Remove(e);
  FreeRecv(e);
  if (!large) {
    if (stub) {
      r->impl = nullptr;
      other_->PostRecv(r, nullptr);
    } else {
      absl::Status s = MatchError(*r, tag, length);
      if (s.ok()) CopyOut(static_cast<char*>(r->buf), record, length);
      Finish(r, std::move(s));
    }
  } else if (r != nullptr) {
    other_->Resolved(r, stub ? absl::OkStatus() : MatchError(*r, tag, length));
  }
  if (next != nullptr && next->deferred) {
    next->deferred = false;
    next->req->impl = nullptr;
    other_->PostRecv(next->req, next);
  }
}

int ShmChannel::Poll(int peer) {
  Peer& p = *peer_[peer];
  const int shift = shift_;
  int n = 0;
  for (;;) {
    const size_t idx = p.pos & (slots_ - 1);
    Slot& s = p.in[idx];
    if (s.seq.load(std::memory_order_acquire) != Lap(p.pos, shift)) break;
    const uint32_t len = s.len;
    size_t k;
    if (len == kPad) {
      k = slots_ - idx;
    } else {
      const bool stub = (len & kStub) != 0;
      uint64_t length = len;
      if (stub) std::memcpy(&length, s.payload, sizeof(length));
      const size_t alen = stub ? sizeof(uint64_t) : len;
      k = SlotsFor(alen);
      const uint64_t tag = s.tag;
      const uint64_t key = internal::MatchKey(tag);
      RecvEntry* e = p.posted.head;
      while (e != nullptr && e->key != key) e = e->next;
      if (e != nullptr) {
        Deliver(p, e, tag, stub, length, &s);
      } else {
        // Copied out: the ring never fills for want of a receive.
        Unexpected* u = unexpected_.Take();
        u->tag = tag;
        u->length = length;
        u->stub = stub;
        if (!stub) {
          u->data.resize(len);
          CopyOut(u->data.data(), &s, len);
        }
        p.unexpected.PushBack(u);
      }
    }
    p.pos += k;
    ++n;
  }
  // Orders the reads above before the producer reuses the slots.
  if (n > 0) {
    p.in_ring->tail.store(p.pos, std::memory_order_release);
    p.seen.store(p.pos, std::memory_order_relaxed);
  }
  return n;
}

bool ShmChannel::Arrived() const {
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    const Peer& p = *peer_[q];
    const uint64_t pos = p.seen.load(std::memory_order_relaxed);
    if (p.in[pos & (slots_ - 1)].seq.load(std::memory_order_relaxed) == Lap(pos, shift_)) {
      return true;
    }
  }
  return false;
}

int ShmChannel::Progress() {
  int n = 0;
  for (int q = 0; q < size_; ++q) {
    if (q != rank_) n += Poll(q);
  }
  if (pending_sends_ == 0) return n;
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    Peer& p = *peer_[q];
    while (!p.pending.empty() && TrySend(p, p.pending.head)) {
      SendEntry* e = p.pending.head;
      p.pending.Remove(e);
      --pending_sends_;
      ++n;
      if (e->req != nullptr) Finish(e->req, absl::OkStatus());
      FreeSend(e);
    }
  }
  return n;
}

void ShmChannel::Cancel(TransportReq* req) {
  if (!Holds(req)) return;
  Peer& p = *peer_[req->peer];
  if (req->is_send) {
    auto* e = Unmark<SendEntry>(req->impl);
    p.pending.Remove(e);  // dropped: never copied
    --pending_sends_;
    FreeSend(e);
  } else {
    auto* e = Unmark<RecvEntry>(req->impl);
    Unlink(p, e);
    FreeRecv(e);
  }
  req->impl = nullptr;
}

void ShmChannel::Remove(RecvEntry* entry) {
  Unlink(*peer_[entry->peer], entry);
  FreeRecv(entry);
}

void ShmChannel::FreeRecv(RecvEntry* e) {
  *e = RecvEntry();
  recvs_.Give(e);
}

void ShmChannel::FreeSend(SendEntry* e) {
  *e = SendEntry();
  sends_.Give(e);
}

}  // namespace loom::comm::ucx
