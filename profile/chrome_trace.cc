#include "profile/chrome_trace.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace loom::profile {
namespace {

using nlohmann::json;

// The lanes of one rank: (track, lane) -> tid, "main" first, then by name.
struct Threads {
  std::map<std::pair<std::string, int>, int> tid;
  std::vector<std::pair<int, std::string>> names;  // tid, thread_name
};

// Events of one rank grouped by track, lanes assigned; returns each event's tid.
std::vector<int> LayOut(const std::vector<Event>& events, Threads* threads) {
  std::map<std::string, std::vector<size_t>> by_track;
  for (size_t i = 0; i < events.size(); ++i) by_track[events[i].track].push_back(i);
  std::vector<std::string> order;
  if (by_track.count("main")) order.push_back("main");
  for (auto& [track, idx] : by_track) {
    if (track != "main") order.push_back(track);
  }
  std::vector<int> tids(events.size(), 0);
  for (const std::string& track : order) {
    const std::vector<size_t>& idx = by_track[track];
    std::vector<Event> spans;
    for (size_t i : idx) spans.push_back(events[i]);
    const std::vector<int> lanes = AssignLanes(spans);
    for (size_t k = 0; k < idx.size(); ++k) {
      auto key = std::make_pair(track, lanes[k]);
      auto it = threads->tid.find(key);
      if (it == threads->tid.end()) {
        const int tid = static_cast<int>(threads->tid.size());
        it = threads->tid.emplace(key, tid).first;
        threads->names.push_back(
            {tid, lanes[k] == 0 ? track : absl::StrCat(track, " #", lanes[k] + 1)});
      }
      tids[idx[k]] = it->second;
    }
  }
  std::sort(threads->names.begin(), threads->names.end());
  return tids;
}

void AppendEvents(const std::vector<Event>& events, int pid, double shift_us,
                  const std::string& process_name, std::string* out, bool* first) {
  auto sep = [&] {
    if (!*first) *out += ",\n";
    *first = false;
  };
  Threads threads;
  const std::vector<int> tids = LayOut(events, &threads);
  sep();
  absl::StrAppend(out, R"({"ph":"M","pid":)", pid, R"(,"tid":0,"name":"process_name","args":{"name":)",
                  JsonString(process_name), "}}");
  sep();
  absl::StrAppend(out, R"({"ph":"M","pid":)", pid,
                  R"(,"tid":0,"name":"process_sort_index","args":{"sort_index":)", pid, "}}");
  for (const auto& [tid, name] : threads.names) {
    sep();
    absl::StrAppend(out, R"({"ph":"M","pid":)", pid, R"(,"tid":)", tid,
                    R"(,"name":"thread_name","args":{"name":)", JsonString(name), "}}");
    sep();
    absl::StrAppend(out, R"({"ph":"M","pid":)", pid, R"(,"tid":)", tid,
                    R"(,"name":"thread_sort_index","args":{"sort_index":)", tid, "}}");
  }
  for (size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    sep();
    absl::StrAppend(out, R"({"ph":"X","pid":)", pid, R"(,"tid":)", tids[i],
                    R"(,"name":)", JsonString(e.name), R"(,"cat":)", JsonString(e.cat),
                    absl::StrFormat(R"(,"ts":%.3f,"dur":%.3f)", e.ts_us + shift_us, e.dur_us));
    if (!e.args.empty()) absl::StrAppend(out, R"(,"args":)", e.args);
    *out += "}";
  }
}

std::string ProcessName(const RankTrace& r) {
  return r.label.empty() ? absl::StrCat("rank ", r.rank) : r.label;
}

}  // namespace

std::string JsonString(const std::string& s) { return json(s).dump(); }

std::vector<int> AssignLanes(const std::vector<Event>& spans) {
  std::vector<size_t> order(spans.size());
  std::iota(order.begin(), order.end(), 0);
  // By start; at equal starts the longer first, so it can hold the shorter.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (spans[a].ts_us != spans[b].ts_us) return spans[a].ts_us < spans[b].ts_us;
    return spans[a].dur_us > spans[b].dur_us;
  });
  std::vector<std::vector<double>> open;  // per lane: ends of the spans enclosing the cursor
  std::vector<int> lane(spans.size(), 0);
  for (size_t i : order) {
    const double start = spans[i].ts_us, end = start + spans[i].dur_us;
    int chosen = -1;
    for (size_t l = 0; l < open.size() && chosen < 0; ++l) {
      std::vector<double>& stack = open[l];
      while (!stack.empty() && stack.back() <= start) stack.pop_back();
      if (stack.empty() || end <= stack.back()) chosen = static_cast<int>(l);
    }
    if (chosen < 0) {
      chosen = static_cast<int>(open.size());
      open.emplace_back();
    }
    open[chosen].push_back(end);
    lane[i] = chosen;
  }
  return lane;
}

std::string FormatRankTrace(const RankTrace& trace) {
  std::string out = "{\"traceEvents\":[\n";
  bool first = true;
  AppendEvents(trace.events, trace.rank, 0, ProcessName(trace), &out, &first);
  absl::StrAppend(&out, "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"rank\":", trace.rank,
                  ",\"host\":", JsonString(trace.host),
                  absl::StrFormat(",\"sync_us\":%.3f", trace.sync_us),
                  ",\"step_start\":", trace.step_start, ",\"step_end\":", trace.step_end,
                  ",\"clock\":\"CLOCK_MONOTONIC\"}}\n");
  return out;
}

