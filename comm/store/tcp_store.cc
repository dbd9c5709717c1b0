#include "comm/store/tcp_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "comm/store/auth.h"
#include "comm/store/socket_io.h"

namespace loom::comm {
namespace {

using socket_io::ReadAll;
using socket_io::ReadSome;
using socket_io::WriteAll;

enum Cmd : uint8_t { kSet = 1, kGet = 2, kAdd = 3 };
enum Reply : uint8_t { kOk = 0, kTimeout = 1, kError = 2 };
const char kFlagsHint[] = "(set by --master-addr/--master-port or MASTER_ADDR/MASTER_PORT)";
const char kSecretFlags[] = "--rendezvous-secret / LOOM_RENDEZVOUS_SECRET";
// Refusals are logged for this many distinct peer addresses, then only counted.
constexpr size_t kMaxLoggedPeers = 1024;

// A reply: exactly one frame, nothing after it (a client has one request in
// flight, so more bytes mean the stream is out of step).
bool ReadReply(int fd, size_t max_frame_bytes, StoreFrame* frame, absl::Time deadline) {
  std::string buf;
  for (;;) {
    size_t used = 0;
    switch (ParseStoreFrame(buf.data(), buf.size(), max_frame_bytes, frame, &used)) {
      case StoreParse::kFrame:
        return used == buf.size();
      case StoreParse::kTooLong:
        return false;
      case StoreParse::kIncomplete:
        break;
    }
    if (!ReadSome(fd, &buf, deadline, nullptr)) return false;
  }
}

bool WriteFrame(int fd, uint8_t head, std::string_view a, std::string_view b) {
  const std::string f = EncodeStoreFrame(head, a, b);
  return WriteAll(fd, f.data(), f.size());
}

enum class Handshake { kOk, kRetry, kRefused, kServerUnproven };

// The client's half of auth.h's handshake.
Handshake ClientHandshake(int fd, const std::string& secret, absl::Time deadline,
                          std::string* why) {
  char hello[kStoreHelloBytes];
  if (!ReadAll(fd, hello, sizeof(hello), deadline, nullptr)) {
    *why = "no handshake from the server (busy, at its connection limit, or not a Loom store)";
    return Handshake::kRetry;
  }
  if (std::memcmp(hello, kStoreMagic, sizeof(kStoreMagic)) != 0) {
    *why = "the server's handshake is not a Loom TCP store's";
    return Handshake::kServerUnproven;
  }
  const std::string_view server_nonce(hello + sizeof(kStoreMagic), kStoreNonceBytes);
  absl::StatusOr<std::string> client_nonce = RandomBytes(kStoreNonceBytes);
  if (!client_nonce.ok()) {
    *why = std::string(client_nonce.status().message());
    return Handshake::kRetry;
  }
  std::string answer(kStoreMagic, sizeof(kStoreMagic));
  answer += *client_nonce;
  answer += StoreClientProof(secret, server_nonce, *client_nonce);
  if (!WriteAll(fd, answer.data(), answer.size())) {
    *why = "the server closed the connection during the handshake";
    return Handshake::kRetry;
  }
  unsigned char verdict = 0;
  if (!ReadAll(fd, &verdict, 1, deadline, nullptr)) {
    *why = "the server closed the connection during the handshake";
    return Handshake::kRetry;
  }
  if (verdict != kStoreAccepted) return Handshake::kRefused;
  std::string proof(kStoreProofBytes, '\0');
  if (!ReadAll(fd, proof.data(), proof.size(), deadline, nullptr) ||
      !StoreProofsEqual(StoreServerProof(secret, server_nonce, *client_nonce), proof)) {
    *why = "the server did not prove the job's secret";
    return Handshake::kServerUnproven;
  }
  return Handshake::kOk;
}

// Resolves `host` (IPv4) for the server's bind and the clients' connect.
absl::StatusOr<sockaddr_in> ResolveMaster(const std::string& host, int port) {
  absl::StatusOr<sockaddr_in> a = socket_io::Resolve(host, port, "master address", kFlagsHint);
  if (!a.ok()) return absl::InvalidArgumentError(absl::StrCat("TCP store: ", a.status().message()));
  return a;
}

}  // namespace

// Serves a MemoryStore: one thread per connection, each of which proves the
// secret (auth.h) before its first request is read.
class TcpStore::Server {
 public:
  explicit Server(const TcpStoreOptions& o) : options_(o) {}

