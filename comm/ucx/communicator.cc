#include "comm/ucx/communicator.h"

#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "comm/internal/engine.h"
#include "comm/internal/transport.h"
#include "comm/ucx/shm_channel.h"
#include "comm/ucx/wait.h"
#include "core/status_macros.h"

namespace loom::comm::ucx {
namespace {

using internal::TransportReq;

std::string UcsError(const char* what, ucs_status_t s) {
  return absl::StrCat(what, ": ", ucs_status_string(s));
}

// Per-request state shared with UCX callbacks. When the engine gives the
// request up (Cancel), `owner` is cleared (the callback then just frees) and
// the state takes over what keeps the buffer alive until the callback, or
// the transport's end; `abandoned` is then the transport's list of such.
struct ReqState {
  TransportReq* owner = nullptr;
  void* handle = nullptr;
  ucp_tag_recv_info_t info{};
  std::shared_ptr<const void> keep_alive;
  std::set<ReqState*>* abandoned = nullptr;
  // A receive posted with NO_IMM_CMPL may complete inside ucp_tag_recv_nbx:
  // the callback then only marks `finished`, and Post frees the request.
  bool in_post = false;
  bool finished = false;
  // Where a finished state goes for reuse (the transport's; every use is
  // under its mutex): no allocation per message.
  std::vector<ReqState*>* free_list = nullptr;
  // A receive from a same-host peer: its place in the channel's order while
  // the channel waits for the message's stub (shm_channel.h).
  ShmChannel::RecvEntry* shm_entry = nullptr;
  // Set when the channel found that the peer sent this receive's message
  // there: the receive completes with it once UCX lets go.
  absl::Status error;
};

// Back to the free list, holding nothing (an abandoned request's buffers go).
void Recycle(ReqState* st) {
  // Done on UCX: the channel's entry (if any) waits for the stub alone.
  if (st->shm_entry) ShmChannel::Detach(st->shm_entry);
  std::vector<ReqState*>* free_list = st->free_list;
  *st = ReqState();
  st->free_list = free_list;
  free_list->push_back(st);
}

// The request is over: UCX touches neither it nor its buffer again.
void Release(void* request, ReqState* st) {
  ucp_request_free(request);
  if (st->abandoned) st->abandoned->erase(st);
  Recycle(st);
}

// Publishes `done` last (transport.h): the owner may free `r` right after.
// (The errors are the same-host channel's too: shm_channel.h.)
void Complete(TransportReq* r, ucs_status_t status, const ucp_tag_recv_info_t* info) {
  if (status == UCS_ERR_MESSAGE_TRUNCATED) {
    r->status = TruncatedError(r->bytes);
  } else if (status != UCS_OK) {
    r->status = absl::UnavailableError(UcsError(r->is_send ? "UCX send" : "UCX receive", status));
  } else if (!r->is_send && info != nullptr) {
    if (internal::TagSig(info->sender_tag) != internal::TagSig(r->tag)) {
      r->status = SignatureError(internal::TagSig(info->sender_tag), internal::TagSig(r->tag));
    } else if (info->length != r->bytes) {
      r->status = LengthError(info->length, r->bytes);
    }
  }
  r->done.store(true, std::memory_order_release);
}

void SendCallback(void* request, ucs_status_t status, void* user_data) {
  auto* st = static_cast<ReqState*>(user_data);
  if (st->owner) {
    st->owner->impl = nullptr;
    Complete(st->owner, status, nullptr);
  }
  if (st->in_post) {
    st->finished = true;
    return;
  }
  Release(request, st);
}

void RecvCallback(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                  void* user_data) {
  auto* st = static_cast<ReqState*>(user_data);
  if (st->owner) {
    st->owner->impl = nullptr;
    if (st->error.ok()) {
      Complete(st->owner, status, info);
    } else {  // the channel's verdict (see ReqState::error)
      st->owner->status = st->error;
      st->owner->done.store(true, std::memory_order_release);
    }
  }
  if (st->in_post) {
    st->finished = true;
    return;
  }
  Release(request, st);
}

void EndpointError(void* arg, ucp_ep_h, ucs_status_t status) {
  // The peer is gone: its pending requests complete with an error, and
  // receives from it time out naming it. Nothing to do here.
  (void)arg;
  (void)status;
}

// While alive (and `active`), drops UCX's warning about unexpected
// tag-receive descriptors nobody matched (ucp_worker_destroy's); every other
// UCX message passes.
class QuietUnmatchedWarnings {
 public:
  explicit QuietUnmatchedWarnings(bool active) : active_(active) {
    if (active_) ucs_log_push_handler(&Filter);
  }
  ~QuietUnmatchedWarnings() {
    if (active_) ucs_log_pop_handler();
  }
  QuietUnmatchedWarnings(const QuietUnmatchedWarnings&) = delete;
  QuietUnmatchedWarnings& operator=(const QuietUnmatchedWarnings&) = delete;

