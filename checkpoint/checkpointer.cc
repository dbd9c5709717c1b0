#include "checkpoint/checkpointer.h"

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "checkpoint/file_util.h"
#include "checkpoint/reader.h"
#include "checkpoint/writer.h"
#include "core/status_macros.h"

namespace loom::checkpoint {


using core::Shape;
using core::Tensor;

absl::StatusOr<std::vector<std::string>> AllGatherBytes(comm::Communicator* comm,
                                                        const std::string& mine) {
  const int n = comm->size();
  if (n == 1) return std::vector<std::string>{mine};
  LOOM_ASSIGN_OR_RETURN(Tensor len, Tensor::Empty(Shape{1}, core::DType::kI64));
  LOOM_ASSIGN_OR_RETURN(Tensor lens, Tensor::Empty(Shape{n}, core::DType::kI64));
  len.data<int64_t>()[0] = static_cast<int64_t>(mine.size());
  // Host tensors on any backend (an NCCL world moves device memory only).
  LOOM_RETURN_IF_ERROR(comm::AllGatherHost(comm, len, lens));
  int64_t max = 1;
  for (int r = 0; r < n; ++r) max = std::max(max, lens.data<int64_t>()[r]);
  LOOM_ASSIGN_OR_RETURN(Tensor buf, Tensor::Zeros(Shape{max}, core::DType::kU8));
  std::memcpy(buf.raw_data(), mine.data(), mine.size());
  LOOM_ASSIGN_OR_RETURN(Tensor all, Tensor::Empty(Shape{n * max}, core::DType::kU8));
  LOOM_RETURN_IF_ERROR(comm::AllGatherHost(comm, buf, all));
  std::vector<std::string> out(n);
  const char* base = static_cast<const char*>(all.raw_data());
  for (int r = 0; r < n; ++r) out[r].assign(base + r * max, lens.data<int64_t>()[r]);
  return out;
}

absl::Status AgreeOnStatus(comm::Communicator* comm, const absl::Status& status) {
  std::string mine;
  if (!status.ok()) {
    mine = absl::StrCat(static_cast<int>(status.code()), ":", status.message());
  }
  LOOM_ASSIGN_OR_RETURN(std::vector<std::string> all, AllGatherBytes(comm, mine));
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    if (static_cast<int>(r) == comm->rank()) return status;
    const size_t colon = all[r].find(':');
    const int code = std::atoi(all[r].substr(0, colon).c_str());
    return absl::Status(static_cast<absl::StatusCode>(code),
                        absl::StrCat("rank ", r, ": ", all[r].substr(colon + 1)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Checkpointer>> Checkpointer::Create(comm::Communicator* world,
                                                                   const SaveOptions& options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("--save: empty checkpoint folder");
  if (options.keep_last < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--keep-last (", options.keep_last, ") must be >= 0 (0: keep all)"));
  }
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> c,
                        world->Split(0, world->rank(), "checkpoint"));
  return std::unique_ptr<Checkpointer>(new Checkpointer(std::move(c), options));
}

Checkpointer::~Checkpointer() {
  if (thread_.joinable()) thread_.join();
}

absl::Status Checkpointer::Wait() {
  if (thread_.joinable()) thread_.join();
  absl::Status s = async_status_;
  async_status_ = absl::OkStatus();
  return s;
}

absl::Status Checkpointer::Write(const std::vector<Piece>& pieces, Manifest header) {
  const int64_t iteration = header.training().iteration();
  const std::string& dir = options_.dir;
  const int rank = comm_->rank(), world = comm_->size();
  // 1. A fresh temporary folder.
  absl::Status begin = rank == 0 ? BeginCheckpoint(dir, iteration) : absl::OkStatus();
  LOOM_RETURN_IF_ERROR(AgreeOnStatus(comm_.get(), begin));
  // 2. Every rank's shard file.
  const std::string path = JoinPath(TmpDirFor(dir, iteration), ShardFileName(rank, world));
  absl::StatusOr<ShardReport> report = WriteShardFile(path, rank, pieces);
  LOOM_RETURN_IF_ERROR(AgreeOnStatus(comm_.get(), report.status()));
  // 3. Reports to rank 0, which commits.
  LOOM_ASSIGN_OR_RETURN(std::vector<std::string> bytes,
                        AllGatherBytes(comm_.get(), report->SerializeAsString()));
  absl::Status commit;
  if (rank == 0) {
    std::vector<ShardReport> reports(world);
    for (int r = 0; r < world && commit.ok(); ++r) {
      if (!reports[r].ParseFromString(bytes[r])) {
        commit = absl::InternalError(absl::StrCat("the shard report of rank ", r, " does not parse"));
      }
    }
    if (commit.ok()) commit = MergeReports(reports, &header);
    if (commit.ok()) commit = CommitCheckpoint(dir, header, options_.keep_last);
  }
  return AgreeOnStatus(comm_.get(), commit);
}

absl::Status Checkpointer::Save(const RankView& view, const Manifest& header) {
  const auto start = std::chrono::steady_clock::now();
  LOOM_RETURN_IF_ERROR(Wait());  // the previous save (async) must be complete first
  std::vector<Piece> pieces = PiecesToSave(view, options_.save_optimizer);
  Manifest h = header;
  h.set_format_version(kFormatVersion);
  h.mutable_training()->set_has_optimizer_state(options_.save_optimizer &&
                                                view.exp_avg != nullptr);
  absl::Status result;
  if (!options_.async) {
    result = Write(pieces, std::move(h));
  } else {
    // Snapshot: copy this rank's slices, then write them in the background.
    int64_t total = 0;
    for (const Piece& p : pieces) total += p.region.numel();
    snapshot_.resize(static_cast<size_t>(total));
    int64_t at = 0;
    for (Piece& p : pieces) {
      std::memcpy(snapshot_.data() + at, p.data, p.region.numel() * sizeof(float));
      p.data = snapshot_.data() + at;
      at += p.region.numel();
    }
    thread_ = std::thread([this, pieces = std::move(pieces), h = std::move(h)]() mutable {
      async_status_ = Write(pieces, std::move(h));
    });
  }
  last_stall_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

absl::StatusOr<Manifest> LoadCheckpoint(comm::Communicator* world, const std::string& dir,
                                        std::optional<int64_t> iteration, const RankView& view,
                                        bool load_optimizer) {
  Manifest manifest;
  absl::Status s = [&]() -> absl::Status {
    LOOM_ASSIGN_OR_RETURN(std::string path, ResolveCheckpoint(dir, iteration));
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(path);
    absl::Status loaded = reader.status();
    if (loaded.ok()) {
      manifest = (*reader)->manifest();
      // A config mismatch is the user's flags, not damage: report it as is.
      LOOM_RETURN_IF_ERROR(CheckModelConfig(manifest.model(), view.model, path));
      loaded = LoadRank(**reader, view, load_optimizer);
    }
    if (!loaded.ok() && loaded.code() == absl::StatusCode::kDataLoss) {
      const std::string name = path.substr(path.find_last_of('/') + 1);
      return WithEarlierCheckpointHint(loaded, dir, ParseIterDirName(name).value_or(INT64_MAX));
    }
    return loaded;
  }();
  LOOM_RETURN_IF_ERROR(AgreeOnStatus(world, s));
  return manifest;
}

}  // namespace loom::checkpoint
