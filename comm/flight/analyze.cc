#include "comm/flight/analyze.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace loom::comm::flight {
namespace {

// One group as seen by the dumps: key = (name, members or size).
struct GroupKey {
  std::string name;
  std::vector<int> members;  // world ranks; empty: unknown
  int size = 0;
  bool operator<(const GroupKey& o) const {
    return std::tie(name, members, size) < std::tie(o.name, o.members, o.size);
  }
};

struct RankView {
  const RankDump* dump = nullptr;
  const CommDump* comm = nullptr;  // null: the dump lacks this group
};

std::string Seconds(uint64_t dump_us, uint64_t t_us) {
  const double s = t_us > dump_us ? 0.0 : static_cast<double>(dump_us - t_us) / 1e6;
  return absl::StrFormat("%.1f s before the dump", s);
}

std::string RankList(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "));
}

std::string OpName(const Record& r) { return absl::StrCat(OpKindName(r.kind), " #", r.seq); }

// "all_reduce #57 (f32, 4096 B)", with root or peer where the op has one.
std::string OpWithArgs(const Record& r, const std::vector<int>& members) {
  std::string s = absl::StrCat(OpName(r), " (", core::DTypeName(r.dtype), ", ", r.bytes, " B");
  if (r.peer >= 0) {
    const char* what = IsPointToPoint(r.kind) ? (r.kind == OpKind::kSend ? "to" : "from") : "root";
    absl::StrAppend(&s, ", ", what, " group rank ", r.peer);
    if (r.peer < static_cast<int>(members.size())) {
      absl::StrAppend(&s, " = world rank ", members[r.peer]);
    }
  }
  if (r.tag >= 0) absl::StrAppend(&s, ", tag ", r.tag);
  return s + ")";
}

// "completed 12.3 s before the dump" / "started ..." / "issued ...".
std::string StateAt(const Record& r, uint64_t dump_us) {
  if (r.completed_us != 0) {
    return absl::StrCat(r.failed ? "failed " : "completed ", Seconds(dump_us, r.completed_us));
  }
  if (r.started_us != 0) {
    return absl::StrCat("started ", Seconds(dump_us, r.started_us), ", not finished");
  }
  return absl::StrCat("issued ", Seconds(dump_us, r.issued_us), ", not started");
}

// What a rank that lacks an op did last in the group.
std::string LastOp(const RankView& v) {
  if (v.dump == nullptr) return "no dump file from this rank";
  if (v.comm == nullptr) return "its dump has no record of this group";
  if (v.comm->records.empty()) return "it issued no op in this group";
  const Record& last = v.comm->records.back();
  return absl::StrCat("its last op: ", OpName(last), ", ", StateAt(last, v.dump->dump_us));
}

struct Signature {
  OpKind kind;
  core::DType dtype;
  uint64_t bytes;
  int peer;
  bool operator<(const Signature& o) const {
    return std::tie(kind, dtype, bytes, peer) < std::tie(o.kind, o.dtype, o.bytes, o.peer);
  }
};

class GroupAnalysis {
 public:
  GroupAnalysis(const GroupKey& key, std::map<int, RankView> ranks)
      : key_(key), ranks_(std::move(ranks)) {}

  std::string Label() const {
    if (!key_.members.empty()) {
      return absl::StrCat("group '", key_.name, "' (world ranks ",
                          absl::StrJoin(key_.members, ","), ")");
    }
    return absl::StrCat("group '", key_.name, "' (", key_.size,
                        " ranks; world ranks unknown to the backend)");
  }

  // Appends the group's first disagreement (or unfinished ops) to `out`.
  // Returns true if it found one; `never_issued` tells its kind.
  bool Run(std::vector<std::string>* out, std::set<int>* culprits, bool* never_issued) {
    *never_issued = false;
    // Members with no record of the group (no dump, or a dump without the
    // group) are not aligned: nothing is known of them. They are named with
    // the first finding, and are its culprits when it has none of its own.
    std::vector<int> unknown;
    std::vector<std::string> unknown_why;
    for (auto& [rank, v] : ranks_) {
      if (v.comm != nullptr) continue;
      unknown.push_back(rank);
      unknown_why.push_back(absl::StrCat("rank ", rank, ": ", LastOp(v)));
    }
    std::vector<std::string> found;
    std::set<int> blamed;
    const bool any_finding = Aligned(&found, &blamed, never_issued);
    if (!unknown.empty()) {
      const std::string note = absl::StrCat("no record from ", RankList(unknown), " (",
                                            absl::StrJoin(unknown_why, "; "),
                                            "): dead, or hung without dumping? Send it SIGUSR1");
      if (any_finding) {
        found[0] += "; " + note;
        if (blamed.empty()) blamed.insert(unknown.begin(), unknown.end());
      } else {
        found.push_back(absl::StrCat("note: ", Label(), ": ", note));
      }
    }
    out->insert(out->end(), found.begin(), found.end());
    culprits->insert(blamed.begin(), blamed.end());
    return any_finding;
  }

