#ifndef LOOM_COMM_FLIGHT_RECORDER_H_
#define LOOM_COMM_FLIGHT_RECORDER_H_

// The collective flight recorder (issue #16): every communicator keeps a ring
// of its last operations, and on a timeout, an abort or SIGUSR1 each rank
// writes the rings of its communicators to a file (dump.h), which
// `bazel run //comm:flight -- DIR` reads for all ranks (analyze.h).
//
// Recording is always on and costs a few nanoseconds per operation (figures:
// BENCHMARKS.md, //comm/flight:bench):
//  * The ring is preallocated (capacity rounded up to a power of two), one
//    64-byte cache line per entry; recording is plain (relaxed atomic) stores:
//    no allocation, no lock, no system call.
//  * Time is a process-wide coarse clock: microseconds of CLOCK_MONOTONIC
//    stored every kTick by the recorder's own thread, read with one relaxed
//    load (0.3 ns here, against 5.7 ns for CLOCK_MONOTONIC_COARSE through the
//    vDSO, 10 ns for rdtsc and 24 ns for CLOCK_MONOTONIC; three reads per
//    collective would otherwise alone be 2-4% of a 4-byte UCX all-reduce).
//    Timestamps are thus accurate to kTick (plus scheduling delay of that
//    thread on a loaded machine): enough to say which rank stopped and how
//    long ago, not to time an operation.
//  * Issue writes the entry under a per-entry sequence lock (its header word
//    is zero while written); start and completion each write one word that
//    carries 16 bits of the entry's id, so a late write for an entry the ring
//    has since reused, or the stamp of the slot's previous op, is ignored by
//    readers (the ring holds at most kMaxEntries < 2^16 entries).
//
// Threads: Issue is called by the thread that issues operations on the
// communicator (one at a time, comm.h); Start and Complete by any thread;
// Snapshot and the dumps by any thread, concurrently with all of them.
//
// Dumps (only when CommOptions::flight_recorder_dir is set): the process
// keeps a registry of its live recorders. A failure (FailureDump) or SIGUSR1
// writes, for every rank of this process whose recorders have a folder, one
// file with all that rank's communicators (the world and its Split children):
// "<dir>/rank<world rank>.pid<pid>.jsonl", atomically (temp file + rename; a
// later dump of the same rank and process replaces it). The SIGUSR1 handler
// only writes a byte to a pipe (async-signal-safe); the recorder's thread
// does the dump. It is installed when the first recorder with a folder is
// created, and stays. Two worlds alive in one process that share a folder
// overwrite each other's files: give each world its own folder.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/dtype.h"

namespace loom::comm::flight {

// What an entry records. Collectives and point-to-point ops are numbered in
// two sequences (comm.h): IsPointToPoint tells which.
enum class OpKind : uint8_t {
  kAllReduce = 0,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kAllToAllV,
  kBarrier,
  kSend,
  kRecv,
  kBatchSendRecv,
};
constexpr int kNumOpKinds = 11;
const char* OpKindName(OpKind kind);  // "all_reduce", ... (comm.h's descriptions)
bool ParseOpKind(const std::string& name, OpKind* kind);
inline bool IsPointToPoint(OpKind k) { return k >= OpKind::kSend; }

// The most entries a ring keeps (2 MiB): stamps carry 16 bits of the id.
constexpr int kMaxEntries = 1 << 15;

// The clock's period (see above).
constexpr absl::Duration kTick = absl::Milliseconds(10);

// Microseconds since the process's recorder epoch (>= 1), as of the last tick.
inline uint64_t NowUs();

// One operation as read back (Snapshot, dumps). Times are NowUs() values;
// 0 = not (yet) started / completed.
struct Record {
  uint64_t id = 0;    // position in this communicator's ring (0, 1, ...)
  OpKind kind = OpKind::kAllReduce;
  uint64_t seq = 0;   // "all_reduce #seq" (the collective or point-to-point sequence)
  core::DType dtype = core::DType::kU8;
  uint64_t bytes = 0;  // bytes of the op's input (batch: of all legs)
  int peer = -1;       // root (broadcast, reduce) or peer (send, recv), group rank; -1 none
  int tag = -1;        // send, recv: the tag; else -1
  uint64_t issued_us = 0, started_us = 0, completed_us = 0;
  bool failed = false;  // completed with an error
};

// Who a recorder belongs to (written into dumps).
struct CommInfo {
  std::string group;    // CommOptions::group_name ("world", "tp", ...)
  std::string backend;  // "local", "ucx", "mpi", "nccl"
  int world_rank = 0;   // this process's rank in the world the group came from
  int group_rank = 0;
  int group_size = 1;
  std::vector<int> members;  // world ranks of group ranks 0..n-1; empty: unknown
  int entries = 2048;  // CommOptions::flight_recorder_entries (rounded up to 2^k, <= kMaxEntries)
  std::string dir;           // CommOptions::flight_recorder_dir ("": never dumped)
};

// An optional observer of every recorder's operations in this process (a
// profiler: profile/profiler.h). None is installed by default, and then
// Issue and Complete pay one load and a not-taken branch each. Installed, it
// is called from the thread that issues an op (OnIssue, after the entry is
// written) and from the thread that completes it (OnComplete, which may come
// twice for a failed op, or for an op issued before the sink was installed:
// an implementation ignores ids it does not know). It must be thread-safe and
// outlive its installation; calls already running may finish after
// SetSink(nullptr) returns, so a sink is never destroyed (a process-wide
// object).
class Sink {
 public:
  virtual ~Sink() = default;
  virtual void OnIssue(const CommInfo& info, uint64_t id, OpKind kind, uint64_t seq,
                       core::DType dtype, uint64_t bytes, int peer, int tag) = 0;
  virtual void OnComplete(const CommInfo& info, uint64_t id, bool ok) = 0;
};
// Installs `sink` for every recorder of the process (null: none).
void SetSink(Sink* sink);

class Recorder {
 public:
  // Registers the recorder with the process (for dumps) and starts the
  // clock's thread if it is not running.
  static std::shared_ptr<Recorder> Create(CommInfo info);
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // Records an op when it is issued; returns its id for Start/Complete.
  uint64_t Issue(OpKind kind, uint64_t seq, core::DType dtype, uint64_t bytes, int peer = -1,
                 int tag = -1);
  void Start(uint64_t id);
  void Complete(uint64_t id, bool ok);

