#include "comm/store/tcp_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace loom::comm {
namespace {

enum Cmd : uint8_t { kSet = 1, kGet = 2, kAdd = 3 };
enum Reply : uint8_t { kOk = 0, kTimeout = 1, kError = 2 };
const char kFlagsHint[] = "(set by --master-addr/--master-port or MASTER_ADDR/MASTER_PORT)";

bool WriteAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// Reads exactly n bytes; gives up at `deadline` or when `stop` is set.
bool ReadAll(int fd, void* p, size_t n, absl::Time deadline, const std::atomic<bool>* stop) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    if (stop && *stop) return false;
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    pollfd pfd{fd, POLLIN, 0};
    // Slices of at most 100 ms so `stop` is noticed, and never 0 ms: an
    // infinite `left` once overflowed to 0 here and every idle connection's
    // handler spun on a core (the stalls seen in comm/bench on 2 cores).
    const int ms = static_cast<int>(std::clamp<int64_t>(
        absl::ToInt64Milliseconds(std::min(left, absl::Milliseconds(100))) + 1, 1, 100));
    int pr = poll(&pfd, 1, ms);
    if (pr < 0 && errno != EINTR) return false;
    if (pr <= 0) continue;
    ssize_t k = recv(fd, c, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool WriteFrame(int fd, uint8_t head, const std::string& a, const std::string& b) {
  uint32_t la = static_cast<uint32_t>(a.size()), lb = static_cast<uint32_t>(b.size());
  std::string buf;
  buf.push_back(static_cast<char>(head));
  buf.append(reinterpret_cast<const char*>(&la), 4);
  buf.append(a);
  buf.append(reinterpret_cast<const char*>(&lb), 4);
  buf.append(b);
  return WriteAll(fd, buf.data(), buf.size());
}

bool ReadFrame(int fd, uint8_t* head, std::string* a, std::string* b, absl::Time deadline,
               const std::atomic<bool>* stop) {
  uint32_t la, lb;
  if (!ReadAll(fd, head, 1, deadline, stop) || !ReadAll(fd, &la, 4, deadline, stop)) return false;
  if (la > (64u << 20)) return false;
  a->resize(la);
  if (!ReadAll(fd, a->data(), la, deadline, stop) || !ReadAll(fd, &lb, 4, deadline, stop)) {
    return false;
  }
  if (lb > (64u << 20)) return false;
  b->resize(lb);
  return ReadAll(fd, b->data(), lb, deadline, stop);
}

}  // namespace

// Serves a MemoryStore: one thread per connection.
class TcpStore::Server {
 public:
  ~Server() {
    stop_ = true;
    if (listen_fd_ >= 0) shutdown(listen_fd_, SHUT_RDWR);
    if (accept_thread_.joinable()) accept_thread_.join();
    if (listen_fd_ >= 0) close(listen_fd_);
    std::lock_guard<std::mutex> l(mu_);
    for (auto& h : handlers_) h.thread.join();
  }

