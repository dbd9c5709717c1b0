#ifndef LOOM_LAYERS_TP_GROUP_H_
#define LOOM_LAYERS_TP_GROUP_H_

#include "comm/comm.h"

namespace loom::layers {

// The tensor-parallel group a layer runs in, passed explicitly (no global
// process-group state). With size 1 (comm may be null) every collective is
// skipped, which makes the single-rank model the reference path.
// Host time a rank spent blocked waiting on TP communication (every wait
// through layers/mappings.h's WaitTp: the SP gathers and scatters, the
// all-reduces, the --tp-comm-overlap ring's steps). For //models/gpt:bench.
struct TpCommStats {
  double blocked_ms = 0;
};

struct TpGroup {
  comm::Communicator* comm = nullptr;
  bool sequence_parallel = false;
  // --tp-comm-overlap: with sequence_parallel, the linear layers pipeline
  // their all-gathers and reduce-scatters with their GEMMs, block by block
  // (layers/tp_overlap.h). Off: one collective per gather or scatter.
  bool comm_overlap = false;
  TpCommStats* stats = nullptr;  // counts the time blocked when set

  int rank() const { return comm ? comm->rank() : 0; }
  int size() const { return comm ? comm->size() : 1; }
  bool parallel() const { return size() > 1; }
  // Whether the linear layers take the pipelined path (TP size 1 has no
  // communication to hide; without SP the layers are told off as an error).
  bool ring_overlap() const { return comm_overlap && sequence_parallel && parallel(); }
};

}  // namespace loom::layers

#endif  // LOOM_LAYERS_TP_GROUP_H_