  ~Server() {
    stop_ = true;
    if (listen_fd_ >= 0) shutdown(listen_fd_, SHUT_RDWR);
    if (accept_thread_.joinable()) accept_thread_.join();
    if (listen_fd_ >= 0) close(listen_fd_);
    std::lock_guard<std::mutex> l(mu_);
    for (auto& h : handlers_) h.thread.join();
  }

  // Binds the address the ranks were told (options_.host), never every
  // interface.
  absl::Status Start(int* bound_port) {
    absl::StatusOr<sockaddr_in> addr = ResolveMaster(options_.host, options_.port);
    if (!addr.ok()) return addr.status();
    const std::string ip = socket_io::AddressText(*addr);
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&*addr), sizeof(*addr)) != 0) {
      const int err = errno;
      if (err == EADDRNOTAVAIL) {
        return absl::InvalidArgumentError(absl::StrCat(
            "TCP store: rank 0 cannot listen on ", options_.host, " (", ip,
            "): it is not an address of this machine. --master-addr/MASTER_ADDR must name rank "
            "0's machine (127.0.0.1 when every rank is on this one)"));
      }
      return absl::UnavailableError(absl::StrCat("TCP store: rank 0 cannot listen on ", ip, ":",
                                                 options_.port, " ", kFlagsHint, ": ",
                                                 std::strerror(err),
                                                 "; pick another --master-port"));
    }
    if (listen(listen_fd_, 1024) != 0) {
      return absl::UnavailableError(absl::StrCat("TCP store: rank 0 cannot listen on ", ip, ":",
                                                 options_.port, ": ", std::strerror(errno)));
    }
    socklen_t len = sizeof(*addr);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&*addr), &len);
    *bound_port = ntohs(addr->sin_port);
    where_ = absl::StrCat(ip, ":", *bound_port);
    accept_thread_ = std::thread([this] { AcceptLoop(); });
    return absl::OkStatus();
  }

  Refusals refusals() const {
    Refusals r;
    r.bad_secret = bad_secret_.load();
    r.handshake = bad_handshake_.load();
    r.too_many = too_many_.load();
    r.bad_frame = bad_frame_.load();
    return r;
  }

 private:
  void AcceptLoop() {
    while (!stop_) {
      pollfd pfd{listen_fd_, POLLIN, 0};
      if (poll(&pfd, 1, 100) <= 0) {
        std::lock_guard<std::mutex> l(mu_);
        ReapFinishedLocked();
        continue;
      }
      sockaddr_in peer{};
      socklen_t plen = sizeof(peer);
      int fd = accept(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &plen);
      if (fd < 0) continue;
      const std::string ip = socket_io::AddressText(peer);
      std::unique_lock<std::mutex> l(mu_);
      ReapFinishedLocked();
      std::string over;
      if (static_cast<int>(handlers_.size()) >= options_.max_connections) {
        over = absl::StrCat(options_.max_connections, " connections already open (the limit)");
      } else if (handshakes_.load() >= options_.max_handshakes) {
        over = absl::StrCat(options_.max_handshakes,
                            " connections already proving the secret (the limit)");
      }
      if (!over.empty()) {
        l.unlock();
        ++too_many_;
        close(fd);
        LogRefusal(ip, over);
        continue;
      }
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      // A peer that stops reading cannot hold a handler in send() for longer
      // than frame_timeout: the send fails and the connection is dropped.
      const timeval send_limit = absl::ToTimeval(options_.frame_timeout);
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_limit, sizeof(send_limit));
      ++handshakes_;
      auto finished = std::make_shared<std::atomic<bool>>(false);
      handlers_.push_back({std::thread([this, fd, ip, finished] {
                             Handle(fd, ip);
                             finished->store(true);
                           }),
                           finished});
    }
  }

  // Joins the handlers whose client hung up: a long job whose clients
  // reconnect (after a failed call) would otherwise keep every dead
  // handler's thread and stack until rank 0 exits.
  void ReapFinishedLocked() {
    for (auto it = handlers_.begin(); it != handlers_.end();) {
      if (it->finished->load()) {
        it->thread.join();
        it = handlers_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Once per peer address (the first kMaxLoggedPeers addresses), to stderr.
  // Never the secret or anything the peer sent.
  void LogRefusal(const std::string& ip, const std::string& why) {
    {
      std::lock_guard<std::mutex> l(log_mu_);
      if (logged_.size() >= kMaxLoggedPeers || !logged_.insert(ip).second) return;
    }
    std::cerr << "loom: TCP store (rank 0, " << where_ << ") refused a connection from " << ip
              << ": " << why << " (later refusals from " << ip << " are not logged)"
              << std::endl;
  }

  // The server's half of auth.h's handshake, within handshake_timeout.
  bool ServerHandshake(int fd, const std::string& ip) {
    const absl::Time deadline = absl::Now() + options_.handshake_timeout;
    absl::StatusOr<std::string> nonce = RandomBytes(kStoreNonceBytes);
    if (!nonce.ok()) {
      LogRefusal(ip, std::string(nonce.status().message()));
      return false;
    }
    std::string hello(kStoreMagic, sizeof(kStoreMagic));
    hello += *nonce;
    char answer[kStoreAnswerBytes];
    if (!WriteAll(fd, hello.data(), hello.size()) ||
        !ReadAll(fd, answer, sizeof(answer), deadline, &stop_)) {
      if (!stop_) {
        ++bad_handshake_;
        LogRefusal(ip, absl::StrCat("did not complete the handshake within ",
                                    absl::FormatDuration(options_.handshake_timeout)));
      }
      return false;
    }
    if (std::memcmp(answer, kStoreMagic, sizeof(kStoreMagic)) != 0) {
      ++bad_handshake_;
      LogRefusal(ip, "not a Loom TCP store handshake");
      return false;
    }
    const std::string_view client_nonce(answer + sizeof(kStoreMagic), kStoreNonceBytes);
    const std::string_view proof(answer + sizeof(kStoreMagic) + kStoreNonceBytes,
                                 kStoreProofBytes);
    if (!StoreProofsEqual(StoreClientProof(options_.secret, *nonce, client_nonce), proof)) {
      ++bad_secret_;
      LogRefusal(ip, absl::StrCat("it did not prove the job's rendezvous secret (", kSecretFlags,
                                  ")"));
      WriteAll(fd, &kStoreRefused, 1);
      return false;
    }
    std::string verdict(1, static_cast<char>(kStoreAccepted));
    verdict += StoreServerProof(options_.secret, *nonce, client_nonce);
    return WriteAll(fd, verdict.data(), verdict.size());
  }

  void Handle(int fd, const std::string& ip) {
    const bool authenticated = ServerHandshake(fd, ip);
    --handshakes_;
    if (!authenticated) {
      close(fd);
      return;
    }
    std::string buf;  // received, not yet parsed
    absl::Time partial_since = absl::InfiniteFuture();
    for (;;) {
      StoreFrame f;
      size_t used = 0;
      const StoreParse p =
          ParseStoreFrame(buf.data(), buf.size(), options_.max_frame_bytes, &f, &used);
      if (p == StoreParse::kTooLong) {
        ++bad_frame_;
        LogRefusal(ip, absl::StrCat("a frame longer than ", options_.max_frame_bytes, " bytes"));
        break;
      }
      if (p == StoreParse::kFrame) {
        buf.erase(0, used);
        partial_since = buf.empty() ? absl::InfiniteFuture() : absl::Now();
        if (!Serve(fd, f)) break;
        continue;
      }
      // Idle between frames: wait as long as the client likes. Inside a
      // frame: frame_timeout.
      const bool was_empty = buf.empty();
      const absl::Time deadline = was_empty ? absl::InfiniteFuture()
                                            : partial_since + options_.frame_timeout;
      if (!ReadSome(fd, &buf, deadline, &stop_)) {
        if (!was_empty && !stop_ && absl::Now() >= deadline) {
          ++bad_frame_;
          LogRefusal(ip, absl::StrCat("a frame not finished within ",
                                      absl::FormatDuration(options_.frame_timeout)));
        }
        break;
      }
      if (was_empty) partial_since = absl::Now();
    }
    close(fd);
  }

  // Runs one request; false if the reply could not be sent.
  bool Serve(int fd, const StoreFrame& f) {
    if (f.head == kSet) {
      data_.Set(f.a, f.b).IgnoreError();
      return WriteFrame(fd, kOk, "", "");
    }
    if (f.head == kGet) {
      int64_t ms = 0;
      absl::SimpleAtoi(f.b, &ms);
      ms = std::clamp<int64_t>(ms, 0, int64_t{1} << 40);
      absl::Time deadline = absl::Now() + absl::Milliseconds(ms);
      absl::StatusOr<std::string> v = absl::DeadlineExceededError("");
      while (!stop_) {
        absl::Duration slice = std::min(deadline - absl::Now(), absl::Milliseconds(100));
        v = data_.Get(f.a, std::max(slice, absl::ZeroDuration()));
        if (v.ok() || absl::Now() >= deadline) break;
      }
      return v.ok() ? WriteFrame(fd, kOk, *v, "") : WriteFrame(fd, kTimeout, "", "");
    }
    if (f.head == kAdd) {
      int64_t d = 0;
      absl::SimpleAtoi(f.b, &d);
      absl::StatusOr<int64_t> v = data_.Add(f.a, d);
      return v.ok() ? WriteFrame(fd, kOk, absl::StrCat(*v), "")
                    : WriteFrame(fd, kError, std::string(v.status().message()), "");
    }
    return WriteFrame(fd, kError, "unknown command", "");
  }

  const TcpStoreOptions options_;
  std::string where_;  // the bound address, for logs
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread accept_thread_;
  struct Handler {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> finished;
  };
  std::mutex mu_;
  std::vector<Handler> handlers_;
  std::atomic<int> handshakes_{0};  // connections not yet authenticated
  std::atomic<int64_t> bad_secret_{0}, bad_handshake_{0}, too_many_{0}, bad_frame_{0};
  std::mutex log_mu_;
  std::set<std::string> logged_;  // peer addresses whose refusal was logged
  MemoryStore data_;
};

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::Create(const TcpStoreOptions& o) {
  if (o.port < 0 || o.port > 65535 || (o.port == 0 && !o.is_server)) {
    return absl::InvalidArgumentError(absl::StrCat("TCP store: port ", o.port,
                                                   " is not a valid port ", kFlagsHint));
  }
  if (o.secret.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TCP store: no rendezvous secret. Every connection to rank 0's store proves the job's "
        "secret: the launcher (--nproc-per-node) makes one for the ranks it starts; ranks "
        "started otherwise (torchrun, mpirun, Slurm, by hand) need the same "
        "--rendezvous-secret or LOOM_RENDEZVOUS_SECRET on every rank (make one with "
        "`openssl rand -hex 32`)"));
  }
  std::unique_ptr<TcpStore> store(new TcpStore());
  store->host_ = o.host;
  store->port_ = o.port;
  store->secret_ = o.secret;
  store->max_frame_bytes_ = o.max_frame_bytes;
  store->reply_timeout_ = o.reply_timeout;
  store->handshake_timeout_ = o.handshake_timeout;
  if (o.is_server) {
    store->server_ = std::make_unique<Server>(o);
    absl::Status s = store->server_->Start(&store->port_);
    if (!s.ok()) return s;
  }
  store->connect_timeout_ = o.connect_timeout;
  absl::Status s = store->Connect(o.connect_timeout);
  if (!s.ok()) return s;
  return store;
}

