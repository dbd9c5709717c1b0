#include "comm/flight/dump.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/match.h"
#include "nlohmann/json.hpp"

namespace loom::comm::flight {
namespace {

using nlohmann::json;

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

const char* State(const Record& r) {
  if (r.completed_us != 0) return r.failed ? "failed" : "completed";
  return r.started_us != 0 ? "started" : "issued";
}

bool ParseDType(const std::string& name, core::DType* d) {
  for (int i = 0; i <= 6; ++i) {
    auto t = static_cast<core::DType>(i);
    if (name == core::DTypeName(t)) {
      *d = t;
      return true;
    }
  }
  return false;
}

// Field readers: each names the key and what was expected.
class Line {
 public:
  Line(const json& j, std::string where) : j_(j), where_(std::move(where)) {}
  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": ", what));
  }
  template <typename T>
  absl::Status Int(const char* key, T* out) const {
    auto it = j_.find(key);
    if (it == j_.end() || !it->is_number_integer()) {
      return Error(absl::StrCat("\"", key, "\" is missing or not an integer"));
    }
    if (it->is_number_unsigned()) {
      *out = static_cast<T>(it->get<uint64_t>());
    } else {
      *out = static_cast<T>(it->get<int64_t>());
    }
    return absl::OkStatus();
  }
  absl::Status Str(const char* key, std::string* out) const {
    auto it = j_.find(key);
    if (it == j_.end() || !it->is_string()) {
      return Error(absl::StrCat("\"", key, "\" is missing or not a string"));
    }
    *out = it->get<std::string>();
    return absl::OkStatus();
  }

 private:
  const json& j_;
  std::string where_;
};

#define FLIGHT_RETURN_IF_ERROR(expr)      \
  do {                                    \
    absl::Status _s = (expr);             \
    if (!_s.ok()) return _s;              \
  } while (0)

}  // namespace

std::string FormatDump(const RankDump& d) {
  std::string out = absl::StrCat(
      "{\"type\":\"loom_flight\",\"version\":", kDumpVersion, ",\"world_rank\":", d.world_rank,
      ",\"pid\":", d.pid, ",\"host\":", Quote(d.host), ",\"reason\":", Quote(d.reason),
      ",\"dump_us\":", d.dump_us, ",\"dump_unix_us\":", d.dump_unix_us,
      ",\"tick_us\":", d.tick_us, "}\n");
  for (size_t i = 0; i < d.comms.size(); ++i) {
    const CommDump& c = d.comms[i];
    absl::StrAppend(&out, "{\"type\":\"comm\",\"comm\":", i, ",\"group\":", Quote(c.info.group),
                    ",\"backend\":", Quote(c.info.backend), ",\"world_rank\":",
                    c.info.world_rank, ",\"group_rank\":", c.info.group_rank,
                    ",\"group_size\":", c.info.group_size, ",\"members\":[",
                    absl::StrJoin(c.info.members, ","), "],\"capacity\":", c.info.entries,
                    ",\"issued\":", c.issued, "}\n");
    for (const Record& r : c.records) {
      absl::StrAppend(&out, "{\"type\":\"op\",\"comm\":", i, ",\"id\":", r.id, ",\"op\":\"",
                      OpKindName(r.kind), "\",\"seq\":", r.seq, ",\"dtype\":\"",
                      core::DTypeName(r.dtype), "\",\"bytes\":", r.bytes, ",\"peer\":", r.peer,
                      ",\"tag\":", r.tag, ",\"issued_us\":", r.issued_us,
                      ",\"started_us\":", r.started_us, ",\"completed_us\":", r.completed_us,
                      ",\"state\":\"", State(r), "\"}\n");
    }
  }
  return out;
}

