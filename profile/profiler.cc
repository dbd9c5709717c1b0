#include "profile/profiler.h"

#include <time.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom::profile {
namespace {

using comm::flight::CommInfo;
using comm::flight::OpKind;

// The process's one comm sink: dispatches each op to its rank's Profiler
// (ranks of the local backend are threads of one process). Never destroyed.
class CommSink : public comm::flight::Sink {
 public:
  static CommSink& Get() {
    static CommSink* s = new CommSink();
    return *s;
  }
  absl::Status Add(int rank, Profiler* p) {
    std::lock_guard<std::mutex> l(mu_);
    if (!ranks_.emplace(rank, p).second) {
      return absl::AlreadyExistsError(absl::StrCat(
          "rank ", rank, " of this process is already profiled (one --profile run at a time)"));
    }
    comm::flight::SetSink(this);
    return absl::OkStatus();
  }
  void Remove(int rank, Profiler* p) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = ranks_.find(rank);
    if (it != ranks_.end() && it->second == p) ranks_.erase(it);
    if (ranks_.empty()) comm::flight::SetSink(nullptr);
  }
  void OnIssue(const CommInfo& info, uint64_t id, OpKind kind, uint64_t seq, core::DType dtype,
               uint64_t bytes, int peer, int tag) override {
    std::lock_guard<std::mutex> l(mu_);  // keeps the Profiler alive
    auto it = ranks_.find(info.world_rank);
    if (it != ranks_.end()) it->second->OnCommIssue(info, id, kind, seq, dtype, bytes, peer, tag);
  }
  void OnComplete(const CommInfo& info, uint64_t id, bool ok) override {
    std::lock_guard<std::mutex> l(mu_);
    auto it = ranks_.find(info.world_rank);
    if (it != ranks_.end()) it->second->OnCommComplete(info, id, ok);
  }

 private:
  std::mutex mu_;
  std::map<int, Profiler*> ranks_;
};

std::string RankFile(const std::string& dir, int rank) {
  return absl::StrCat(dir, "/rank-", rank, ".json");
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    f.close();
    if (!f) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot rename ", tmp, ": ", ec.message()));
  return absl::OkStatus();
}

}  // namespace

double NowUs() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_nsec) / 1e3;
}

absl::StatusOr<std::unique_ptr<Profiler>> Profiler::Create(const ProfileOptions& options,
                                                           int world_rank) {
  if (options.dir.empty()) {
    return absl::InvalidArgumentError("--profile needs --profile-dir=<directory>");
  }
  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--profile-dir=", options.dir, ": cannot create it: ", ec.message()));
  }
  std::unique_ptr<Profiler> p(new Profiler(options, world_rank));
  absl::Status added = CommSink::Get().Add(world_rank, p.get());
  if (!added.ok()) return added;
  return p;
}

Profiler::~Profiler() { CommSink::Get().Remove(world_rank_, this); }