 private:
  bool Aligned(std::vector<std::string>* out, std::set<int>* culprits, bool* never_issued) {
    // Each rank's collectives by sequence number.
    std::map<int, std::map<uint64_t, const Record*>> colls;
    bool any = false;
    uint64_t start = 0, end = 0;
    for (auto& [rank, v] : ranks_) {
      if (v.comm == nullptr) continue;
      auto& m = colls[rank];
      for (const Record& r : v.comm->records) {
        if (!IsPointToPoint(r.kind)) m[r.seq] = &r;
      }
      if (m.empty()) continue;
      // Where the ring wrapped, earlier numbers are gone from this rank's
      // dump: start where every rank still has them.
      if (v.comm->issued > v.comm->records.size()) start = std::max(start, m.begin()->first);
      end = std::max(end, m.rbegin()->first + 1);
      any = true;
    }
    if (any) {
      for (uint64_t s = start; s < end; ++s) {
        if (Collective(s, colls, out, culprits, never_issued)) return true;
      }
    }
    return PointToPoint(out);
  }

  bool Collective(uint64_t seq, std::map<int, std::map<uint64_t, const Record*>>& colls,
                  std::vector<std::string>* out, std::set<int>* culprits, bool* never_issued) {
    std::vector<int> issued, missing;
    std::map<Signature, std::vector<int>> sigs;
    const Record* any = nullptr;
    for (auto& [rank, m] : colls) {
      auto it = m.find(seq);
      if (it == m.end()) {
        missing.push_back(rank);
        continue;
      }
      issued.push_back(rank);
      any = it->second;
      const Record& r = *it->second;
      // all_to_all_v moves different bytes on every rank: not a disagreement.
      const uint64_t bytes = r.kind == OpKind::kAllToAllV ? 0 : r.bytes;
      sigs[{r.kind, r.dtype, bytes, r.peer}].push_back(rank);
    }
    if (any == nullptr) return false;  // gone from every ring (wrapped)
    if (!missing.empty()) {
      std::vector<std::string> why;
      for (int r : missing) {
        why.push_back(absl::StrCat("rank ", r, " (", LastOp(ranks_[r]), ")"));
        culprits->insert(r);
      }
      out->push_back(absl::StrCat(Label(), ": ", OpWithArgs(*any, key_.members),
                                  ": issued by ", RankList(issued), "; never issued by ",
                                  absl::StrJoin(why, "; ")));
      *never_issued = true;
      return true;
    }
    if (sigs.size() > 1) {
      size_t most = 0;
      for (auto& [sig, rs] : sigs) most = std::max(most, rs.size());
      size_t with_most = 0;
      for (auto& [sig, rs] : sigs) with_most += rs.size() == most;
      std::vector<std::string> parts;
      for (auto& [sig, rs] : sigs) {
        Record r;
        r.kind = sig.kind;
        r.dtype = sig.dtype;
        r.bytes = sig.bytes;
        r.peer = sig.peer;
        r.seq = seq;
        parts.push_back(absl::StrCat(RankList(rs), ": ", OpWithArgs(r, key_.members)));
        // The minority disagrees with the rest; a tie names everyone.
        if (rs.size() < most || with_most > 1) culprits->insert(rs.begin(), rs.end());
      }
      out->push_back(absl::StrCat(Label(), ": collective #", seq,
                                  ": the ranks disagree on the op: ", absl::StrJoin(parts, "; ")));
      return true;
    }
    std::vector<int> done, unfinished, failed;
    std::vector<std::string> detail;
    for (auto& [rank, m] : colls) {
      const Record& r = *m[seq];
      if (r.completed_us != 0 && !r.failed) {
        done.push_back(rank);
        continue;
      }
      (r.failed ? failed : unfinished).push_back(rank);
      detail.push_back(absl::StrCat("rank ", rank, ": ", StateAt(r, ranks_[rank].dump->dump_us)));
    }
    if (unfinished.empty() && failed.empty()) return false;
    std::string line = absl::StrCat(
        Label(), ": ", OpWithArgs(*any, key_.members), ": issued by ",
        colls.size() == ranks_.size() ? "every rank" : RankList(issued), "; ");
    if (!unfinished.empty()) absl::StrAppend(&line, "never finished on ", RankList(unfinished), "; ");
    if (!failed.empty()) absl::StrAppend(&line, "failed on ", RankList(failed), "; ");
    if (!done.empty()) absl::StrAppend(&line, "finished on ", RankList(done), "; ");
    absl::StrAppend(&line, "(", absl::StrJoin(detail, "; "), ")");
    out->push_back(line);
    return true;
  }