 private:
  static ucs_log_func_rc_t Filter(const char*, unsigned, const char*, ucs_log_level_t level,
                                  const ucs_log_component_config_t*, const char* message,
                                  va_list) {
    const bool unmatched = level == UCS_LOG_LEVEL_WARN && message != nullptr &&
                           std::strstr(message, "unexpected tag-receive descriptor") != nullptr;
    return unmatched ? UCS_LOG_FUNC_RC_STOP : UCS_LOG_FUNC_RC_CONTINUE;
  }
  bool active_;
};

// The UCP context with its worker and an endpoint per peer.
struct Lane {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_address_t* address = nullptr;
  std::vector<ucp_ep_h> eps;
};

// When every rank is on one host and the user did not choose UCX_TLS, the
// context is shared memory only (no TCP), with the eager protocol below
// kSameHostRndvThresh and rendezvous (CMA, put_zcopy) from there on.
// Measured here, in turns with raw MPI in the same run: progressing a worker
// that has a TCP interface costs a poll() system call per call (2x
// small-message latency). Eager copies through the shared-memory FIFO need
// both ranks running at once (the FIFO holds a few fragments), which a
// loaded 2-vCPU VM often does not give: with eager everything, 256 KiB-16 MiB
// all-reduces ran 0.32-5x raw MPI (1.1-3.9 GB/s), with rendezvous from 128
// KiB 0.69-5x (1.1-9.9 GB/s; 256 KiB 5.5-9.9 GB/s against 2.1-3.3), six
// alternating runs each (issue #22). An earlier, quieter machine had shown
// eager ahead at 1-16 MiB. Across hosts (or with UCX_TLS set) UCX chooses
// transports and protocols itself.
constexpr char kSameHostRndvThresh[] = "128K";
// Every rank on one host: messages up to UcxOptions::same_host_channel_bytes
// go through our own shared-memory rings (shm_channel.h), the rest on UCX.
class UcxTransport : public internal::Transport, private ShmChannel::Other {
 public:
  UcxTransport(int rank, int size, std::shared_ptr<Store> store, bool peer_failure_mode,
               size_t max_bytes_ahead)
      : rank_(rank),
        size_(size),
        store_(std::move(store)),
        peer_mode_(peer_failure_mode),
        max_bytes_ahead_(max_bytes_ahead),
        bytes_ahead_(size, 0) {}