TcpStore::Refusals TcpStore::refusals() const {
  return server_ ? server_->refusals() : Refusals{};
}

absl::Status TcpStore::Connect(absl::Duration within) {
  absl::StatusOr<sockaddr_in> addr = ResolveMaster(host_, port_);
  if (!addr.ok()) return addr.status();
  absl::Time deadline = absl::Now() + within;
  std::string last = "timed out";
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, reinterpret_cast<sockaddr*>(&*addr), sizeof(*addr)) == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      // A short `within` (a reconnect) still gives a slow server a second.
      const absl::Time handshake_by = std::min(
          absl::Now() + handshake_timeout_, std::max(deadline, absl::Now() + absl::Seconds(1)));
      const Handshake h = ClientHandshake(fd, secret_, handshake_by, &last);
      if (h == Handshake::kOk) {
        fd_ = fd;
        return absl::OkStatus();
      }
      close(fd);
      if (h == Handshake::kRefused) {
        return absl::PermissionDeniedError(absl::StrCat(
            "TCP store at ", host_, ":", port_, " refused this process's rendezvous secret: "
            "every rank of a job needs the same ", kSecretFlags,
            " (the launcher passes its own to the ranks it starts)"));
      }
      if (h == Handshake::kServerUnproven) {
        return absl::PermissionDeniedError(absl::StrCat(
            "TCP store: the process at ", host_, ":", port_, " is not this job's rank 0 (", last,
            "); check ", kFlagsHint, " and that every rank has the same ", kSecretFlags));
      }
    } else {
      last = std::strerror(errno);
      close(fd);
    }
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(absl::StrCat(
          "TCP store: could not connect to ", host_, ":", port_, " within ",
          absl::FormatDuration(within), " ", kFlagsHint,
          "; is rank 0 running and reachable? last error: ", last));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

