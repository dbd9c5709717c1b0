#ifndef LOOM_COMM_STORE_SOCKET_IO_H_
#define LOOM_COMM_STORE_SOCKET_IO_H_

// Blocking socket reads and writes with deadlines, shared by the stores that
// talk TCP: Loom's own (tcp_store.h) and the client of torchrun's agent store
// (torchrun_store.h). Every wait is bounded: a peer that stops sending never
// holds a caller past its deadline.

#include <netinet/in.h>

#include <atomic>
#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace loom::comm::socket_io {

// Writes all n bytes (MSG_NOSIGNAL: a closed peer is an error, not SIGPIPE).
bool WriteAll(int fd, const void* p, size_t n);

// Waits until fd is readable; false at `deadline`, when `stop` (may be null)
// is set, or on a poll error.
bool WaitReadable(int fd, absl::Time deadline, const std::atomic<bool>* stop);

// Reads exactly n bytes; false on EOF, an error, `deadline` or `stop`.
bool ReadAll(int fd, void* p, size_t n, absl::Time deadline, const std::atomic<bool>* stop);

// Appends what is available (at least one byte) to *buf; false on EOF, an
// error, `deadline` or `stop`.
bool ReadSome(int fd, std::string* buf, absl::Time deadline, const std::atomic<bool>* stop);

// Resolves `host` (a name or an IPv4 address) to an IPv4 socket address.
// The error says which address it was for: "<what> '<host>' <hint>: <reason>".
absl::StatusOr<sockaddr_in> Resolve(const std::string& host, int port, const std::string& what,
                                    const std::string& hint);

// "10.0.0.1" (the address only).
std::string AddressText(const sockaddr_in& a);

// The local address of a connected socket: the interface this machine uses
// to reach the peer ("" on error).
std::string LocalAddress(int fd);

}  // namespace loom::comm::socket_io

#endif  // LOOM_COMM_STORE_SOCKET_IO_H_
