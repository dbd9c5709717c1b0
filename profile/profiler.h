#ifndef LOOM_PROFILE_PROFILER_H_
#define LOOM_PROFILE_PROFILER_H_

// One rank's profile of a window of training steps (Megatron's --profile,
// --profile-step-start A, --profile-step-end B: the steps that begin with A
// .. B-1 iterations completed), written as a Chrome trace (chrome_trace.h).
//
// What records spans:
//  * the trainer's timers (train/timers.h): each timer's start/stop is also a
//    span while the window is open, on the "main" track (forward-compute and
//    backward-compute per micro-batch and chunk, the pipeline's p2p batches,
//    batch-generator, all-grads-sync, optimizer, save-checkpoint, ...);
//  * every communicator op of this rank, from comm's flight recorder
//    (comm/flight/recorder.h Sink): issue to completion, on the track "comm
//    <group>", with op, bytes, dtype, group, sequence number, the group's world
//    ranks and (point to point) the peer's world rank. The sink is installed
//    while a Profiler exists: otherwise comm pays one null check per op.
//
// The trainer opens the window before step A + 1 (1-based, as logged) and
// closes it once B iterations are done, after that step's log line,
// evaluation and checkpoint (so they are in the trace too), or at the end of
// training if that comes first. Close (collective over the world): each rank
// writes <dir>/rank-<R>.json, a barrier, then rank 0 reads them all and
// writes <dir>/trace.json (FormatMergedTrace: one pid per rank). Ranks on
// other hosts need <dir> on a shared file system; a rank file rank 0 cannot
// read is named in Close's log line and left out.
//
// Threads: AddSpan and the comm callbacks from any thread; the window calls
// (BeforeStep, AfterStep, Close) from the rank's training thread.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "comm/comm.h"
#include "comm/flight/recorder.h"
#include "profile/chrome_trace.h"

namespace loom::profile {

struct ProfileOptions {
  std::string dir;           // --profile-dir (created if missing)
  int64_t step_start = 10;   // --profile-step-start (Megatron's default)
  int64_t step_end = 12;     // --profile-step-end
};

// CLOCK_MONOTONIC in µs (the clock every span uses).
double NowUs();

class Profiler {
 public:
  // `world_rank` names this rank's ops in the comm sink (CommInfo::world_rank).
  static absl::StatusOr<std::unique_ptr<Profiler>> Create(const ProfileOptions& options,
                                                          int world_rank);
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // The window is open: spans are kept.
  bool active() const { return active_.load(std::memory_order_relaxed); }
  // Collective over `world` when it opens the window: call before every step
  // with the iterations completed so far. At step_start: a barrier, the sync
  // time, the window opens.
  absl::Status BeforeStep(int64_t iteration, comm::Communicator* world);
  // After every step with the iterations completed now; at step_end: Close.
  // `log` gets rank 0's line naming the merged file.
  absl::Status AfterStep(int64_t iteration, comm::Communicator* world,
                         const std::function<void(const std::string&)>& log);
  // Closes an open window (training ended inside it): see the top. No-op
  // when closed.
  absl::Status Close(comm::Communicator* world,
                     const std::function<void(const std::string&)>& log);

  // A span [start_us, end_us) on `track` (kept only while active()).
  void AddSpan(std::string name, std::string cat, std::string track, double start_us,
               double end_us, std::string args = "");

  // The spans so far (tests).
  std::vector<Event> events() const;
  const ProfileOptions& options() const { return options_; }
  int world_rank() const { return world_rank_; }
  bool closed() const { return closed_; }

  // comm/flight Sink callbacks (the process-wide sink dispatches by rank).
  void OnCommIssue(const comm::flight::CommInfo& info, uint64_t id, comm::flight::OpKind kind,
                   uint64_t seq, core::DType dtype, uint64_t bytes, int peer, int tag);
  void OnCommComplete(const comm::flight::CommInfo& info, uint64_t id, bool ok);

 private:
  Profiler(ProfileOptions options, int world_rank)
      : options_(std::move(options)), world_rank_(world_rank) {}

  struct PendingOp {
    double issued_us = 0;
    comm::flight::OpKind kind{};
    uint64_t seq = 0;
    core::DType dtype{};
    uint64_t bytes = 0;
    int peer = -1;
    int tag = -1;
  };

  const ProfileOptions options_;
  const int world_rank_;
  std::atomic<bool> active_{false};
  bool closed_ = false;
  double sync_us_ = 0;
  // The spans, compact: names interned, arguments in one pool, capacity
  // reserved when the window opens. A span is then no allocation of its own:
  // small allocations kept across steps fragment the heap that the next
  // step's tensors come from (each pinned a freed activation block: +190
  // MB/s per rank with a std::string-holding Event per span).
  struct Span {
    uint32_t name, cat, track;  // into strings_
    double ts_us, dur_us;
    uint64_t args_begin;  // into args_
    uint32_t args_len;
  };
  uint32_t InternLocked(const std::string& s);
  void AddLocked(const std::string& name, const std::string& cat, const std::string& track,
                 double ts_us, double dur_us, const std::string& args);
  std::vector<Event> EventsLocked() const;

  mutable std::mutex mu_;
  std::vector<Span> spans_;
  std::vector<std::string> strings_;
  absl::flat_hash_map<std::string, uint32_t> string_ids_;
  std::string args_;
  std::map<std::pair<const comm::flight::CommInfo*, uint64_t>, PendingOp> pending_;
};

}  // namespace loom::profile

#endif  // LOOM_PROFILE_PROFILER_H_