absl::Status Profiler::BeforeStep(int64_t iteration, comm::Communicator* world) {
  if (closed_ || active() || iteration != options_.step_start) return absl::OkStatus();
  // Every rank leaves the barrier at about the same moment: the common
  // origin of ranks whose clocks differ (other hosts).
  absl::Status s = world->Barrier()->Wait();
  if (!s.ok()) return s;
  sync_us_ = NowUs();
  {
    std::lock_guard<std::mutex> l(mu_);
    spans_.reserve(std::max<size_t>(spans_.capacity(), 1 << 16));
    args_.reserve(std::max<size_t>(args_.capacity(), 8 << 20));
  }
  active_.store(true, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status Profiler::AfterStep(int64_t iteration, comm::Communicator* world,
                                 const std::function<void(const std::string&)>& log) {
  if (!active() || iteration < options_.step_end) return absl::OkStatus();
  return Close(world, log);
}

uint32_t Profiler::InternLocked(const std::string& s) {
  auto [it, added] = string_ids_.try_emplace(s, static_cast<uint32_t>(strings_.size()));
  if (added) strings_.push_back(s);
  return it->second;
}

void Profiler::AddLocked(const std::string& name, const std::string& cat,
                         const std::string& track, double ts_us, double dur_us,
                         const std::string& args) {
  spans_.push_back({InternLocked(name), InternLocked(cat), InternLocked(track), ts_us, dur_us,
                    args_.size(), static_cast<uint32_t>(args.size())});
  args_ += args;
}

std::vector<Event> Profiler::EventsLocked() const {
  std::vector<Event> events;
  events.reserve(spans_.size());
  for (const Span& s : spans_) {
    Event e;
    e.name = strings_[s.name];
    e.cat = strings_[s.cat];
    e.track = strings_[s.track];
    e.ts_us = s.ts_us;
    e.dur_us = s.dur_us;
    e.args = args_.substr(s.args_begin, s.args_len);
    e.pid = world_rank_;
    events.push_back(std::move(e));
  }
  return events;
}

void Profiler::AddSpan(std::string name, std::string cat, std::string track, double start_us,
                       double end_us, std::string args) {
  if (!active()) return;
  std::lock_guard<std::mutex> l(mu_);
  AddLocked(name, cat, track, start_us, end_us - start_us, args);
}

std::vector<Event> Profiler::events() const {
  std::lock_guard<std::mutex> l(mu_);
  return EventsLocked();
}

void Profiler::OnCommIssue(const CommInfo& info, uint64_t id, OpKind kind, uint64_t seq,
                           core::DType dtype, uint64_t bytes, int peer, int tag) {
  if (!active()) return;
  PendingOp op{NowUs(), kind, seq, dtype, bytes, peer, tag};
  std::lock_guard<std::mutex> l(mu_);
  pending_[{&info, id}] = op;
}

void Profiler::OnCommComplete(const CommInfo& info, uint64_t id, bool ok) {
  if (!active()) return;
  const double now = NowUs();
  std::lock_guard<std::mutex> l(mu_);
  auto it = pending_.find({&info, id});
  if (it == pending_.end()) return;  // issued before the window, or completed twice
  const PendingOp op = it->second;
  pending_.erase(it);
  const bool p2p = comm::flight::IsPointToPoint(op.kind);
  std::string args = absl::StrCat(
      "{\"bytes\":", op.bytes, ",\"dtype\":", JsonString(core::DTypeName(op.dtype)),
      ",\"group\":", JsonString(info.group), ",\"group_size\":", info.group_size,
      ",\"group_rank\":", info.group_rank, ",\"seq\":", op.seq);
  if (!info.members.empty()) {
    absl::StrAppend(&args, ",\"ranks\":[", absl::StrJoin(info.members, ","), "]");
  }
  if (op.peer >= 0) {
    const int world_peer = op.peer < static_cast<int>(info.members.size())
                               ? info.members[op.peer]
                               : op.peer;
    absl::StrAppend(&args, p2p ? ",\"peer\":" : ",\"root\":", world_peer);
  }
  if (op.tag >= 0) absl::StrAppend(&args, ",\"tag\":", op.tag);
  if (!ok) args += ",\"failed\":true";
  args += "}";
  AddLocked(comm::flight::OpKindName(op.kind), p2p ? "p2p" : "comm",
            absl::StrCat("comm ", info.group.empty() ? "world" : info.group), op.issued_us,
            now - op.issued_us, args);
}

absl::Status Profiler::Close(comm::Communicator* world,
                             const std::function<void(const std::string&)>& log) {
  if (!active()) return absl::OkStatus();
  active_.store(false, std::memory_order_relaxed);
  closed_ = true;
  RankTrace mine;
  mine.rank = world_rank_;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  mine.host = host;
  mine.sync_us = sync_us_;
  mine.step_start = options_.step_start;
  mine.step_end = options_.step_end;
  {
    std::lock_guard<std::mutex> l(mu_);
    mine.events = EventsLocked();
    pending_.clear();  // ops still in flight end outside the window
  }
  absl::Status written = WriteText(RankFile(options_.dir, world_rank_), FormatRankTrace(mine));
  // The barrier comes first: a rank that failed to write still lets the others go on.
  absl::Status s = world->Barrier()->Wait();
  if (!written.ok()) return written;
  if (!s.ok()) return s;
  if (world->rank() != 0) return absl::OkStatus();
  std::vector<RankTrace> ranks;
  std::vector<std::string> missing;
  size_t events = 0;
  for (int r = 0; r < world->size(); ++r) {
    const std::string file = RankFile(options_.dir, r);
    std::ifstream f(file, std::ios::binary);
    std::stringstream text;
    text << f.rdbuf();
    absl::StatusOr<RankTrace> t =
        f ? ParseRankTrace(text.str(), file) : absl::NotFoundError(file);
    if (!t.ok()) {
      missing.push_back(absl::StrCat(r));
      continue;
    }
    events += t->events.size();
    ranks.push_back(*std::move(t));
  }
  const std::string merged = absl::StrCat(options_.dir, "/trace.json");
  absl::Status m = WriteText(merged, FormatMergedTrace(ranks));
  if (!m.ok()) return m;
  if (log) {
    log(absl::StrCat("profile: steps ", options_.step_start + 1, "..", options_.step_end, " of ",
                     ranks.size(), " ranks (", events, " spans) in ", merged,
                     " (open in ui.perfetto.dev or chrome://tracing; per rank: rank-R.json)",
                     missing.empty() ? ""
                                     : absl::StrCat("; ranks without a readable file (another "
                                                    "host without a shared --profile-dir?): ",
                                                    absl::StrJoin(missing, ", "))));
  }
  return absl::OkStatus();
}

}  // namespace loom::profile
