#ifndef LOOM_LAYERS_TP_GROUP_H_
#define LOOM_LAYERS_TP_GROUP_H_

#include "comm/comm.h"

namespace loom::layers {

// The tensor-parallel group a layer runs in, passed explicitly (no global
// process-group state). With size 1 (comm may be null) every collective is
// skipped, which makes the single-rank model the reference path.
struct TpGroup {
  comm::Communicator* comm = nullptr;
  bool sequence_parallel = false;

  int rank() const { return comm ? comm->rank() : 0; }
  int size() const { return comm ? comm->size() : 1; }
  bool parallel() const { return size() > 1; }
};

}  // namespace loom::layers

#endif  // LOOM_LAYERS_TP_GROUP_H_