absl::StatusOr<RankDump> ParseDump(const std::string& text, const std::string& path) {
  RankDump d;
  d.path = path;
  int line_no = 0;
  bool have_header = false;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (raw.empty()) continue;
    const std::string where = absl::StrCat(path, ":", line_no);
    json j = json::parse(raw.begin(), raw.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": not a JSON object (a flight recorder dump has one object a line; "
                 "truncated or not a dump?)"));
    }
    Line l(j, where);
    std::string type;
    FLIGHT_RETURN_IF_ERROR(l.Str("type", &type));
    if (!have_header) {
      if (type != "loom_flight") {
        return l.Error(absl::StrCat("the first line has type \"", type,
                                    "\", expected the \"loom_flight\" header (not a dump?)"));
      }
      int version = 0;
      FLIGHT_RETURN_IF_ERROR(l.Int("version", &version));
      if (version != kDumpVersion) {
        return l.Error(absl::StrCat("dump version ", version, ", this reader knows ",
                                    kDumpVersion));
      }
      FLIGHT_RETURN_IF_ERROR(l.Int("world_rank", &d.world_rank));
      FLIGHT_RETURN_IF_ERROR(l.Int("pid", &d.pid));
      FLIGHT_RETURN_IF_ERROR(l.Str("host", &d.host));
      FLIGHT_RETURN_IF_ERROR(l.Str("reason", &d.reason));
      FLIGHT_RETURN_IF_ERROR(l.Int("dump_us", &d.dump_us));
      FLIGHT_RETURN_IF_ERROR(l.Int("dump_unix_us", &d.dump_unix_us));
      FLIGHT_RETURN_IF_ERROR(l.Int("tick_us", &d.tick_us));
      have_header = true;
      continue;
    }
    if (type == "comm") {
      size_t index = 0;
      FLIGHT_RETURN_IF_ERROR(l.Int("comm", &index));
      if (index != d.comms.size()) {
        return l.Error(absl::StrCat("comm ", index, " out of order (expected ", d.comms.size(),
                                    ")"));
      }
      CommDump c;
      FLIGHT_RETURN_IF_ERROR(l.Str("group", &c.info.group));
      FLIGHT_RETURN_IF_ERROR(l.Str("backend", &c.info.backend));
      FLIGHT_RETURN_IF_ERROR(l.Int("world_rank", &c.info.world_rank));
      FLIGHT_RETURN_IF_ERROR(l.Int("group_rank", &c.info.group_rank));
      FLIGHT_RETURN_IF_ERROR(l.Int("group_size", &c.info.group_size));
      FLIGHT_RETURN_IF_ERROR(l.Int("capacity", &c.info.entries));
      FLIGHT_RETURN_IF_ERROR(l.Int("issued", &c.issued));
      auto m = j.find("members");
      if (m == j.end() || !m->is_array()) return l.Error("\"members\" is missing or not a list");
      for (const json& v : *m) {
        if (!v.is_number_integer()) return l.Error("\"members\" holds a non-integer");
        c.info.members.push_back(v.get<int>());
      }
      if (!c.info.members.empty() &&
          static_cast<int>(c.info.members.size()) != c.info.group_size) {
        return l.Error(absl::StrCat("\"members\" lists ", c.info.members.size(),
                                    " ranks for a group of ", c.info.group_size));
      }
      d.comms.push_back(std::move(c));
    } else if (type == "op") {
      size_t index = 0;
      FLIGHT_RETURN_IF_ERROR(l.Int("comm", &index));
      if (d.comms.empty() || index != d.comms.size() - 1) {
        return l.Error(absl::StrCat("op of comm ", index, " outside that comm's lines"));
      }
      Record r;
      std::string op, dtype, state;
      FLIGHT_RETURN_IF_ERROR(l.Int("id", &r.id));
      FLIGHT_RETURN_IF_ERROR(l.Str("op", &op));
      if (!ParseOpKind(op, &r.kind)) return l.Error(absl::StrCat("unknown op \"", op, "\""));
      FLIGHT_RETURN_IF_ERROR(l.Int("seq", &r.seq));
      FLIGHT_RETURN_IF_ERROR(l.Str("dtype", &dtype));
      if (!ParseDType(dtype, &r.dtype)) {
        return l.Error(absl::StrCat("unknown dtype \"", dtype, "\""));
      }
      FLIGHT_RETURN_IF_ERROR(l.Int("bytes", &r.bytes));
      FLIGHT_RETURN_IF_ERROR(l.Int("peer", &r.peer));
      FLIGHT_RETURN_IF_ERROR(l.Int("tag", &r.tag));
      FLIGHT_RETURN_IF_ERROR(l.Int("issued_us", &r.issued_us));
      FLIGHT_RETURN_IF_ERROR(l.Int("started_us", &r.started_us));
      FLIGHT_RETURN_IF_ERROR(l.Int("completed_us", &r.completed_us));
      FLIGHT_RETURN_IF_ERROR(l.Str("state", &state));
      if (state != "issued" && state != "started" && state != "completed" && state != "failed") {
        return l.Error(absl::StrCat("unknown state \"", state, "\""));
      }
      r.failed = state == "failed";
      if ((state == "completed" || state == "failed") != (r.completed_us != 0)) {
        return l.Error(absl::StrCat("state \"", state, "\" disagrees with completed_us ",
                                    r.completed_us));
      }
      d.comms.back().records.push_back(r);
    }
    // Other types: a later version's; ignored.
  }
  if (!have_header) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": empty file (no \"loom_flight\" header line)"));
  }
  return d;
}

absl::StatusOr<RankDump> ReadDump(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot open (", std::strerror(errno), ")"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseDump(ss.str(), path);
}

absl::StatusOr<std::vector<RankDump>> ReadDumpDir(const std::string& dir) {
  DIR* dp = opendir(dir.c_str());
  if (dp == nullptr) {
    return absl::NotFoundError(absl::StrCat("flight recorder folder ", dir,
                                            ": cannot open (", std::strerror(errno), ")"));
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(dp)) {
    std::string n = e->d_name;
    if (absl::EndsWith(n, ".jsonl") && !absl::StartsWith(n, ".")) names.push_back(n);
  }
  closedir(dp);
  std::sort(names.begin(), names.end());
  if (names.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "flight recorder folder ", dir,
        " holds no dump (rank<R>.pid<P>.jsonl): was --flight-recorder-dir set, and did a rank "
        "time out or get SIGUSR1?"));
  }
  std::vector<RankDump> out;
  for (const std::string& n : names) {
    auto d = ReadDump(absl::StrCat(dir, "/", n));
    if (!d.ok()) return d.status();
    out.push_back(std::move(*d));
  }
  return out;
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  // mkdir -p
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      const std::string prefix = dir.substr(0, i);
      if (mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST) {
        return absl::InternalError(absl::StrCat("cannot create folder ", prefix, ": ",
                                                std::strerror(errno)));
      }
    }
  }
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  const std::string tmp = absl::StrCat(dir, "/.", base, ".tmp");
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
  }
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      close(fd);
      unlink(tmp.c_str());
      return absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(e)));
    }
    done += static_cast<size_t>(n);
  }
  fsync(fd);
  close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    unlink(tmp.c_str());
    return absl::InternalError(
        absl::StrCat("cannot rename ", tmp, " to ", path, ": ", std::strerror(e)));
  }
  return absl::OkStatus();
}

}  // namespace loom::comm::flight
