#ifndef LOOM_CONFIG_FAULT_SPEC_H_
#define LOOM_CONFIG_FAULT_SPEC_H_

// Test only: makes one rank of a real job fail in a chosen way at a chosen
// iteration, so the restart machinery (comm/launch/launcher.h: the agent,
// heartbeats, LOOM_RESTART_COUNT; the trainer's resume from --save) can be
// tested end to end from a shell script, or makes it slow, so --log-straggler
// (train/straggler.h) has a straggler to name. Driven by one environment
// variable:
//
//   LOOM_FAULT=rank=R,iteration=N,kind=K[,ms=M][,attempt=A][;rank=...,...]
//
//   rank       global rank that fails (0 <= R < world size)
//   iteration  1 <= N <= --train-iters: the fault fires as rank R starts the
//              training step that makes the iteration N (the step logged as
//              "iteration N/..."), or, for kind=save, in the checkpoint save
//              at iteration N (which --save-interval, an --exit-* flag or the
//              end of training must cause)
//   kind       exit        the process exits with status 3
//              sigkill     the process raises SIGKILL
//              hang        the rank stops beating and sleeps forever (a
//                          deadlock: only the agent's heartbeat finds it;
//                          SIGTERM still ends the process unless
//                          --exit-signal-handler is on, SIGKILL always)
//              collective  the rank issues a barrier on the world that no
//                          other rank joins: every rank then fails with the
//                          collective timeout (--distributed-timeout-minutes)
//              save        SIGKILL in the middle of writing this rank's
//                          shard file (half of it on disk, the checkpoint
//                          not committed: `latest` still names the previous one)
//              slow        the rank sleeps M ms inside the forward-backward of
//                          step N and of every later step (a slow GPU: the
//                          compute --log-straggler measures); announced once
//   ms         kind=slow only (and required there): the delay per step,
//              1 <= M <= 3600000
//   attempt    the start it fires in: LOOM_RESTART_COUNT (comm::launch::
//              RestartCount()) must equal A; default 0 (the first start only,
//              so the restarted job does not fail again); `any`: every start
//
// Several faults are separated by ';'. Keys may come in any order; spaces are
// not allowed. Every fault prints one line to stderr as it fires
// ("loom: LOOM_FAULT fires: rank=1 iteration=5 kind=sigkill attempt=0";
// kind=slow once, at its first slowed step).
// A malformed value is an error naming LOOM_FAULT (Finalize, before any work).
// Unset or empty: no fault, and nothing is checked per step but an empty vector.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom::train {

constexpr char kFaultVariable[] = "LOOM_FAULT";

enum class FaultKind { kExit, kSigkill, kHang, kCollective, kSave, kSlow };
const char* FaultKindName(FaultKind kind);  // "exit", "sigkill", ...

struct Fault {
  static constexpr int kAnyAttempt = -1;
  int global_rank = 0;
  int64_t iteration = 1;
  FaultKind kind = FaultKind::kExit;
  int attempt = 0;  // the RestartCount() it fires in, or kAnyAttempt
  int64_t delay_ms = 0;  // kind=slow: ms=M
  // "rank=1 iteration=5 kind=sigkill attempt=0" ("... kind=slow ms=300 attempt=0").
  std::string Describe() const;
};

// The value of LOOM_FAULT ("" when unset).
std::string FaultSpecFromEnvironment();

// Parses a LOOM_FAULT value ("" gives none). Errors name LOOM_FAULT, the
// part that is wrong and the syntax.
absl::StatusOr<std::vector<Fault>> ParseFaults(absl::string_view spec);

// ParseFaults, and every fault possible in this run: rank < world_size,
// iteration <= train_iters (a fault that could never fire is a script's bug).
absl::Status ValidateFaults(absl::string_view spec, int world_size, int64_t train_iters);

}  // namespace loom::train

#endif  // LOOM_CONFIG_FAULT_SPEC_H_