  ~UcxTransport() override {
    if (!lane_.worker) return;
    std::lock_guard<std::mutex> l(mu_);
    // Whether any rank gave a request up (an op failed) is shared through
    // the store, for the warnings below.
    if (gave_up_) (void)store_->Set(prefix_ + "gave_up", "1");
    // Close with flush after a barrier (forced closes return errors); bounded.
    const bool all_closing =
        size_ == 1 || StoreBarrier(*store_, prefix_ + "close", size_, absl::Seconds(10)).ok();
    const bool any_gave_up =
        gave_up_ || store_->Get(prefix_ + "gave_up", absl::ZeroDuration()).ok();
    // When a peer did not come to close, this rank is leaving on an error (or
    // a peer is gone), and after an op failed on any rank (a request was
    // given up), messages for it may never be received. UCX warns about each
    // such message when the worker is destroyed ("unexpected tag-receive
    // descriptor ... was not matched"): noise after an error, so exactly that
    // warning is dropped, on these paths only. A clean close after no
    // failure keeps every UCX message: there an unmatched message would be a
    // bug worth seeing.
    QuietUnmatchedWarnings quiet(!all_closing || any_gave_up);
    std::vector<void*> closing;
    for (ucp_ep_h ep : lane_.eps) {
      if (!ep) continue;
      ucp_request_param_t p{};
      void* req = ucp_ep_close_nbx(ep, &p);
      if (UCS_PTR_IS_PTR(req)) closing.push_back(req);
    }
    absl::Time deadline = absl::Now() + absl::Seconds(5);
    for (void* req : closing) {
      while (ucp_request_check_status(req) == UCS_INPROGRESS && absl::Now() < deadline) {
        ucp_worker_progress(lane_.worker);
      }
      ucp_request_free(req);
    }
    // Requests given up and still running (sends to a peer that never
    // received, receives whose message stopped arriving): UCX frees them
    // without callbacks; their buffers are let go once the worker is gone.
    std::set<ReqState*> abandoned;
    abandoned.swap(abandoned_);
    for (ReqState* st : abandoned) ucp_request_free(st->handle);
    if (lane_.address) ucp_worker_release_address(lane_.worker, lane_.address);
    ucp_worker_destroy(lane_.worker);
    ucp_cleanup(lane_.context);
    for (ReqState* st : abandoned) delete st;
    for (ReqState* st : free_states_) delete st;
  }