  absl::Status Start(const std::string& host, int port, int* bound_port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(listen_fd_, 1024) != 0) {
      return absl::UnavailableError(absl::StrCat("TCP store: rank 0 cannot listen on port ",
                                                 port, " ", kFlagsHint, ": ",
                                                 std::strerror(errno),
                                                 "; pick another --master-port"));
    }
    socklen_t len = sizeof(addr);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    *bound_port = ntohs(addr.sin_port);
    accept_thread_ = std::thread([this] { AcceptLoop(); });
    return absl::OkStatus();
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
      int fd = accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) continue;
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      std::lock_guard<std::mutex> l(mu_);
      ReapFinishedLocked();
      auto finished = std::make_shared<std::atomic<bool>>(false);
      handlers_.push_back({std::thread([this, fd, finished] {
                             Handle(fd);
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

  void Handle(int fd) {
    for (;;) {
      uint8_t cmd;
      std::string key, arg;
      if (!ReadFrame(fd, &cmd, &key, &arg, absl::InfiniteFuture(), &stop_)) break;
      bool ok = true;
      if (cmd == kSet) {
        data_.Set(key, arg).IgnoreError();
        ok = WriteFrame(fd, kOk, "", "");
      } else if (cmd == kGet) {
        int64_t ms = 0;
        absl::SimpleAtoi(arg, &ms);
        absl::Time deadline = absl::Now() + absl::Milliseconds(ms);
        absl::StatusOr<std::string> v = absl::DeadlineExceededError("");
        while (!stop_) {
          absl::Duration slice = std::min(deadline - absl::Now(), absl::Milliseconds(100));
          v = data_.Get(key, std::max(slice, absl::ZeroDuration()));
          if (v.ok() || absl::Now() >= deadline) break;
        }
        ok = v.ok() ? WriteFrame(fd, kOk, *v, "") : WriteFrame(fd, kTimeout, "", "");
      } else if (cmd == kAdd) {
        int64_t d = 0;
        absl::SimpleAtoi(arg, &d);
        absl::StatusOr<int64_t> v = data_.Add(key, d);
        ok = v.ok() ? WriteFrame(fd, kOk, absl::StrCat(*v), "")
                    : WriteFrame(fd, kError, std::string(v.status().message()), "");
      } else {
        ok = WriteFrame(fd, kError, "unknown command", "");
      }
      if (!ok) break;
    }
    close(fd);
  }

  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread accept_thread_;
  struct Handler {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> finished;
  };
  std::mutex mu_;
  std::vector<Handler> handlers_;
  MemoryStore data_;
};

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::Create(const TcpStoreOptions& o) {
  if (o.port < 0 || o.port > 65535 || (o.port == 0 && !o.is_server)) {
    return absl::InvalidArgumentError(absl::StrCat("TCP store: port ", o.port,
                                                   " is not a valid port ", kFlagsHint));
  }
  std::unique_ptr<TcpStore> store(new TcpStore());
  store->host_ = o.host;
  store->port_ = o.port;
  store->reply_timeout_ = o.reply_timeout;
  if (o.is_server) {
    store->server_ = std::make_unique<Server>();
    absl::Status s = store->server_->Start(o.host, o.port, &store->port_);
    if (!s.ok()) return s;
  }
  store->connect_timeout_ = o.connect_timeout;
  absl::Status s = store->Connect(o.connect_timeout);
  if (!s.ok()) return s;
  return store;
}

absl::Status TcpStore::Connect(absl::Duration within) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int gai = getaddrinfo(host_.c_str(), absl::StrCat(port_).c_str(), &hints, &res);
  if (gai != 0) {
    return absl::InvalidArgumentError(absl::StrCat("TCP store: cannot resolve master address '",
                                                   host_, "' ", kFlagsHint, ": ",
                                                   gai_strerror(gai)));
  }
  absl::Time deadline = absl::Now() + within;
  std::string last = "timed out";
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      fd_ = fd;
      break;
    }
    last = std::strerror(errno);
    close(fd);
    if (absl::Now() >= deadline) {
      freeaddrinfo(res);
      return absl::UnavailableError(absl::StrCat(
          "TCP store: could not connect to ", host_, ":", port_, " within ",
          absl::FormatDuration(within), " ", kFlagsHint,
          "; is rank 0 running and reachable? last error: ", last));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  freeaddrinfo(res);
  return absl::OkStatus();
}

TcpStore::~TcpStore() {
  Disconnect();
  server_.reset();
}

std::string TcpStore::Describe() const { return absl::StrCat("TCP store ", host_, ":", port_); }

absl::StatusOr<std::string> TcpStore::Call(uint8_t cmd, const std::string& key,
                                           const std::string& arg, absl::Duration reply_within) {
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
  uint8_t head;
  std::string a, b;
  if (!ReadFrame(fd_, &head, &a, &b, absl::Now() + reply_within, nullptr)) {
    Disconnect();
    return absl::UnavailableError(absl::StrCat(Describe(), ": no reply from rank 0 for key '", key,
                                               "' within ", absl::FormatDuration(reply_within),
                                               " (did it exit?)"));
  }
  if (head == kTimeout) return absl::DeadlineExceededError("timeout");
  if (head != kOk) return absl::InternalError(absl::StrCat(Describe(), ": ", a));
  return a;
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
