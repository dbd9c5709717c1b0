#ifndef LOOM_COMM_LOCAL_COMMUNICATOR_H_
#define LOOM_COMM_LOCAL_COMMUNICATOR_H_

// The `local` backend: the ranks are threads of one process, exchanging
// messages through in-memory mailboxes. It runs the same algorithms as the
// UCX backend (comm/internal/engine.h) and is the reference the conformance
// suite is first run on.

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/comm.h"
#include "comm/store/memory_store.h"

namespace loom::comm::local {

struct LocalOptions {
  CommOptions comm;
  size_t small_bytes = 64 << 10;  // all-reduce and all-to-all algorithm switch (engine.h)
};

// Rank `rank` of a world of `size` threads that share `store` (each thread
// calls this once with its rank; the first creates the shared mailboxes).
absl::StatusOr<std::unique_ptr<Communicator>> Create(int rank, int size, MemoryStore& store,
                                                     const LocalOptions& options = {});

// All ranks at once (hand one to each thread).
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateWorld(
    int size, const LocalOptions& options = {});

}  // namespace loom::comm::local

#endif  // LOOM_COMM_LOCAL_COMMUNICATOR_H_