  // `same_host_tuning`: see the comment above this class; `channel_bytes`:
  // UcxOptions::same_host_channel_bytes.
  absl::Status Init(absl::Duration timeout, bool same_host_tuning, size_t channel_bytes) {
    // Every key of this world carries its generation g: how many ucx worlds
    // this rank joined over this store before (counted in the store, per
    // rank). The ranks of a world have all joined equally many, so they
    // agree on g, and a re-created world never reads the addresses (or
    // barriers) of an earlier one.
    absl::StatusOr<int64_t> joined =
        store_->Add(absl::StrCat("loom/ucx/rank", rank_, "/worlds_joined"), 1);
    if (!joined.ok()) return joined.status();
    prefix_ = absl::StrCat("loom/ucx/gen", *joined - 1, "/");
    const bool tune = same_host_tuning && std::getenv("UCX_TLS") == nullptr;
    bool one_host = false;
    if (size_ > 1 && (tune || channel_bytes > 0)) {
      absl::StatusOr<bool> all = AllOnOneHost(timeout);
      if (!all.ok()) return all.status();
      one_host = *all;
    }
    if (tune && one_host) {
      std::vector<std::pair<const char*, const char*>> shm = {{"TLS", "^tcp"}};
      if (std::getenv("UCX_RNDV_THRESH") == nullptr) {
        shm.push_back({"RNDV_THRESH", kSameHostRndvThresh});
      }
      LOOM_RETURN_IF_ERROR(InitLane(&lane_, "shm", shm, timeout));
    } else {
      LOOM_RETURN_IF_ERROR(InitLane(&lane_, "main", {}, timeout));
    }
    if (!one_host || channel_bytes == 0) return absl::OkStatus();
    ShmChannelOptions co;
    co.max_message_bytes = channel_bytes;
    absl::StatusOr<std::unique_ptr<ShmChannel>> ch = ShmChannel::Connect(
        rank_, size_, *store_, prefix_ + "shm/",
        absl::StrCat("/loom-ucx-", getpid(), "-", *joined - 1), timeout, co, this);
    if (!ch.ok()) return ch.status();
    shm_ = std::move(*ch);  // null: a rank could not map the segments (it said why)
    return absl::OkStatus();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void Post(TransportReq* r) override {
    std::lock_guard<std::mutex> l(mu_);
    PostLocked(r);
  }

  void PostAll(TransportReq* const* reqs, size_t n) override {
    std::lock_guard<std::mutex> l(mu_);
    for (size_t i = 0; i < n; ++i) PostLocked(reqs[i]);
  }

  void Test(const std::vector<TransportReq*>& reqs) override {
    std::lock_guard<std::mutex> l(mu_);
    if (shm_) shm_->Progress();
    // Until idle, but bounded: a sibling communicator's traffic on the
    // worker may never let it be idle.
    for (int i = 0; i < 64 && ucp_worker_progress(lane_.worker) != 0; ++i) {
    }
  }

  // Caller holds mu_.
  void PostLocked(TransportReq* r) {
    if (shm_ == nullptr || r->peer == rank_) {
      PostUcx(r, r->is_send && SendsCatchUp(r->peer, r->bytes), nullptr);
      return;
    }
    // A same-host peer: every message takes its place in the channel's
    // order; small ones travel there, the rest (and a send that must catch
    // up) leave a stub there and travel on UCX.
    if (!r->is_send) {
      shm_->PostRecv(r);
      return;
    }
    const bool sync = SendsCatchUp(r->peer, r->bytes);
    if (!sync && r->bytes <= shm_->max_message_bytes()) {
      shm_->PostSend(r);
      return;
    }
    shm_->PostStub(r->peer, r->tag, r->bytes);
    PostUcx(r, sync, nullptr);
  }

  // Caller holds mu_. `sync`: a send that must catch up (SendsCatchUp);
  // `entry`: a receive's place in the channel's order.
  void PostUcx(TransportReq* r, bool sync, ShmChannel::RecvEntry* entry) {
    ReqState* st = NewState();
    st->owner = r;
    st->shm_entry = entry;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.user_data = st;
    void* ret;
    st->in_post = true;
    if (r->is_send) {
      p.cb.send = SendCallback;
      ret = sync ? ucp_tag_send_sync_nbx(lane_.eps[r->peer], r->buf, r->bytes, r->tag, &p)
                 : ucp_tag_send_nbx(lane_.eps[r->peer], r->buf, r->bytes, r->tag, &p);
    } else {
      // UCX 1.13 leaves recv_info unset on immediate completion: always take
      // the callback, which carries the sender's tag and the length.
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_RECV_INFO | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
      p.cb.recv = RecvCallback;
      p.recv_info.tag_info = &st->info;
      ret = ucp_tag_recv_nbx(lane_.worker, r->buf, r->bytes, r->tag, ~internal::kSigMask, &p);
    }
    st->in_post = false;
    if (ret == nullptr) {  // completed immediately; no callback will come
      Complete(r, UCS_OK, r->is_send ? nullptr : &st->info);
      Recycle(st);
    } else if (UCS_PTR_IS_ERR(ret)) {
      Complete(r, UCS_PTR_STATUS(ret), nullptr);
      Recycle(st);
    } else if (st->finished) {  // the callback ran inside the call and reported to `r`
      ucp_request_free(ret);
      Recycle(st);
    } else {
      st->handle = ret;
      r->impl = st;
    }
  }

  absl::Status WaitAll(const std::vector<TransportReq*>& reqs, absl::Time deadline,
                       const std::atomic<bool>& abort) override {
    auto all_done = [&] {
      for (TransportReq* r : reqs) {
        if (!r->done.load(std::memory_order_acquire)) return false;
      }
      return true;
    };
    // Small messages are often done once posted (eager sends), or after one
    // progress call.
    if (all_done()) return absl::OkStatus();
    unsigned passes = 0;
    bool shm_only = false;  // as of the last locked pass
    return WaitForRequests(
        [&] {
          WaitPass p;
          // Awaiting only the channel: most passes only look at the rings
          // (no lock, a few times: a pass about as long as a locked one),
          // and UCX progresses every few passes (its progress call would
          // double a pass, and the time to see a message).
          if (shm_only && ++passes % kShmPassesPerUcxPoll != 0) {
            bool arrived = false;
            for (int i = 0; i < kPeeksPerPass && !arrived; ++i) arrived = shm_->Arrived();
            if (!arrived) {
              p.done = all_done();
              return p;
            }
          }
          // A few progress calls per lock while nothing happens: the lock
          // costs about as much as an idle progress call, and the sooner
          // the next call, the sooner an arriving message is seen.
          std::lock_guard<std::mutex> l(mu_);
          const bool ucx = !shm_only || passes % kShmPassesPerUcxPoll == 0;
          for (int i = 0; i < kProgressPerLock; ++i) {
            if (shm_) p.events = shm_->Progress();
            if (ucx) p.events += ucp_worker_progress(lane_.worker);
            if (p.events) break;
          }
          p.done = all_done();
          shm_only = shm_ && OnChannel(reqs);
          return p;
        },
        deadline, abort);
  }

  void Cancel(TransportReq* r) override {
    std::lock_guard<std::mutex> l(mu_);
    if (r->done) return;
    if (shm_ && ShmChannel::Holds(r)) {  // not matched, or not copied yet: gone at once
      gave_up_ = true;
      shm_->Cancel(r);
      return;
    }
    auto* st = static_cast<ReqState*>(r->impl);
    if (st == nullptr) return;
    gave_up_ = true;
    if (st->shm_entry) {  // its place in the channel's order goes with it
      shm_->Remove(st->shm_entry);
      st->shm_entry = nullptr;
    }
    st->owner = nullptr;  // the callback frees `st`, and no longer reports to `r`
    r->impl = nullptr;
    st->keep_alive = std::move(r->keep_alive);  // until the callback (or ~UcxTransport)
    st->abandoned = &abandoned_;
    abandoned_.insert(st);
    // UCX cancels a receive not yet matched (its callback runs in here, with
    // UCS_ERR_CANCELED). A send, or a receive whose message is arriving,
    // cannot be cancelled: it runs to its end, into the buffer kept above.
    if (!r->is_send) ucp_request_cancel(lane_.worker, st->handle);
  }

 private:
  // ShmChannel::Other (caller holds mu_): a receive from a same-host peer
  // whose data travels on UCX.
  void PostRecv(TransportReq* r, ShmChannel::RecvEntry* entry) override {
    PostUcx(r, false, entry);
  }
  void Resolved(TransportReq* r, absl::Status error) override {
    auto* st = static_cast<ReqState*>(r->impl);
    st->shm_entry = nullptr;
    if (error.ok()) return;  // a stub: the data is on its way
    // The peer sent this message on the channel (its length differs across
    // the limit): UCX lets go of the receive, which then fails with `error`.
    st->error = std::move(error);
    gave_up_ = true;  // quiet about the UCX message nobody will receive
    ucp_request_cancel(lane_.worker, st->handle);
  }

  // Every rank publishes its host name and the kernel's boot id (containers
  // on different machines may share a host name such as "localhost"; the
  // boot id tells machines apart); true when they are all the same. Every
  // rank gets the same answer, so all choose the same transports.
  absl::StatusOr<bool> AllOnOneHost(absl::Duration timeout) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    std::string me = host;
    if (std::ifstream boot("/proc/sys/kernel/random/boot_id"); boot) {
      std::string id;
      std::getline(boot, id);
      absl::StrAppend(&me, "/", id);
    }
    LOOM_RETURN_IF_ERROR(store_->Set(absl::StrCat(prefix_, "host/", rank_), me));
    // Rank 0 compares and publishes one answer: n store reads in all, not n².
    const std::string verdict_key = prefix_ + "one_host";
    if (rank_ == 0) {
      bool same = true;
      for (int peer = 1; peer < size_; ++peer) {
        auto other = store_->Get(absl::StrCat(prefix_, "host/", peer), timeout);
        if (!other.ok()) return other.status();
        same = same && *other == me;
      }
      LOOM_RETURN_IF_ERROR(store_->Set(verdict_key, same ? "1" : "0"));
      return same;
    }
    auto verdict = store_->Get(verdict_key, timeout);
    if (!verdict.ok()) return verdict.status();
    return *verdict == "1";
  }

