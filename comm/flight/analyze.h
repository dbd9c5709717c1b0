#ifndef LOOM_COMM_FLIGHT_ANALYZE_H_
#define LOOM_COMM_FLIGHT_ANALYZE_H_

// Reads every rank's flight recorder dump (dump.h) and finds, for each
// group, the first operation on which its ranks disagree:
//  * never issued: some members issued collective #k, others never did
//    ("group 'dp' (world ranks 0,1,2): all_reduce #57 (f32, 4096 B): issued
//    by ranks 0, 2; never issued by rank 1 (its last op: all_reduce #56,
//    completed 12.3 s before the dump)"); a member with no dump file, or
//    whose dump lacks the group, counts as never having issued it;
//  * disagreement: all issued #k, but with different op, dtype, bytes or root;
//  * never finished: all issued #k alike, and it did not complete (or failed)
//    on some of them;
// and point-to-point ops that never finished. Groups are matched across
// dumps by name and members (world ranks); collectives are aligned by their
// sequence number (comm.h: "all_reduce #k" has the same k on every rank).
// Point-to-point ops are numbered per rank, so they are only checked for
// completion. Times are "seconds before that rank's dump".

#include <string>
#include <vector>

#include "comm/flight/dump.h"

namespace loom::comm::flight {

struct Analysis {
  // The report, one finding (or note) a line.
  std::vector<std::string> lines;
  // World ranks found to have stopped (never issued an op the others did,
  // or disagreed with the majority), sorted; may be empty even with findings
  // (an op that hangs on every rank).
  std::vector<int> culprits;
  bool found = false;  // a disagreement or an unfinished op
  int exit_code() const { return found ? 1 : 0; }
  std::string Report() const;
};

Analysis Analyze(const std::vector<RankDump>& dumps);

}  // namespace loom::comm::flight

#endif  // LOOM_COMM_FLIGHT_ANALYZE_H_
