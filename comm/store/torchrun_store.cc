#include "comm/store/torchrun_store.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "comm/store/socket_io.h"

namespace loom::comm {
namespace {

const char kWhere[] = "(torchrun's agent store, from MASTER_ADDR/MASTER_PORT)";

template <typename T>
void Append(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

void AppendString(std::string* out, const std::string& s) {
  Append<uint64_t>(out, s.size());
  out->append(s);
}

// PyTorch's TCPStore client puts "/" before every key (TCPStore.cpp's
// keyPrefix_): so does this one, so a key is the same from either side.
void AppendKey(std::string* out, const std::string& key) {
  AppendString(out, absl::StrCat(torchrun_wire::kKeyPrefix, key));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TorchrunStore>> TorchrunStore::Connect(
    const std::string& host, int port, absl::Duration connect_timeout) {
  std::unique_ptr<TorchrunStore> store(new TorchrunStore(host, port));
  std::lock_guard<std::mutex> l(store->mu_);
  absl::Status s = store->Open(connect_timeout);
  if (!s.ok()) return s;
  return store;
}

TorchrunStore::~TorchrunStore() {
  std::lock_guard<std::mutex> l(mu_);
  Close();
}

std::string TorchrunStore::Describe() const {
  return absl::StrCat("torchrun's store ", host_, ":", port_);
}

absl::Status TorchrunStore::Open(absl::Duration within) {
  absl::StatusOr<sockaddr_in> addr = socket_io::Resolve(host_, port_, "MASTER_ADDR", kWhere);
  if (!addr.ok()) return addr.status();
  const absl::Time deadline = absl::Now() + within;
  std::string last = "timed out";
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&*addr), sizeof(*addr)) == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      std::string validate;
      Append<uint8_t>(&validate, torchrun_wire::kValidate);
      Append<uint32_t>(&validate, torchrun_wire::kValidationMagic);
      if (socket_io::WriteAll(fd, validate.data(), validate.size())) {
        fd_ = fd;
        local_address_ = socket_io::LocalAddress(fd);
        return absl::OkStatus();
      }
      last = std::strerror(errno);
    } else {
      last = std::strerror(errno);
    }
    if (fd >= 0) close(fd);
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(absl::StrCat(
          "could not connect to ", Describe(), " within ", absl::FormatDuration(within), " ",
          kWhere, ": is torchrun's agent running and reachable? last error: ", last));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

void TorchrunStore::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::Status TorchrunStore::Send(const std::string& request) {
  if (fd_ < 0) {
    absl::Status s = Open(absl::Seconds(5));
    if (!s.ok()) return s;
  }
  if (!socket_io::WriteAll(fd_, request.data(), request.size())) {
    const int err = errno;
    Close();
    return absl::UnavailableError(
        absl::StrCat(Describe(), ": lost the connection (", std::strerror(err), ")"));
  }
  return absl::OkStatus();
}

absl::Status TorchrunStore::Set(const std::string& key, const std::string& value) {
  std::string request;
  Append<uint8_t>(&request, torchrun_wire::kSet);
  AppendKey(&request, key);
  AppendString(&request, value);
  std::lock_guard<std::mutex> l(mu_);
  return Send(request);
}

absl::Status TorchrunStore::WaitLocked(const std::vector<std::string>& keys,
                                       absl::Duration timeout) {
  std::string request;
  Append<uint8_t>(&request, torchrun_wire::kWait);
  Append<uint64_t>(&request, keys.size());
  for (const std::string& k : keys) AppendKey(&request, k);
  absl::Status s = Send(request);
  if (!s.ok()) return s;
  uint8_t reply = 0xff;
  if (!socket_io::ReadAll(fd_, &reply, 1, absl::Now() + timeout, nullptr)) {
    // Timed out or the server went away: either way this connection's wait is
    // abandoned (closing it cancels the wait on the server).
    Close();
    return absl::DeadlineExceededError(absl::StrCat(
        Describe(), ": key '", keys.empty() ? "" : keys.front(), "'",
        keys.size() > 1 ? absl::StrCat(" (and ", keys.size() - 1, " more)") : "",
        " not set within ", absl::FormatDuration(timeout)));
  }
  if (reply != torchrun_wire::kStopWaiting) {
    Close();
    return absl::InternalError(
        absl::StrCat(Describe(), ": unexpected reply ", static_cast<int>(reply), " to a wait"));
  }
  return absl::OkStatus();
}

absl::Status TorchrunStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  std::lock_guard<std::mutex> l(mu_);
  return WaitLocked(keys, timeout);
}

absl::StatusOr<std::string> TorchrunStore::Get(const std::string& key, absl::Duration timeout) {
  std::lock_guard<std::mutex> l(mu_);
  absl::Status s = WaitLocked({key}, timeout);
  if (!s.ok()) return s;
  std::string request;
  Append<uint8_t>(&request, torchrun_wire::kGet);
  AppendKey(&request, key);
  s = Send(request);
  if (!s.ok()) return s;
  const absl::Time deadline = absl::Now() + reply_timeout_;
  uint64_t size = 0;
  if (!socket_io::ReadAll(fd_, &size, sizeof(size), deadline, nullptr) ||
      size > torchrun_wire::kMaxValueBytes) {
    Close();
    return absl::UnavailableError(absl::StrCat(Describe(), ": no valid reply for key '", key,
                                               "' (a value over ", torchrun_wire::kMaxValueBytes,
                                               " bytes, or the connection closed)"));
  }
  std::string value(size, '\0');
  if (size > 0 && !socket_io::ReadAll(fd_, value.data(), size, deadline, nullptr)) {
    Close();
    return absl::UnavailableError(
        absl::StrCat(Describe(), ": the connection closed while reading key '", key, "'"));
  }
  return value;
}

absl::StatusOr<int64_t> TorchrunStore::Add(const std::string& key, int64_t delta) {
  std::string request;
  Append<uint8_t>(&request, torchrun_wire::kAdd);
  AppendKey(&request, key);
  Append<int64_t>(&request, delta);
  std::lock_guard<std::mutex> l(mu_);
  absl::Status s = Send(request);
  if (!s.ok()) return s;
  int64_t value = 0;
  if (!socket_io::ReadAll(fd_, &value, sizeof(value), absl::Now() + reply_timeout_, nullptr)) {
    Close();
    return absl::UnavailableError(absl::StrCat(Describe(), ": no reply to add on key '", key, "'"));
  }
  return value;
}

}  // namespace loom::comm
