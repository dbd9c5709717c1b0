#ifndef LOOM_COMM_STORE_TCP_STORE_H_
#define LOOM_COMM_STORE_TCP_STORE_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/store/memory_store.h"
#include "comm/store/store.h"

namespace loom::comm {

struct TcpStoreOptions {
  std::string host = "127.0.0.1";  // --master-addr / MASTER_ADDR
  int port = 29500;                // --master-port / MASTER_PORT
  bool is_server = false;          // rank 0 serves
  // How long clients retry connecting (the server may start later).
  absl::Duration connect_timeout = absl::Seconds(60);
  // How long a call waits for rank 0's reply (a Get: beyond its own timeout).
  absl::Duration reply_timeout = absl::Seconds(60);
};

// A store served over TCP by one process (rank 0); every rank, the server's
// included, talks to it as a client. Thread-safe.
class TcpStore : public Store {
 public:
  // Server: binds host:port (0 picks a free port, see port()) and serves
  // until destroyed. Errors name the address and the flags that set it.
  static absl::StatusOr<std::unique_ptr<TcpStore>> Create(const TcpStoreOptions& options);
  ~TcpStore() override;

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  std::string Describe() const override;
  int port() const { return port_; }

 private:
  class Server;
  TcpStore() = default;
  // One request and its reply, under mu_. Any failure to send or to read the
  // whole reply drops the connection; the next call reconnects.
  absl::StatusOr<std::string> Call(uint8_t cmd, const std::string& key, const std::string& arg,
                                   absl::Duration reply_within);
  // Connects fd_ to host_:port_, retrying for `within`.
  absl::Status Connect(absl::Duration within);
  void Disconnect();

  std::unique_ptr<Server> server_;
  std::string host_;
  int port_ = 0;
  absl::Duration connect_timeout_ = absl::Seconds(60);
  absl::Duration reply_timeout_ = absl::Seconds(60);
  int fd_ = -1;  // -1 after a failed call: the next call reconnects
  std::mutex mu_;  // one request at a time on fd_
};

}  // namespace loom::comm

#endif  // LOOM_COMM_STORE_TCP_STORE_H_
