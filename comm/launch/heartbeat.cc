#include "comm/launch/heartbeat.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace loom::comm::launch {
namespace {

// The page both sides map. Lock-free atomics on shared memory are
// address-free on x86-64 and aarch64 (static_asserts below).
struct Page {
  std::atomic<uint64_t> beats;
  std::atomic<int64_t> iteration;
  std::atomic<uint32_t> phase;
  std::atomic<int64_t> at_unix_ns;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<int64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);
constexpr size_t kPageBytes = 4096;

absl::StatusOr<void*> MapPage(int fd) {
  void* p = mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    return absl::UnavailableError(absl::StrCat("heartbeat page: mmap: ", std::strerror(errno)));
  }
  return p;
}

// This process's page: mapped on first use from LOOM_HEARTBEAT_FD (nullptr:
// no agent is watching, or the page cannot be mapped; beats are then dropped).
Page* OwnPage() {
  static Page* page = [] () -> Page* {
    const char* v = std::getenv("LOOM_HEARTBEAT_FD");
    int fd = -1;
    if (v == nullptr || !absl::SimpleAtoi(v, &fd) || fd < 0) return nullptr;
    absl::StatusOr<void*> p = MapPage(fd);
    return p.ok() ? static_cast<Page*>(*p) : nullptr;
  }();
  return page;
}

}  // namespace

const char* PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kStarting: return "starting";
    case Phase::kSetup: return "setup";
    case Phase::kTrain: return "training step";
    case Phase::kEval: return "evaluation";
    case Phase::kSave: return "checkpoint save";
    case Phase::kExiting: return "exiting";
  }
  return "unknown";
}

void Beat(int64_t iteration, Phase phase) {
  Page* p = OwnPage();
  if (p == nullptr) return;
  p->iteration.store(iteration, std::memory_order_relaxed);
  p->phase.store(static_cast<uint32_t>(phase), std::memory_order_relaxed);
  p->at_unix_ns.store(absl::GetCurrentTimeNanos(), std::memory_order_relaxed);
  p->beats.fetch_add(1, std::memory_order_release);
}

absl::StatusOr<std::unique_ptr<HeartbeatPage>> HeartbeatPage::Create() {
  // No MFD_CLOEXEC: the ranks the agent starts inherit it.
  const int fd = memfd_create("loom-heartbeat", 0);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("heartbeat page: memfd_create: ",
                                               std::strerror(errno)));
  }
  if (ftruncate(fd, kPageBytes) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("heartbeat page: ftruncate: ", std::strerror(err)));
  }
  absl::StatusOr<void*> p = MapPage(fd);
  if (!p.ok()) {
    close(fd);
    return p.status();
  }
  std::unique_ptr<HeartbeatPage> page(new HeartbeatPage());
  page->fd_ = fd;
  page->page_ = *p;
  page->Reset();
  return page;
}

HeartbeatPage::~HeartbeatPage() {
  if (page_ != nullptr) munmap(page_, kPageBytes);
  if (fd_ >= 0) close(fd_);
}

HeartbeatReading HeartbeatPage::Read() const {
  const Page* p = static_cast<const Page*>(page_);
  HeartbeatReading r;
  r.beats = p->beats.load(std::memory_order_acquire);
  r.iteration = p->iteration.load(std::memory_order_relaxed);
  r.phase = static_cast<Phase>(p->phase.load(std::memory_order_relaxed));
  r.at_unix_ns = p->at_unix_ns.load(std::memory_order_relaxed);
  return r;
}

void HeartbeatPage::Reset() {
  Page* p = static_cast<Page*>(page_);
  p->beats.store(0, std::memory_order_relaxed);
  p->iteration.store(0, std::memory_order_relaxed);
  p->at_unix_ns.store(0, std::memory_order_relaxed);
  p->phase.store(static_cast<uint32_t>(Phase::kStarting), std::memory_order_release);
}

}  // namespace loom::comm::launch
