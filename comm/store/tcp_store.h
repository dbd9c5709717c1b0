#ifndef LOOM_COMM_STORE_TCP_STORE_H_
#define LOOM_COMM_STORE_TCP_STORE_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/store/frame.h"
#include "comm/store/memory_store.h"
#include "comm/store/store.h"

namespace loom::comm {

// Limits of rank 0's store server (the defaults of TcpStoreOptions; see
// comm/README.md "The TCP store: secret, binding, limits"). A connection over
// a limit is closed at once and logged once per peer address; the job's
// connected clients never notice.
//
// Connections open at once, handshaking or authenticated (every rank holds one).
inline constexpr int kTcpStoreMaxConnections = 4096;
// Of those, connections that have not yet proven the secret.
inline constexpr int kTcpStoreMaxHandshakes = 512;
// A connection that has not completed the handshake in this time is dropped
// (a client that connects and sends nothing). Authenticated clients may stay
// idle between calls for the whole run (they are the job's ranks).
inline constexpr absl::Duration kTcpStoreHandshakeTimeout = absl::Seconds(10);
// An authenticated client that starts a frame has this long to send the rest
// (and a reply this long to leave: a peer that stops reading is dropped).
inline constexpr absl::Duration kTcpStoreFrameTimeout = absl::Seconds(60);
// The largest request or reply: kStoreMaxFrameBytes (frame.h, 4 MiB).

struct TcpStoreOptions {
  // Rank 0's address (--master-addr / MASTER_ADDR). The server binds exactly
  // this address (a loopback address when every rank is local), never every
  // interface; it must be an address of rank 0's machine.
  std::string host = "127.0.0.1";
  int port = 29500;                // --master-port / MASTER_PORT
  bool is_server = false;          // rank 0 serves
  // The job's secret (--rendezvous-secret / LOOM_RENDEZVOUS_SECRET). Required,
  // the same on every rank; every connection proves it (auth.h) before the
  // store reads a request. Never logged.
  std::string secret;
  // How long clients retry connecting (the server may start later).
  absl::Duration connect_timeout = absl::Seconds(60);
  // How long a call waits for rank 0's reply (a Get: beyond its own timeout).
  absl::Duration reply_timeout = absl::Seconds(60);
  // The server's limits (tests lower them).
  int max_connections = kTcpStoreMaxConnections;
  int max_handshakes = kTcpStoreMaxHandshakes;
  absl::Duration handshake_timeout = kTcpStoreHandshakeTimeout;
  absl::Duration frame_timeout = kTcpStoreFrameTimeout;
  size_t max_frame_bytes = kStoreMaxFrameBytes;
};

// A store served over TCP by one process (rank 0); every rank, the server's
// included, talks to it as a client. Thread-safe.
class TcpStore : public Store {
 public:
  // Server: binds host:port (0 picks a free port, see port()) and serves
  // until destroyed. Errors name the address and the flags that set it; an
  // empty secret is an InvalidArgument naming --rendezvous-secret and
  // LOOM_RENDEZVOUS_SECRET; a server that refuses this secret (or a server
  // that cannot prove it) is PermissionDenied, at once.
  static absl::StatusOr<std::unique_ptr<TcpStore>> Create(const TcpStoreOptions& options);
  ~TcpStore() override;

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  std::string Describe() const override;
  int port() const { return port_; }

  // The server's counts of connections it closed, for tests and logs (zero on
  // a client).
  struct Refusals {
    int64_t bad_secret = 0;       // a wrong proof (wrong secret, replayed handshake)
    int64_t handshake = 0;        // no or malformed handshake within handshake_timeout
    int64_t too_many = 0;         // over max_connections or max_handshakes
    int64_t bad_frame = 0;        // a frame over max_frame_bytes, or not finished in time
  };
  Refusals refusals() const;

 private:
  class Server;
  TcpStore() = default;
  // One request and its reply, under mu_. Any failure to send or to read the
  // whole reply drops the connection; the next call reconnects.
  absl::StatusOr<std::string> Call(uint8_t cmd, const std::string& key, const std::string& arg,
                                   absl::Duration reply_within);
  // Connects fd_ to host_:port_ and proves the secret, retrying for `within`.
  absl::Status Connect(absl::Duration within);
  void Disconnect();

  std::unique_ptr<Server> server_;
  std::string host_;
  int port_ = 0;
  std::string secret_;
  size_t max_frame_bytes_ = kStoreMaxFrameBytes;
  absl::Duration connect_timeout_ = absl::Seconds(60);
  absl::Duration reply_timeout_ = absl::Seconds(60);
  absl::Duration handshake_timeout_ = kTcpStoreHandshakeTimeout;
  int fd_ = -1;  // -1 after a failed call: the next call reconnects
  std::mutex mu_;  // one request at a time on fd_
};

}  // namespace loom::comm

#endif  // LOOM_COMM_STORE_TCP_STORE_H_
