#ifndef LOOM_PROFILE_CHROME_TRACE_H_
#define LOOM_PROFILE_CHROME_TRACE_H_

// Chrome trace-event JSON (what chrome://tracing and ui.perfetto.dev open):
// {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}} with
// complete events {"ph": "X", "pid": rank, "tid": lane, "name", "cat", "ts"
// (µs), "dur" (µs), "args": {...}} and metadata events naming each process
// ("rank R") and thread (the track: "main", "comm tp", ...).
//
// Tracks and lanes: a span is recorded on a named track. Spans of one track
// that overlap without nesting (two bucket reductions in flight on "comm dp")
// would be drawn wrong on one Chrome thread, so FormatTrace spreads a track
// over lanes, each its own tid ("comm dp", "comm dp #2", ...): within a lane
// every pair of spans is disjoint or nested.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::profile {

// One span ("ph": "X").
struct Event {
  std::string name;
  std::string cat;    // compute | p2p | comm | optimizer | data | checkpoint | step | schedule
  std::string track;  // the thread it is drawn on (lanes added when formatted)
  double ts_us = 0;   // start, µs on the rank's clock
  double dur_us = 0;
  std::string args;   // a JSON object ("" = none), e.g. {"bytes":4096,"group":"dp"}
  int pid = 0;        // the rank (merged traces); set by FormatTrace from RankTrace::rank
};

// What one rank recorded between --profile-step-start and --profile-step-end.
struct RankTrace {
  int rank = 0;
  std::string label;  // the process's name ("" = "rank R")
  std::string host;
  // This rank's CLOCK_MONOTONIC (µs) right after the world barrier that
  // opened the window: ranks of different hosts are aligned on it.
  double sync_us = 0;
  int64_t step_start = 0, step_end = 0;
  std::vector<Event> events;
};

// One rank's trace as Chrome JSON (timestamps on its own clock).
std::string FormatRankTrace(const RankTrace& trace);
// Reads FormatRankTrace's output back; errors name `file`.
absl::StatusOr<RankTrace> ParseRankTrace(const std::string& json, const std::string& file);

// Every rank's events in one trace: one pid per rank, times in µs since the
// earliest sync point of rank 0's host. Ranks on rank 0's host share its
// CLOCK_MONOTONIC and keep their times; a rank on another host is shifted so
// that its sync point falls on rank 0's, i.e. aligned at the barrier
// (accurate to the barrier's exit skew).
std::string FormatMergedTrace(const std::vector<RankTrace>& ranks);

// The complete events of any trace this package writes, with each event's
// track set to its thread's name and pid kept; sorted by (pid, ts).
struct ParsedTrace {
  std::vector<Event> events;
  std::vector<std::pair<int, std::string>> processes;  // pid, process_name
};
absl::StatusOr<ParsedTrace> ParseTrace(const std::string& json, const std::string& file);

// Lanes: for spans of one track (any order), lane[i] such that within a lane
// spans are disjoint or nested. Exposed for tests.
std::vector<int> AssignLanes(const std::vector<Event>& spans);

// A JSON string literal (quotes included) of `s`.
std::string JsonString(const std::string& s);

}  // namespace loom::profile

#endif  // LOOM_PROFILE_CHROME_TRACE_H_
