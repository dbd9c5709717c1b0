#include "comm/flight/recorder.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/flight/dump.h"

namespace loom::comm::flight {

namespace detail {
std::atomic<uint64_t> g_now_us{1};
std::atomic<Sink*> g_sink{nullptr};
}  // namespace detail

void SetSink(Sink* sink) { detail::g_sink.store(sink, std::memory_order_release); }

namespace {

const char* const kOpNames[kNumOpKinds] = {
    "all_reduce", "broadcast",    "reduce", "all_gather", "reduce_scatter", "all_to_all",
    "all_to_all_v", "barrier", "send",       "recv",       "batch_send_recv",
};

// The SIGUSR1 pipe's write end, for the handler (a lock-free atomic: safe in
// a signal handler; -1 until the registry made the pipe).
std::atomic<int> g_signal_fd{-1};
static_assert(std::atomic<int>::is_always_lock_free);

uint64_t MonotonicUs() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000 + static_cast<uint64_t>(t.tv_nsec) / 1000;
}

// The process's live recorders, the clock's thread and the SIGUSR1 pipe.
// Never destroyed (its thread may run while the process exits).
class Registry {
 public:
  static Registry& Get() {
    static Registry* r = new Registry();
    return *r;
  }

  void Add(Recorder* r) {
    bool wake;
    {
      std::lock_guard<std::mutex> l(mu_);
      Tick();  // the first ops of a new communicator get a fresh time
      wake = live_.empty();
      live_[r] = next_order_++;
      if (!r->info().dir.empty()) InstallSignalHandlerLocked();
      if (!thread_started_) {
        thread_started_ = true;
        std::thread([this] { Loop(); }).detach();
      }
    }
    if (wake) Wake('r');
  }
  void Remove(Recorder* r) {
    std::lock_guard<std::mutex> l(mu_);
    live_.erase(r);
  }

  // Dumps every rank of the process with a folder (mu_ keeps recorders alive).
  absl::StatusOr<std::vector<std::string>> Dump(const std::string& reason) {
    std::lock_guard<std::mutex> dl(dump_mu_);  // one dump at a time
    Tick();
    std::lock_guard<std::mutex> l(mu_);
    // (dir, world rank) -> its recorders, in creation order.
    std::map<std::pair<std::string, int>, std::vector<Recorder*>> ranks;
    std::vector<std::pair<uint64_t, Recorder*>> ordered;  // creation order
    for (auto& [r, order] : live_) ordered.push_back({order, r});
    std::sort(ordered.begin(), ordered.end());
    for (auto& [order, r] : ordered) {
      if (!r->info().dir.empty()) ranks[{r->info().dir, r->info().world_rank}].push_back(r);
    }
    std::vector<std::string> written;
    absl::Status first;
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    for (auto& [key, recs] : ranks) {
      RankDump d;
      d.world_rank = key.second;
      d.pid = static_cast<int>(getpid());
      d.host = host;
      d.reason = reason;
      d.dump_us = NowUs();
      d.dump_unix_us = absl::ToUnixMicros(absl::Now());
      d.tick_us = static_cast<uint64_t>(absl::ToInt64Microseconds(kTick));
      for (Recorder* r : recs) {
        CommDump c;
        c.info = r->info();
        c.info.entries = static_cast<int>(r->capacity());
        c.info.dir.clear();
        c.issued = r->issued();
        c.records = r->Snapshot();
        d.comms.push_back(std::move(c));
      }
      const std::string path = DumpPath(key.first, key.second);
      absl::Status s = WriteFileAtomically(path, FormatDump(d));
      if (s.ok()) {
        written.push_back(path);
      } else if (first.ok()) {
        first = s;
      }
    }
    if (!first.ok()) return first;
    return written;
  }

 private:
  Registry() {
    if (pipe2(pipe_, O_CLOEXEC | O_NONBLOCK) != 0) pipe_[0] = pipe_[1] = -1;
    g_signal_fd.store(pipe_[1]);
  }

  static void Tick() {
    static const uint64_t epoch = MonotonicUs() - 1;
    // Stored only forward: two threads ticking at once never move it back.
    const uint64_t now = MonotonicUs() - epoch;
    uint64_t seen = detail::g_now_us.load(std::memory_order_relaxed);
    while (seen < now && !detail::g_now_us.compare_exchange_weak(seen, now)) {
    }
  }

  void Wake(char c) {
    if (pipe_[1] >= 0) {
      ssize_t n = write(pipe_[1], &c, 1);
      (void)n;
    }
  }

  static void OnSignal(int) {
    const int saved = errno;
    const int fd = g_signal_fd.load(std::memory_order_relaxed);
    if (fd >= 0) {
      char c = 'u';
      ssize_t n = write(fd, &c, 1);  // async-signal-safe
      (void)n;
    }
    errno = saved;
  }

  void InstallSignalHandlerLocked() {
    if (handler_installed_ || pipe_[1] < 0) return;
    handler_installed_ = true;
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_handler = &Registry::OnSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, nullptr);
  }

