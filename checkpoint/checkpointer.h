#ifndef LOOM_CHECKPOINT_CHECKPOINTER_H_
#define LOOM_CHECKPOINT_CHECKPOINTER_H_

// Collective save and load for a training run: every rank of the world calls
// them, in the same order.
//
// Save: rank 0 prepares DIR/iter_N.tmp, every rank writes its shard file
// (fsynced, CRC32C), the ranks exchange their reports, rank 0 writes the
// manifest and commits (rename, `latest`, --keep-last). With `async` the
// rank's slices are copied to a snapshot and the writing happens on a
// background thread over a communicator of its own, so training continues;
// the next Save (or Wait) waits for it and reports its error.
//
// Load: every rank reads the slices its layout needs from whichever files
// hold them; if any rank fails, every rank returns that error.

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/checkpoint.pb.h"
#include "checkpoint/rank_state.h"
#include "comm/comm.h"

namespace loom::checkpoint {

struct SaveOptions {
  std::string dir;             // --save
  int keep_last = 0;           // --keep-last (0: keep all)
  bool async = false;          // --async-save
  bool save_optimizer = true;  // !--no-save-optim
};

class Checkpointer {
 public:
  // Collective over `world` (splits off the communicator saves use).
  static absl::StatusOr<std::unique_ptr<Checkpointer>> Create(comm::Communicator* world,
                                                              const SaveOptions& options);
  ~Checkpointer();  // waits for an in-flight save (its error is dropped: call Wait())

  // Collective. `header` holds training (iteration set), layout and model;
  // files and tensors are filled here. Returns once the checkpoint is
  // complete, or (async) once the snapshot is taken.
  absl::Status Save(const RankView& view, const Manifest& header);
  // Waits for the in-flight async save; returns its status.
  absl::Status Wait();

  const SaveOptions& options() const { return options_; }
  // Seconds the last Save() blocked the caller.
  double last_stall_seconds() const { return last_stall_s_; }

 private:
  Checkpointer(std::unique_ptr<comm::Communicator> comm, SaveOptions options)
      : comm_(std::move(comm)), options_(std::move(options)) {}
  // The collective write; runs on the caller's thread or the background one.
  absl::Status Write(const std::vector<Piece>& pieces, Manifest header);

  std::unique_ptr<comm::Communicator> comm_;
  SaveOptions options_;
  std::thread thread_;
  absl::Status async_status_;
  std::vector<float> snapshot_;
  double last_stall_s_ = 0;
};

// Collective load into this rank (see LoadRank). `iteration`: the
// --load-iteration, else `latest`. Checks the model config against
// view.model first. Returns the manifest (training position, optimizer step).
absl::StatusOr<Manifest> LoadCheckpoint(comm::Communicator* world, const std::string& dir,
                                        std::optional<int64_t> iteration, const RankView& view,
                                        bool load_optimizer);

// Every rank passes its status; every rank gets the first failing rank's
// error (prefixed with that rank), or OK. Collective.
absl::Status AgreeOnStatus(comm::Communicator* comm, const absl::Status& status);
// Collective: every rank's bytes, in rank order.
absl::StatusOr<std::vector<std::string>> AllGatherBytes(comm::Communicator* comm,
                                                        const std::string& mine);

}  // namespace loom::checkpoint

#endif  // LOOM_CHECKPOINT_CHECKPOINTER_H_