  absl::Status InitLane(Lane* lane, const char* name,
                        const std::vector<std::pair<const char*, const char*>>& overrides,
                        absl::Duration timeout) {
    ucp_config_t* config = nullptr;
    ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
    if (s != UCS_OK) {
      return absl::InvalidArgumentError(
          UcsError("ucx backend: reading UCX configuration (check UCX_TLS / UCX_* variables)", s));
    }
    for (const auto& [key, value] : overrides) {
      s = ucp_config_modify(config, key, value);
      if (s != UCS_OK) {
        ucp_config_release(config);
        return absl::InternalError(UcsError(
            absl::StrCat("ucx backend: setting ", key, "=", value, " on the ", name, " lane").c_str(),
            s));
      }
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG;
    s = ucp_init(&params, config, &lane->context);
    ucp_config_release(config);
    if (s != UCS_OK) {
      return absl::UnavailableError(UcsError(
          "ucx backend: ucp_init failed (are the transports in UCX_TLS available here?)", s));
    }
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // every call under mu_
    s = ucp_worker_create(lane->context, &wp, &lane->worker);
    if (s != UCS_OK) return absl::UnavailableError(UcsError("ucx backend: ucp_worker_create", s));
    size_t len = 0;
    s = ucp_worker_get_address(lane->worker, &lane->address, &len);
    if (s != UCS_OK) return absl::UnavailableError(UcsError("ucx backend: worker address", s));
    absl::Status st = store_->Set(absl::StrCat(prefix_, name, "/addr/", rank_),
                                  std::string(reinterpret_cast<char*>(lane->address), len));
    if (!st.ok()) return st;
    lane->eps.assign(size_, nullptr);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      auto addr = store_->Get(absl::StrCat(prefix_, name, "/addr/", peer), timeout);
      if (!addr.ok()) {
        return absl::Status(addr.status().code(),
                            absl::StrCat("ucx backend: rank ", rank_, " waiting for rank ", peer,
                                         "'s worker address: ", addr.status().message()));
      }
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
      ep.address = reinterpret_cast<const ucp_address_t*>(addr->data());
      ep.err_mode = peer_mode_ ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
      if (peer_mode_) {
        ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.err_handler.cb = EndpointError;
        ep.err_handler.arg = this;
      }
      s = ucp_ep_create(lane->worker, &ep, &lane->eps[peer]);
      if (s != UCS_OK) {
        return absl::UnavailableError(
            absl::StrCat("ucx backend: rank ", rank_, " cannot reach rank ", peer, ": ",
                         ucs_status_string(s), " (check UCX_TLS / --network)"));
      }
    }
    return absl::OkStatus();
  }

