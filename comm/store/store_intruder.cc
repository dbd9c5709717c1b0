// A foreign client for //tests:store_intruder_test: hammers a job's TCP
// store (rank 0's, comm/store/tcp_store.h) with connections that do not know
// the job's secret, and checks that every one is closed without a request
// ever being answered. Round-robin, for --seconds:
//
//   garbage       random bytes, or an unauthenticated request frame
//   wrong secret  a complete handshake (auth.h) with a wrong secret, then a Get
//   replay        a recorded legitimate handshake answer and Get, byte for byte
//                 (--secret is used only to record that one session, as an
//                 eavesdropper on the wire would have seen it)
//   silent        connect, read the hello, send nothing (the server must drop
//                 it within its handshake timeout; watched in the background)
//   oversize      a frame announcing ~4 GiB, streaming its first 64 KiB
//
// The only bytes the server may send such a connection are its hello and the
// one-byte "refused" verdict. Anything else (an "accepted" verdict, a reply)
// means a request got in: prints "intruder: GOT IN: ..." and exits 1. A
// connection the server leaves open past its limits is "NOT CLOSED" (exit 1).
// Otherwise prints the counts and exits 0. Waits for the server to come up
// (retrying connect) and stops early once it has gone away (the job ended).
//
//   store_intruder --host=127.0.0.1 --port=P --seconds=30 [--secret=S]
//                  [--sources=3]   (source addresses 127.0.0.1 .. 127.0.0.N)
//                  [--pause-ms=10] (between attempts)

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/store/auth.h"
#include "comm/store/frame.h"
#include "comm/store/tcp_store.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "The store's IPv4 address.");
ABSL_FLAG(int, port, 0, "The store's port (the job's --master-port).");
ABSL_FLAG(double, seconds, 30, "How long to keep attacking (waiting for the server included).");
ABSL_FLAG(std::string, secret, "",
          "The job's secret, used only to record one legitimate handshake to replay.");
ABSL_FLAG(int, sources, 1,
          "Connect from 127.0.0.1 .. 127.0.0.N in turn (loopback servers only).");
ABSL_FLAG(int, pause_ms, 10, "Pause between attempts (leave the job some CPU).");
ABSL_FLAG(double, gone_seconds, 3,
          "Stop early once the server, after being up, refuses connections this long.");

namespace loom::comm {
namespace {

enum Kind { kGarbage, kWrongSecret, kReplay, kSilent, kOversize, kKinds };
const char* const kKindNames[kKinds] = {"garbage", "wrong secret", "replay", "silent", "oversize"};
constexpr uint8_t kCmdSet = 1, kCmdGet = 2;

// How long a connection that sent its (wrong) bytes may stay open: the server
// refuses at once, so this is only slack for two busy cores.
constexpr absl::Duration kPromptClose = absl::Seconds(15);
// A silent connection: the server's handshake timeout plus slack.
const absl::Duration kSilentClose = kTcpStoreHandshakeTimeout + absl::Seconds(15);
// At most this many silent connections open at once (we are not a flood).
constexpr size_t kMaxSilent = 4;

[[noreturn]] void Fail(const std::string& what) {
  std::printf("intruder: %s\n", what.c_str());
  std::fflush(stdout);
  std::exit(1);
}

struct Target {
  sockaddr_in addr{};
  int sources = 1;
  int next_source = 0;
};

// A connected socket, or -1 (nobody listening yet, or any other error).
int Connect(Target& t) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (t.sources > 1) {
    sockaddr_in src{};
    src.sin_family = AF_INET;
    src.sin_addr.s_addr = htonl(0x7f000001u + static_cast<uint32_t>(t.next_source));
    t.next_source = (t.next_source + 1) % t.sources;
    if (bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof(src)) != 0) {
      close(fd);
      return -1;
    }
  }
  if (connect(fd, reinterpret_cast<sockaddr*>(&t.addr), sizeof(t.addr)) != 0) {
    close(fd);
    return -1;
  }
  // A server that stops reading cannot hold us in send().
  const timeval limit{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
  return fd;
}

bool SendAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t k = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;  // the server closed (or reset) it: fine
    off += static_cast<size_t>(k);
  }
  return true;
}

