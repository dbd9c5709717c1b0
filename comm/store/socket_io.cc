#include "comm/store/socket_io.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace loom::comm::socket_io {

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

bool WaitReadable(int fd, absl::Time deadline, const std::atomic<bool>* stop) {
  for (;;) {
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
    if (pr > 0) return true;
  }
}

bool ReadAll(int fd, void* p, size_t n, absl::Time deadline, const std::atomic<bool>* stop) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    if (!WaitReadable(fd, deadline, stop)) return false;
    ssize_t k = recv(fd, c, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool ReadSome(int fd, std::string* buf, absl::Time deadline, const std::atomic<bool>* stop) {
  for (;;) {
    if (!WaitReadable(fd, deadline, stop)) return false;
    char tmp[16384];
    ssize_t k = recv(fd, tmp, sizeof(tmp), 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    buf->append(tmp, static_cast<size_t>(k));
    return true;
  }
}

absl::StatusOr<sockaddr_in> Resolve(const std::string& host, int port, const std::string& what,
                                    const std::string& hint) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int gai = getaddrinfo(host.c_str(), absl::StrCat(port).c_str(), &hints, &res);
  if (gai != 0 || res == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve ", what, " '", host, "' ", hint,
                                                   ": ", gai_strerror(gai)));
  }
  sockaddr_in out;
  std::memcpy(&out, res->ai_addr, sizeof(out));
  freeaddrinfo(res);
  return out;
}

std::string AddressText(const sockaddr_in& a) {
  char buf[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &a.sin_addr, buf, sizeof(buf));
  return buf;
}

std::string LocalAddress(int fd) {
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0 ||
      local.sin_family != AF_INET) {
    return "";
  }
  return AddressText(local);
}

}  // namespace loom::comm::socket_io