TcpStore::~TcpStore() {
  Disconnect();
  server_.reset();
}

std::string TcpStore::Describe() const { return absl::StrCat("TCP store ", host_, ":", port_); }

absl::StatusOr<std::string> TcpStore::Call(uint8_t cmd, const std::string& key,
                                           const std::string& arg, absl::Duration reply_within) {
  if (kStoreFrameOverhead + key.size() + arg.size() > max_frame_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        Describe(), ": key '", key.substr(0, 200), "' with a value of ", arg.size(),
        " bytes is over the store's frame limit of ", max_frame_bytes_,
        " bytes (kStoreMaxFrameBytes): the store is for addresses, not data"));
  }
  std::lock_guard<std::mutex> l(mu_);
  if (fd_ < 0) {
    // The last call failed mid-stream and dropped its connection; rank 0 was
    // up then, so it gets one short try.
    absl::Status s = Connect(std::min(connect_timeout_, absl::Seconds(1)));
    if (!s.ok()) {
      return absl::UnavailableError(absl::StrCat(Describe(), ": lost the connection to rank 0 ",
                                                 "and could not reconnect: ", s.message()));
    }
  }
  // A failed write or read leaves the stream at an unknown point (a late
  // reply may still arrive and would answer the next request), so the
  // connection is dropped and the next call starts a new one.
  if (!WriteFrame(fd_, cmd, key, arg)) {
    const int err = errno;
    Disconnect();
    return absl::UnavailableError(absl::StrCat(Describe(), ": lost the connection to rank 0 (",
                                               std::strerror(err), ")"));
  }
  StoreFrame reply;
  if (!ReadReply(fd_, max_frame_bytes_, &reply, absl::Now() + reply_within)) {
    Disconnect();
    return absl::UnavailableError(absl::StrCat(Describe(), ": no reply from rank 0 for key '", key,
                                               "' within ", absl::FormatDuration(reply_within),
                                               " (did it exit?)"));
  }
  if (reply.head == kTimeout) return absl::DeadlineExceededError("timeout");
  if (reply.head != kOk) return absl::InternalError(absl::StrCat(Describe(), ": ", reply.a));
  return std::move(reply.a);
}