  // What the ring holds now, oldest first (entries being written are left out).
  std::vector<Record> Snapshot() const;
  // Ops issued so far (ids below issued() - capacity() are gone).
  uint64_t issued() const { return next_id_.load(std::memory_order_acquire); }
  uint64_t capacity() const { return mask_ + 1; }
  const CommInfo& info() const { return info_; }

  // On a failure of this communicator (a timeout, an abort): if it has a
  // folder, writes the dumps of this process now (this thread), each naming
  // `why`. Errors go to stderr (a dump never changes the op's outcome).
  void FailureDump(const absl::Status& why);

 private:
  struct alignas(64) Slot {
    std::atomic<uint64_t> header{0};  // (id + 1) << 16 | kind << 8 | dtype; 0 while written
    std::atomic<uint64_t> seq{0};
    std::atomic<uint64_t> bytes{0};
    std::atomic<int64_t> peer_tag{0};  // peer << 32 | (uint32) tag
    std::atomic<uint64_t> issued{0};
    std::atomic<uint64_t> started{0};    // Stamp(id, t)
    std::atomic<uint64_t> completed{0};  // Stamp(id, t) | failed << 47
  };
  static constexpr int kTimeBits = 47;  // µs: 4.4 years
  static uint64_t Stamp(uint64_t id, uint64_t t) {
    return (id & 0xffff) << 48 | (t & ((uint64_t{1} << kTimeBits) - 1));
  }

  explicit Recorder(CommInfo info);

  const CommInfo info_;
  const uint64_t mask_;
  std::unique_ptr<Slot[]> slots_;
  std::atomic<uint64_t> next_id_{0};  // written by the issuing thread only
};

// Writes the dumps of every rank of this process that has a folder, naming
// `reason` ("SIGUSR1", a status). Returns the files written, or the first
// error. For tests and tools; failures and SIGUSR1 call it themselves.
absl::StatusOr<std::vector<std::string>> DumpProcess(const std::string& reason);

// The file a rank of this process writes into `dir`.
std::string DumpPath(const std::string& dir, int world_rank);

// ------------------------------------------------------------------ inline

namespace detail {
extern std::atomic<uint64_t> g_now_us;
extern std::atomic<Sink*> g_sink;
}  // namespace detail

inline uint64_t NowUs() { return detail::g_now_us.load(std::memory_order_relaxed); }

inline uint64_t Recorder::Issue(OpKind kind, uint64_t seq, core::DType dtype, uint64_t bytes,
                                int peer, int tag) {
  const uint64_t id = next_id_.load(std::memory_order_relaxed);
  Slot& s = slots_[id & mask_];
  // Sequence lock: readers skip the slot while its header is 0. The fields
  // are release stores (Snapshot's loads acquire), so a reader that sees one
  // of them sees the 0 before it too; not a release fence, which
  // ThreadSanitizer cannot model (GCC's -Wtsan). On x86 the same moves.
  s.header.store(0, std::memory_order_relaxed);
  s.seq.store(seq, std::memory_order_release);
  s.bytes.store(bytes, std::memory_order_release);
  s.peer_tag.store(static_cast<int64_t>(static_cast<uint64_t>(static_cast<uint32_t>(peer)) << 32 |
                                        static_cast<uint32_t>(tag)),
                   std::memory_order_release);
  s.issued.store(NowUs(), std::memory_order_release);
  // started/completed keep the slot's previous op's stamps: their id bits
  // (and times before `issued`) tell readers they are stale (two fewer stores).
  s.header.store((id + 1) << 16 | uint64_t{static_cast<uint8_t>(kind)} << 8 |
                     static_cast<uint8_t>(dtype),
                 std::memory_order_release);
  next_id_.store(id + 1, std::memory_order_release);
  if (Sink* sink = detail::g_sink.load(std::memory_order_acquire)) {
    sink->OnIssue(info_, id, kind, seq, dtype, bytes, peer, tag);
  }
  return id;
}

inline void Recorder::Start(uint64_t id) {
  slots_[id & mask_].started.store(Stamp(id, NowUs()), std::memory_order_relaxed);
}

inline void Recorder::Complete(uint64_t id, bool ok) {
  slots_[id & mask_].completed.store(Stamp(id, NowUs()) | uint64_t{!ok} << kTimeBits,
                                     std::memory_order_release);
  if (Sink* sink = detail::g_sink.load(std::memory_order_acquire)) sink->OnComplete(info_, id, ok);
}

}  // namespace loom::comm::flight

#endif  // LOOM_COMM_FLIGHT_RECORDER_H_