  // Point-to-point ops are numbered per rank: only completion is checked.
  bool PointToPoint(std::vector<std::string>* out) {
    bool found = false;
    for (auto& [rank, v] : ranks_) {
      if (v.comm == nullptr) continue;
      for (const Record& r : v.comm->records) {
        if (!IsPointToPoint(r.kind) || (r.completed_us != 0 && !r.failed)) continue;
        out->push_back(absl::StrCat(Label(), ": ", OpWithArgs(r, key_.members),
                                    " on rank ", rank, ": ", StateAt(r, v.dump->dump_us),
                                    r.failed ? "" : " (its peer never matched it?)"));
        found = true;
        break;  // the first per rank
      }
    }
    return found;
  }

  GroupKey key_;
  std::map<int, RankView> ranks_;
};

}  // namespace

std::string Analysis::Report() const {
  std::string s;
  for (const std::string& l : lines) absl::StrAppend(&s, l, "\n");
  return s;
}

Analysis Analyze(const std::vector<RankDump>& dumps) {
  Analysis a;
  // The newest dump of each world rank.
  std::map<int, const RankDump*> by_rank;
  for (const RankDump& d : dumps) {
    auto [it, fresh] = by_rank.emplace(d.world_rank, &d);
    if (fresh) continue;
    const RankDump* older = it->second;
    if (d.dump_unix_us > older->dump_unix_us) std::swap(older, it->second);
    a.lines.push_back(absl::StrCat("note: rank ", d.world_rank, " has several dumps; using ",
                                   it->second->path, ", ignoring ", older->path));
  }
  // Groups, and which ranks' dumps hold them.
  std::map<GroupKey, std::map<int, RankView>> groups;
  for (auto& [rank, d] : by_rank) {
    for (const CommDump& c : d->comms) {
      GroupKey k{c.info.group, c.info.members, c.info.group_size};
      RankView& v = groups[k][rank];
      if (v.comm != nullptr) {
        a.lines.push_back(absl::StrCat("note: ", d->path, " holds group '", c.info.group,
                                       "' twice (two worlds in one process share the folder?); "
                                       "using the later"));
      }
      v = RankView{d, &c};
    }
  }
  std::vector<std::string> first, rest;  // never-issued findings first
  std::set<int> culprits;
  for (auto& [key, ranks] : groups) {
    // Members without a dump, or whose dump lacks the group.
    for (int m : key.members) {
      if (ranks.count(m)) continue;
      auto d = by_rank.find(m);
      ranks[m] = RankView{d == by_rank.end() ? nullptr : d->second, nullptr};
    }
    GroupAnalysis g(key, ranks);
    std::vector<std::string> found;
    bool never_issued = false;
    if (g.Run(&found, &culprits, &never_issued)) {
      a.found = true;
      auto& dst = never_issued ? first : rest;
      dst.insert(dst.end(), found.begin(), found.end());
    }
  }
  a.lines.insert(a.lines.end(), first.begin(), first.end());
  a.lines.insert(a.lines.end(), rest.begin(), rest.end());
  a.culprits.assign(culprits.begin(), culprits.end());
  if (!a.found) {
    a.lines.push_back(absl::StrCat("all ", by_rank.size(), " dumped ranks agree in ",
                                   groups.size(), " group(s); every recorded op finished"));
  } else if (!a.culprits.empty()) {
    a.lines.push_back(absl::StrCat("culprit: world ", RankList(a.culprits)));
  } else {
    a.lines.push_back("no single culprit: every member issued the first unfinished op");
  }
  return a;
}

}  // namespace loom::comm::flight