absl::StatusOr<ParsedTrace> ParseTrace(const std::string& text, const std::string& file) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("traceEvents") ||
      !j["traceEvents"].is_array()) {
    return absl::DataLossError(absl::StrCat(
        file, ": not a Chrome trace (expected a JSON object with a \"traceEvents\" array)"));
  }
  ParsedTrace t;
  std::map<std::pair<int, int>, std::string> thread_names;
  for (const json& e : j["traceEvents"]) {
    if (!e.is_object() || !e.contains("ph") || !e["ph"].is_string()) continue;
    const std::string ph = e["ph"].get<std::string>();
    const int pid = e.value("pid", 0), tid = e.value("tid", 0);
    if (ph == "M") {
      const std::string name = e.value("name", "");
      if (!e.contains("args") || !e["args"].is_object() || !e["args"].contains("name")) continue;
      if (name == "thread_name") thread_names[{pid, tid}] = e["args"]["name"].get<std::string>();
      if (name == "process_name") t.processes.push_back({pid, e["args"]["name"].get<std::string>()});
      continue;
    }
    if (ph != "X") continue;
    if (!e.contains("ts") || !e["ts"].is_number() || !e.contains("dur") || !e["dur"].is_number()) {
      return absl::DataLossError(absl::StrCat(file, ": an \"X\" event without numeric ts/dur: ",
                                              e.dump()));
    }
    Event ev;
    ev.pid = pid;
    ev.name = e.value("name", "");
    ev.cat = e.value("cat", "");
    ev.ts_us = e["ts"].get<double>();
    ev.dur_us = e["dur"].get<double>();
    if (e.contains("args")) ev.args = e["args"].dump();
    ev.track = absl::StrCat(tid);  // replaced by the thread's name below
    t.events.push_back(std::move(ev));
  }
  for (Event& ev : t.events) {
    const int tid = std::stoi(ev.track);
    auto it = thread_names.find({ev.pid, tid});
    if (it != thread_names.end()) ev.track = it->second;
  }
  std::stable_sort(t.events.begin(), t.events.end(), [](const Event& a, const Event& b) {
    return a.pid != b.pid ? a.pid < b.pid : a.ts_us < b.ts_us;
  });
  std::sort(t.processes.begin(), t.processes.end());
  return t;
}

absl::StatusOr<RankTrace> ParseRankTrace(const std::string& text, const std::string& file) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("otherData") ||
      !j["otherData"].is_object() || !j["otherData"].contains("rank") ||
      !j["otherData"].contains("sync_us")) {
    return absl::DataLossError(absl::StrCat(
        file, ": not a rank trace of //profile (expected otherData.rank and otherData.sync_us)"));
  }
  const json& o = j["otherData"];
  RankTrace r;
  r.rank = o["rank"].get<int>();
  r.host = o.value("host", "");
  r.sync_us = o["sync_us"].get<double>();
  r.step_start = o.value("step_start", int64_t{0});
  r.step_end = o.value("step_end", int64_t{0});
  absl::StatusOr<ParsedTrace> t = ParseTrace(text, file);
  if (!t.ok()) return t.status();
  r.events = std::move(t->events);
  // Lanes are a drawing detail: merge them back into their track.
  for (Event& e : r.events) {
    const size_t hash = e.track.rfind(" #");
    if (hash != std::string::npos) e.track.resize(hash);
  }
  return r;
}

std::string FormatMergedTrace(const std::vector<RankTrace>& ranks) {
  std::string out = "{\"traceEvents\":[\n";
  bool first = true;
  const RankTrace* zero = nullptr;
  for (const RankTrace& r : ranks) {
    if (zero == nullptr || r.rank < zero->rank) zero = &r;
  }
  // Time 0: the first of rank 0's host's ranks to leave the window's barrier.
  double base = zero ? zero->sync_us : 0;
  for (const RankTrace& r : ranks) {
    if (zero && r.host == zero->host) base = std::min(base, r.sync_us);
  }
  std::vector<std::string> aligned;
  for (const RankTrace& r : ranks) {
    double shift = -base;
    if (zero && r.host != zero->host) {
      // Another host: its barrier exit is taken as rank 0's.
      shift = zero->sync_us - base - r.sync_us;
      aligned.push_back(absl::StrCat(r.rank));
    }
    AppendEvents(r.events, r.rank, shift, ProcessName(r), &out, &first);
  }
  absl::StrAppend(&out, "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"ranks\":",
                  ranks.size(), ",\"host\":", JsonString(zero ? zero->host : ""),
                  ",\"step_start\":", zero ? zero->step_start : 0,
                  ",\"step_end\":", zero ? zero->step_end : 0,
                  ",\"clock\":", JsonString(aligned.empty()
                                                ? "CLOCK_MONOTONIC of one host, 0 = the first "
                                                  "rank out of the window's barrier"
                                                : "CLOCK_MONOTONIC per host, aligned at the "
                                                  "window barrier"),
                  "}}\n");
  return out;
}

}  // namespace loom::profile