void TcpStore::Disconnect() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::Status TcpStore::Set(const std::string& key, const std::string& value) {
  return Call(kSet, key, value, reply_timeout_).status();
}

absl::StatusOr<std::string> TcpStore::Get(const std::string& key, absl::Duration timeout) {
  absl::StatusOr<std::string> v =
      Call(kGet, key, absl::StrCat(absl::ToInt64Milliseconds(timeout)), timeout + reply_timeout_);
  if (absl::IsDeadlineExceeded(v.status())) {
    return absl::DeadlineExceededError(absl::StrCat(Describe(), ": key '", key,
                                                    "' not set within ",
                                                    absl::FormatDuration(timeout)));
  }
  return v;
}

absl::StatusOr<int64_t> TcpStore::Add(const std::string& key, int64_t delta) {
  absl::StatusOr<std::string> v = Call(kAdd, key, absl::StrCat(delta), reply_timeout_);
  if (!v.ok()) return v.status();
  int64_t out = 0;
  if (!absl::SimpleAtoi(*v, &out)) return absl::InternalError("TCP store: bad Add reply");
  return out;
}

absl::Status TcpStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  for (const auto& k : keys) {
    absl::StatusOr<std::string> v = Get(k, std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!v.ok()) return v.status();
  }
  return absl::OkStatus();
}

}  // namespace loom::comm