// Reads into *got until the server closes the connection (EOF or reset:
// true), `want` bytes are in (if want > 0: true), or `within` passes (false).
bool Read(int fd, std::string* got, absl::Duration within, size_t want = 0) {
  const absl::Time deadline = absl::Now() + within;
  while (want == 0 || got->size() < want) {
    const absl::Duration left = deadline - absl::Now();
    pollfd pfd{fd, POLLIN, 0};
    // One poll even when `within` is zero (a non-blocking look).
    const int ms = static_cast<int>(
        std::clamp<int64_t>(absl::ToInt64Milliseconds(left) + 1, 0, 100));
    const int pr = poll(&pfd, 1, left <= absl::ZeroDuration() ? 0 : ms);
    if (pr < 0 && errno != EINTR) return true;
    if (pr <= 0) {
      if (left <= absl::ZeroDuration()) return false;
      continue;
    }
    char buf[4096];
    const size_t n = want == 0 ? sizeof(buf) : std::min(sizeof(buf), want - got->size());
    const ssize_t k = recv(fd, buf, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return true;
    got->append(buf, static_cast<size_t>(k));
  }
  return true;
}

bool IsHello(const std::string& got) {
  return got.size() >= kStoreHelloBytes && std::memcmp(got.data(), kStoreMagic, 8) == 0;
}

// What the server sent a connection that never proved the secret, checked:
// nothing, or its hello, then nothing or the "refused" verdict.
void CheckRefused(Kind kind, const std::string& got, bool closed) {
  std::string after = got;
  if (IsHello(got)) {
    after = got.substr(kStoreHelloBytes);
  } else if (!got.empty() && got.size() < kStoreHelloBytes &&
             std::memcmp(got.data(), kStoreMagic, std::min<size_t>(got.size(), 8)) == 0) {
    after.clear();  // a hello cut short by the server's close
  }
  if (!after.empty() && !(after.size() == 1 && after[0] == static_cast<char>(kStoreRefused))) {
    if (after[0] == static_cast<char>(kStoreAccepted)) {
      Fail(absl::StrCat("GOT IN: ", kKindNames[kind],
                        ": the server accepted the handshake (verdict 0) and sent ", after.size(),
                        " bytes after its hello"));
    }
    Fail(absl::StrCat("GOT IN: ", kKindNames[kind], ": the server sent ", after.size(),
                      " unexpected bytes after its hello (first byte ",
                      static_cast<int>(static_cast<unsigned char>(after[0])), ")"));
  }
  if (!closed) {
    Fail(absl::StrCat("NOT CLOSED: a ", kKindNames[kind], " connection was still open after ",
                      absl::FormatDuration(kind == kSilent ? kSilentClose : kPromptClose)));
  }
}

// The client's answer to `hello` with `secret` (auth.h).
std::string Answer(const std::string& hello, const std::string& secret) {
  const std::string client_nonce = *RandomBytes(kStoreNonceBytes);
  return std::string(kStoreMagic, 8) + client_nonce +
         StoreClientProof(secret, hello.substr(8, kStoreNonceBytes), client_nonce);
}

std::string GetFrame(const std::string& key) { return EncodeStoreFrame(kCmdGet, key, "0"); }

struct Silent {
  int fd;
  absl::Time opened;
  std::string got;
};

int Main() {
  Target t;
  t.addr.sin_family = AF_INET;
  t.addr.sin_port = htons(static_cast<uint16_t>(absl::GetFlag(FLAGS_port)));
  if (absl::GetFlag(FLAGS_port) <= 0 ||
      inet_pton(AF_INET, absl::GetFlag(FLAGS_host).c_str(), &t.addr.sin_addr) != 1) {
    std::printf("intruder: needs --host=IPv4 and --port=P\n");
    return 2;
  }
  t.sources = std::max(1, absl::GetFlag(FLAGS_sources));
  const std::string secret = absl::GetFlag(FLAGS_secret);
  const absl::Time start = absl::Now();
  const absl::Time end = start + absl::Seconds(absl::GetFlag(FLAGS_seconds));
  // No new silent connection once it could outlive the window.
  const absl::Time last_silent = end - (kTcpStoreHandshakeTimeout + absl::Seconds(1));
  const absl::Duration gone_after = absl::Seconds(absl::GetFlag(FLAGS_gone_seconds));
  std::mt19937_64 rng(std::random_device{}());

  // Wait for the server, then record one legitimate session (an answer and a
  // Get), byte for byte what a listener on the wire would have seen.
  std::string recorded;
  for (;;) {
    if (absl::Now() >= end) {
      std::printf("intruder: the server at %s:%d never came up within %gs\n",
                  absl::GetFlag(FLAGS_host).c_str(), absl::GetFlag(FLAGS_port),
                  absl::GetFlag(FLAGS_seconds));
      return 2;
    }
    int fd = Connect(t);
    if (fd < 0) {
      absl::SleepFor(absl::Milliseconds(50));
      continue;
    }
    std::string hello;
    Read(fd, &hello, absl::Seconds(10), kStoreHelloBytes);
    if (!IsHello(hello)) {  // at a limit, or not up yet: try again
      close(fd);
      absl::SleepFor(absl::Milliseconds(50));
      continue;
    }
    if (secret.empty()) {  // nothing to record: replay a made-up session
      recorded = Answer(hello, "no-secret-to-record") + GetFrame("loom/intruder/replay");
      close(fd);
      break;
    }
    recorded = Answer(hello, secret) + GetFrame("loom/intruder/replay");
    SendAll(fd, recorded);
    std::string verdict;
    Read(fd, &verdict, absl::Seconds(10), 1 + kStoreProofBytes);
    close(fd);
    if (verdict.empty() || verdict[0] != static_cast<char>(kStoreAccepted)) {
      std::printf("intruder: the server refused --secret: nothing to record\n");
      return 2;
    }
    break;
  }
  std::printf("intruder: server up after %.1fs; recorded a %zu-byte session to replay\n",
              absl::ToDoubleSeconds(absl::Now() - start), recorded.size());
  std::fflush(stdout);

  int64_t count[kKinds] = {};
  std::vector<Silent> silent;
  // Closes what the server closed among the silent connections; checks the rest.
  auto reap_silent = [&](bool wait) {
    for (size_t i = 0; i < silent.size();) {
      Silent& s = silent[i];
      const absl::Duration left = s.opened + kSilentClose - absl::Now();
      const bool closed = Read(s.fd, &s.got, wait ? std::max(left, absl::ZeroDuration())
                                                  : absl::ZeroDuration());
      if (closed || left <= absl::ZeroDuration()) {
        CheckRefused(kSilent, s.got, closed);
        close(s.fd);
        ++count[kSilent];
        silent.erase(silent.begin() + static_cast<long>(i));
      } else {
        if (!s.got.empty()) CheckRefused(kSilent, s.got, true);  // bytes beyond the hello
        ++i;
      }
    }
  };

  absl::Time refused_since = absl::InfiniteFuture();
  std::string gone;
  const absl::Duration pause = absl::Milliseconds(absl::GetFlag(FLAGS_pause_ms));
  for (int64_t i = 0; absl::Now() < end; ++i) {
    if (i > 0) absl::SleepFor(pause);
    reap_silent(false);
    Kind kind = static_cast<Kind>(i % kKinds);
    if (kind == kSilent && (silent.size() >= kMaxSilent || absl::Now() >= last_silent)) continue;
    const int fd = Connect(t);
    if (fd < 0) {
      const absl::Time now = absl::Now();
      if (refused_since == absl::InfiniteFuture()) refused_since = now;
      if (now - refused_since >= gone_after) {
        gone = absl::StrFormat(" (the server went away after %.1fs: the job ended)",
                               absl::ToDoubleSeconds(refused_since - start));
        break;
      }
      absl::SleepFor(absl::Milliseconds(50));
      --i;  // the same kind again
      continue;
    }
    refused_since = absl::InfiniteFuture();
    std::string got;
    bool closed = false;
    switch (kind) {
      case kGarbage: {
        std::string bytes;
        if (i % 2 == 0) {
          bytes.resize(64 + rng() % 200);
          for (char& c : bytes) c = static_cast<char>(rng());
          if (bytes[0] == 'L') bytes[0] = 'l';  // never the magic by chance
        } else {  // a request, no handshake (past the answer's 72 bytes)
          bytes = EncodeStoreFrame(kCmdSet, "loom/intruder/garbage", std::string(100, 'x'));
        }
        SendAll(fd, bytes);
        closed = Read(fd, &got, kPromptClose);
        break;
      }
      case kWrongSecret:
      case kReplay: {
        if (!Read(fd, &got, kPromptClose, kStoreHelloBytes) || !IsHello(got)) {
          closed = Read(fd, &got, kPromptClose);  // refused before the hello (a limit)
          break;
        }
        const std::string bytes =
            kind == kReplay ? recorded
                            : Answer(got, absl::StrCat("wrong-secret-", i)) +
                                  GetFrame("loom/intruder/guess");
        SendAll(fd, bytes);
        closed = Read(fd, &got, kPromptClose);
        break;
      }
      case kSilent:
        silent.push_back({fd, absl::Now(), ""});
        continue;  // counted when the server drops it
      case kOversize: {
        std::string header(1, static_cast<char>(kCmdSet));
        header += std::string(4, '\xff');  // len_a: 4 GiB - 1
        SendAll(fd, header + std::string(64 << 10, 'o'));
        closed = Read(fd, &got, kPromptClose);
        break;
      }
      case kKinds:
        break;
    }
    CheckRefused(kind, got, closed);
    close(fd);
    ++count[kind];
  }
  reap_silent(true);

  int64_t total = 0;
  for (int64_t c : count) total += c;
  std::printf("intruder: %lld attempts, 0 got in (garbage %lld, wrong secret %lld, replay %lld, "
              "silent %lld, oversize %lld) in %.1fs%s\n",
              static_cast<long long>(total), static_cast<long long>(count[kGarbage]),
              static_cast<long long>(count[kWrongSecret]), static_cast<long long>(count[kReplay]),
              static_cast<long long>(count[kSilent]), static_cast<long long>(count[kOversize]),
              absl::ToDoubleSeconds(absl::Now() - start), gone.c_str());
  return 0;
}

}  // namespace
}  // namespace loom::comm

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return loom::comm::Main();
}
