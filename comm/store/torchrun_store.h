#ifndef LOOM_COMM_STORE_TORCHRUN_STORE_H_
#define LOOM_COMM_STORE_TORCHRUN_STORE_H_

// A client of the store torchrun's agent serves on MASTER_ADDR:MASTER_PORT
// (PyTorch's c10d TCPStore; its workers are told so by
// TORCHELASTIC_USE_AGENT_STORE=True and join it as clients). The wire format
// is PyTorch's (torch/csrc/distributed/c10d/store/TCPStoreBackend.hpp and
// TCPStore.cpp), all integers in the host's byte order (little-endian on every
// machine PyTorch ships for):
//
//   first request   VALIDATE  u8 0   u32 0x3C85F7CE          (no reply)
//   set             SET       u8 1   str key  str value       (no reply)
//   get             GET       u8 3   str key                  -> str value
//   add             ADD       u8 4   str key  i64 delta       -> i64 new value
//   wait            WAIT      u8 6   u64 n  str key * n       -> u8 0 once all exist
//   str = u64 length, then the bytes; keys start with "/", as PyTorch's
//   client sends them (store.get("k") in Python reads key "/k")
//
// The server answers GET for a missing key by dropping the connection, so Get
// waits first. A wait that times out drops the connection too (the server
// forgets a closed client's waits) and the next call connects again.
//
// This store has no authentication: anyone who reaches the port reads and
// writes it. Loom uses it only to find rank 0's own store, whose handshake
// proves the job's secret in both directions (auth.h), so an impostor
// listed here cannot take part in the job (comm/launch/torchrun.h).

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/store/store.h"

namespace loom::comm {

// PyTorch's QueryType values and validation number (TCPStoreBackend.hpp).
namespace torchrun_wire {
inline constexpr uint8_t kValidate = 0;
inline constexpr uint8_t kSet = 1;
inline constexpr uint8_t kGet = 3;
inline constexpr uint8_t kAdd = 4;
inline constexpr uint8_t kWait = 6;
inline constexpr uint32_t kValidationMagic = 0x3C85F7CE;
inline constexpr uint8_t kStopWaiting = 0;
// What PyTorch's client puts before every key (TCPStore.cpp's keyPrefix_).
inline constexpr char kKeyPrefix[] = "/";
// The largest value this client accepts in a reply: the store holds addresses.
inline constexpr uint64_t kMaxValueBytes = 1 << 20;
}  // namespace torchrun_wire

class TorchrunStore : public Store {
 public:
  // Connects to host:port and validates, retrying for `connect_timeout` (the
  // agent starts its store before its workers, so normally at once). Errors
  // name the address and that it is torchrun's (MASTER_ADDR/MASTER_PORT).
  static absl::StatusOr<std::unique_ptr<TorchrunStore>> Connect(const std::string& host, int port,
                                                                absl::Duration connect_timeout);
  ~TorchrunStore() override;

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  std::string Describe() const override;

  // This machine's address on the route to the store (the interface its
  // peers reach it by when the store is on another host; 127.0.0.1 when the
  // store is local through loopback).
  const std::string& local_address() const { return local_address_; }

 private:
  TorchrunStore(std::string host, int port) : host_(std::move(host)), port_(port) {}
  absl::Status Open(absl::Duration within);  // connects and validates; mu_ held
  void Close();                              // mu_ held
  // Sends one request (connecting again first if the last call dropped the
  // connection); a failure drops the connection. mu_ held.
  absl::Status Send(const std::string& request);
  absl::Status WaitLocked(const std::vector<std::string>& keys, absl::Duration timeout);  // mu_ held

  const std::string host_;
  const int port_;
  std::string local_address_;
  absl::Duration reply_timeout_ = absl::Seconds(60);
  int fd_ = -1;
  std::mutex mu_;  // one request at a time on fd_
};

}  // namespace loom::comm

#endif  // LOOM_COMM_STORE_TORCHRUN_STORE_H_