  // Caller holds mu_.
  ReqState* NewState() {
    if (free_states_.empty()) {
      auto* st = new ReqState;
      st->free_list = &free_states_;
      return st;
    }
    ReqState* st = free_states_.back();
    free_states_.pop_back();
    return st;
  }

  // Idle progress calls per lock acquisition in WaitAll.
  static constexpr int kProgressPerLock = 4;
  // WaitAll passes per UCX progress call while it awaits only the channel,
  // and looks at the rings per pass without the lock.
  static constexpr unsigned kShmPassesPerUcxPoll = 16;
  static constexpr int kPeeksPerPass = 8;

  // Whether every request not done is the channel's; caller holds mu_.
  static bool OnChannel(const std::vector<TransportReq*>& reqs) {
    for (TransportReq* r : reqs) {
      if (!r->done.load(std::memory_order_relaxed) && !ShmChannel::Holds(r)) return false;
    }
    return true;
  }

  // Flow control (UcxOptions::max_bytes_ahead); caller holds mu_. Counts
  // the bytes sent to `peer` since the last synchronous send (a message
  // costs the receiver a descriptor, so at least kMessageCost); true when
  // this send reaches the limit and must be synchronous. It completes only
  // once `peer` took it, and the op waiting for it with it: a sender gets at
  // most the limit plus one message ahead of what `peer` received.
  bool SendsCatchUp(int peer, size_t bytes) {
    constexpr size_t kMessageCost = 256;
    if (max_bytes_ahead_ == 0) return false;
    bytes_ahead_[peer] += std::max(bytes, kMessageCost);
    if (bytes_ahead_[peer] < max_bytes_ahead_) return false;
    bytes_ahead_[peer] = 0;
    return true;
  }

