#ifndef LOOM_COMM_FLIGHT_DUMP_H_
#define LOOM_COMM_FLIGHT_DUMP_H_

// The flight recorder's dump file: one per rank and process,
// "<dir>/rank<world rank>.pid<pid>.jsonl", JSON lines (one object a line):
//
//   {"type":"loom_flight","version":1,"world_rank":1,"pid":4242,"host":"node7",
//    "reason":"all_reduce #57 in group 'dp' ... timed out ...",
//    "dump_us":81234567,"dump_unix_us":1764842400123456,"tick_us":10000}
//   {"type":"comm","comm":0,"group":"world","backend":"ucx","world_rank":1,
//    "group_rank":1,"group_size":4,"members":[0,1,2,3],"capacity":2048,"issued":58}
//   {"type":"op","comm":0,"id":57,"op":"all_reduce","seq":57,"dtype":"f32",
//    "bytes":4096,"peer":-1,"tag":-1,"issued_us":81230001,"started_us":81230001,
//    "completed_us":0,"state":"started"}
//
// The header comes first; each "comm" line precedes its "op" lines, which
// are oldest first. Times are microseconds of the dumping process's
// monotonic clock (recorder.h, NowUs): compare them with that file's
// "dump_us" only ("completed 12.3 s before the dump"), never across files.
// "members" lists the group's world ranks (empty: unknown to the backend).
// "state": issued | started | completed | failed. "issued" counts every op
// the communicator recorded; ids below issued - capacity were overwritten.
// Unknown keys are ignored (later versions may add some).

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/flight/recorder.h"

namespace loom::comm::flight {

struct CommDump {
  CommInfo info;          // info.entries = the ring's capacity; info.dir unused
  uint64_t issued = 0;    // ops recorded in all (the ring keeps the last `capacity`)
  std::vector<Record> records;  // oldest first
};

struct RankDump {
  std::string path;  // where it was read from (messages)
  int world_rank = 0;
  int pid = 0;
  std::string host;
  std::string reason;
  uint64_t dump_us = 0;       // NowUs() at the dump
  int64_t dump_unix_us = 0;   // wall clock at the dump
  uint64_t tick_us = 0;       // clock resolution
  std::vector<CommDump> comms;
};

constexpr int kDumpVersion = 1;

std::string FormatDump(const RankDump& dump);
// Errors name `path` and the line ("rank1.pid42.jsonl:3: ...").
absl::StatusOr<RankDump> ParseDump(const std::string& text, const std::string& path);
absl::StatusOr<RankDump> ReadDump(const std::string& path);
// Every "*.jsonl" file of `dir` (sorted by name); an empty folder, one
// without dump files, or any bad file is an error naming it.
absl::StatusOr<std::vector<RankDump>> ReadDumpDir(const std::string& dir);

// Writes `contents` to `path` through a temporary file in the same folder
// and a rename (readers never see half a file); creates the folder.
absl::Status WriteFileAtomically(const std::string& path, const std::string& contents);

}  // namespace loom::comm::flight

#endif  // LOOM_COMM_FLIGHT_DUMP_H_