  // Ticks the clock every kTick while any recorder lives (sleeps otherwise)
  // and dumps on SIGUSR1.
  void Loop() {
    const int tick_ms = static_cast<int>(absl::ToInt64Milliseconds(kTick));
    for (;;) {
      bool any;
      {
        std::lock_guard<std::mutex> l(mu_);
        any = !live_.empty();
      }
      pollfd p{pipe_[0], POLLIN, 0};
      int rc = poll(&p, pipe_[0] >= 0 ? 1 : 0, any ? tick_ms : -1);
      Tick();
      if (rc <= 0 || !(p.revents & POLLIN)) continue;
      char buf[64];
      bool dump = false;
      ssize_t n;
      while ((n = read(pipe_[0], buf, sizeof(buf))) > 0) {
        dump = dump || std::memchr(buf, 'u', static_cast<size_t>(n)) != nullptr;
      }
      if (!dump) continue;
      auto written = Dump("SIGUSR1");
      if (!written.ok()) {
        std::fprintf(stderr, "flight recorder: SIGUSR1 dump failed: %s\n",
                     std::string(written.status().message()).c_str());
      } else {
        for (const std::string& f : *written) {
          std::fprintf(stderr, "flight recorder: SIGUSR1: wrote %s\n", f.c_str());
        }
      }
    }
  }

  std::mutex mu_;
  std::mutex dump_mu_;
  std::map<Recorder*, uint64_t> live_;  // -> creation order
  uint64_t next_order_ = 0;
  bool thread_started_ = false;
  bool handler_installed_ = false;
  int pipe_[2] = {-1, -1};
};

uint64_t RoundUpPow2(int n) {
  uint64_t c = 1;
  while (c < static_cast<uint64_t>(std::min(std::max(n, 1), kMaxEntries))) c <<= 1;
  return c;
}

}  // namespace

const char* OpKindName(OpKind kind) {
  const int i = static_cast<int>(kind);
  return i >= 0 && i < kNumOpKinds ? kOpNames[i] : "unknown";
}

bool ParseOpKind(const std::string& name, OpKind* kind) {
  for (int i = 0; i < kNumOpKinds; ++i) {
    if (name == kOpNames[i]) {
      *kind = static_cast<OpKind>(i);
      return true;
    }
  }
  return false;
}

Recorder::Recorder(CommInfo info)
    : info_(std::move(info)),
      mask_(RoundUpPow2(info_.entries) - 1),
      slots_(new Slot[mask_ + 1]) {}

std::shared_ptr<Recorder> Recorder::Create(CommInfo info) {
  std::shared_ptr<Recorder> r(new Recorder(std::move(info)));
  Registry::Get().Add(r.get());
  return r;
}

Recorder::~Recorder() {
  Registry::Get().Remove(this);
}

std::vector<Record> Recorder::Snapshot() const {
  std::vector<Record> out;
  const uint64_t end = next_id_.load(std::memory_order_acquire);
  const uint64_t cap = mask_ + 1;
  const uint64_t begin = end > cap ? end - cap : 0;
  out.reserve(end - begin);
  for (uint64_t id = begin; id < end; ++id) {
    const Slot& s = slots_[id & mask_];
    const uint64_t h1 = s.header.load(std::memory_order_acquire);
    Record r;
    // Acquire loads (Issue's stores release): if one reads a later op's
    // field, that op's header 0 is visible to the h2 load after them.
    r.seq = s.seq.load(std::memory_order_acquire);
    r.bytes = s.bytes.load(std::memory_order_acquire);
    const int64_t pt = s.peer_tag.load(std::memory_order_acquire);
    r.issued_us = s.issued.load(std::memory_order_acquire);
    const uint64_t h2 = s.header.load(std::memory_order_relaxed);
    // Being rewritten, or already reused for a later op.
    if (h1 != h2 || h1 == 0 || (h1 >> 16) != id + 1) continue;
    r.id = id;
    r.kind = static_cast<OpKind>((h1 >> 8) & 0xff);
    r.dtype = static_cast<core::DType>(h1 & 0xff);
    r.peer = static_cast<int32_t>(static_cast<uint64_t>(pt) >> 32);
    r.tag = static_cast<int32_t>(static_cast<uint32_t>(pt));
    const uint64_t time_mask = (uint64_t{1} << kTimeBits) - 1;
    // A stamp of this id (not of the slot's previous ops: other id bits, or,
    // 2^16 ops back, a time before this op's issue).
    auto mine = [&](uint64_t stamp) {
      return stamp != 0 && (stamp >> 48) == (id & 0xffff) && (stamp & time_mask) >= r.issued_us;
    };
    const uint64_t st = s.started.load(std::memory_order_relaxed);
    if (mine(st)) r.started_us = st & time_mask;
    const uint64_t co = s.completed.load(std::memory_order_acquire);
    if (mine(co)) {
      r.completed_us = co & time_mask;
      r.failed = (co >> kTimeBits) & 1;
      // Completion implies a start (an op rejected before it ran has none).
      if (r.started_us == 0) r.started_us = r.completed_us;
    }
    out.push_back(r);
  }
  return out;
}

void Recorder::FailureDump(const absl::Status& why) {
  if (info_.dir.empty()) return;
  auto written = Registry::Get().Dump(std::string(why.message()));
  if (!written.ok()) {
    std::fprintf(stderr, "flight recorder: dump after a failure of group '%s' failed: %s\n",
                 info_.group.c_str(), std::string(written.status().message()).c_str());
    return;
  }
  for (const std::string& f : *written) {
    std::fprintf(stderr, "flight recorder: wrote %s (group '%s' failed)\n", f.c_str(),
                 info_.group.c_str());
  }
}

absl::StatusOr<std::vector<std::string>> DumpProcess(const std::string& reason) {
  return Registry::Get().Dump(reason);
}

std::string DumpPath(const std::string& dir, int world_rank) {
  return absl::StrCat(dir, "/rank", world_rank, ".pid", getpid(), ".jsonl");
}

}  // namespace loom::comm::flight