  int rank_, size_;
  std::shared_ptr<Store> store_;
  bool peer_mode_;
  const size_t max_bytes_ahead_;
  // This world's store keys: "loom/ucx/gen<g>/" (see Init).
  std::string prefix_;
  std::mutex mu_;  // every UCX call, and everything below
  Lane lane_;
  std::vector<size_t> bytes_ahead_;  // by peer
  std::set<ReqState*> abandoned_;    // given up, still running in UCX
  std::vector<ReqState*> free_states_;  // finished, for reuse (NewState)
  bool gave_up_ = false;             // a request was given up (an op failed)
  // Every rank on this host: the small-message channel (else null). Last:
  // destroyed after the worker, whose requests' states point into it.
  std::unique_ptr<ShmChannel> shm_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> Create(int rank, int size,
                                                     std::shared_ptr<Store> store,
                                                     const UcxOptions& options) {
  if (size < 1 || size > internal::kMaxWorldSize || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("ucx backend: rank ", rank, " of world size ",
                                                   size, " is out of range"));
  }
  if (!store) return absl::InvalidArgumentError("ucx backend: a rendezvous store is required");
  if (!options.rndv_scheme.empty()) {
    setenv("UCX_RNDV_SCHEME", options.rndv_scheme.c_str(), /*overwrite=*/0);
  }
  size_t channel_bytes = options.same_host_channel_bytes;
  if (const char* v = std::getenv("LOOM_UCX_SAME_HOST_CHANNEL_BYTES"); v != nullptr && *v) {
    if (!absl::SimpleAtoi(v, &channel_bytes) || channel_bytes > kMaxSameHostChannelBytes) {
      return absl::InvalidArgumentError(absl::StrCat("LOOM_UCX_SAME_HOST_CHANNEL_BYTES='", v,
                                                     "' is not a byte count in [0, ",
                                                     kMaxSameHostChannelBytes, "]"));
    }
  }
  if (channel_bytes > kMaxSameHostChannelBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("UcxOptions::same_host_channel_bytes=", channel_bytes, " is over ",
                     kMaxSameHostChannelBytes));
  }
  auto t = std::make_shared<UcxTransport>(rank, size, store, options.peer_failure_mode,
                                          options.max_bytes_ahead);
  absl::Status s = t->Init(options.connect_timeout, options.same_host_tuning, channel_bytes);
  if (!s.ok()) return s;
  std::vector<int> members(size);
  for (int i = 0; i < size; ++i) members[i] = i;
  internal::EngineOptions eo{options.comm, options.small_bytes};
  auto world = std::make_unique<internal::Engine>(t, std::move(members), 1, eo, "ucx");
  // Wire up every endpoint before returning (and prove the peers are there).
  s = world->Barrier()->Wait();
  if (!s.ok()) return s;
  return std::unique_ptr<Communicator>(std::move(world));
}

}  // namespace loom::comm::ucx
