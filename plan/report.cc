#include "plan/report.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace loom::plan {

absl::StatusOr<std::vector<Planned>> PlanAll(const train::TrainConfig& base, const Hardware& hw,
                                             const SearchOptions& search,
                                             const TimeOptions& time, int* rejected,
                                             std::string* first_error) {
  std::vector<Planned> out;
  for (train::TrainConfig& c : EnumerateLayouts(base, search, rejected, first_error)) {
    Planned p;
    p.config = std::move(c);
    absl::StatusOr<StepTime> t = PredictStepTime(p.config, hw, time);
    if (!t.ok()) return t.status();
    p.time = *t;
    p.memory = PeakMemory(PredictMemory(p.config, p.time.in_flight));
    // Ranks that share a host (ranks_share_compute) share its memory too.
    const double share =
        hw.ranks_share_compute() ? std::min(p.config.world_size, std::max(1, hw.devices_per_node()))
                                 : 1;
    p.fits = p.memory.bytes.total() <= hw.device_memory_bytes() / share;
    out.push_back(std::move(p));
  }
  std::stable_sort(out.begin(), out.end(), [](const Planned& a, const Planned& b) {
    if (a.fits != b.fits) return a.fits;
    return a.time.step < b.time.step;
  });
  return out;
}

std::string FormatTable(const std::vector<Planned>& plans, const Hardware& hw, size_t rows) {
  const double gib = 1024.0 * 1024 * 1024;
  std::string s = absl::StrFormat(
      "%-4s %-54s %7s %7s %7s %7s %7s %8s %4s %9s %9s %9s %9s %11s %6s\n", "#", "layout",
      "param", "grad", "optim", "activ", "comm", "GiB/rank", "fits", "step s", "compute",
      "comm", "bubble", "tokens/s", "MFU");
  size_t n = 0;
  for (const Planned& p : plans) {
    if (rows > 0 && n >= rows) break;
    ++n;
    const MemoryBreakdown& m = p.memory.bytes;
    absl::StrAppendFormat(&s,
                          "%-4d %-54s %7.2f %7.2f %7.2f %7.2f %7.2f %8.2f %4s %9.4g %9.4g %9.4g "
                          "%9.4g %11.5g %5.1f%%\n",
                          static_cast<int>(n), DescribeLayout(p.config), m.parameters / gib,
                          m.gradients / gib, m.optimizer / gib, m.activations / gib,
                          m.communication / gib, m.total() / gib, p.fits ? "yes" : "NO",
                          p.time.step, p.time.compute, p.time.exposed_comm, p.time.bubble,
                          p.time.tokens_per_s, 100 * p.time.mfu);
  }
  absl::StrAppendFormat(&s,
                        "(memory: GiB per rank on the largest pipeline stage, of %.1f GiB; time: "
                        "seconds per step on %s)\n",
                        hw.device_memory_bytes() / gib, hw.name());
  return s;
}

namespace {

// The term (0 compute, 1 exposed communication, 2 bubble) by which `p` is
// slowest against `best`, and the three differences in seconds.
int LosingTerm(const Planned& p, const Planned& best, double diff[3]) {
  diff[0] = p.time.compute - best.time.compute;
  diff[1] = p.time.exposed_comm - best.time.exposed_comm;
  diff[2] = p.time.bubble - best.time.bubble;
  int term = 0;
  for (int i = 1; i < 3; ++i) {
    if (diff[i] > diff[term]) term = i;
  }
  return term;
}

}  // namespace

std::string WhyTheyLose(const std::vector<Planned>& plans, const Hardware& hw, size_t rows) {
  if (plans.empty() || !plans.front().fits) {
    return "why the rest lose: no layout fits in memory\n";
  }
  const char* kTerms[3] = {"compute", "exposed communication", "bubble"};
  const char* kCategories[5] = {"parameters", "gradients", "optimizer", "activations",
                                "communication"};
  const Planned& best = plans.front();
  int misfits = 0, by_category[5] = {0, 0, 0, 0, 0}, by_term[3] = {0, 0, 0};
  for (size_t i = 1; i < plans.size(); ++i) {
    const Planned& p = plans[i];
    if (!p.fits) {
      ++misfits;
      const MemoryBreakdown& m = p.memory.bytes;
      const double bytes[5] = {m.parameters, m.gradients, m.optimizer, m.activations,
                               m.communication};
      ++by_category[std::max_element(bytes, bytes + 5) - bytes];
      continue;
    }
    double diff[3];
    ++by_term[LosingTerm(p, best, diff)];
  }
  const double gib = 1024.0 * 1024 * 1024;
  std::string s = absl::StrFormat("why the rest lose against #1 (%s, step %.4g s):\n",
                                  DescribeLayout(best.config), best.time.step);
  if (misfits > 0) {
    absl::StrAppendFormat(&s, "  %d do not fit in %.1f GiB; their largest category:", misfits,
                          hw.device_memory_bytes() / gib);
    for (int c = 0; c < 5; ++c) {
      if (by_category[c] > 0) absl::StrAppendFormat(&s, " %s %d", kCategories[c], by_category[c]);
    }
    s += "\n";
  }
  const int slower = by_term[0] + by_term[1] + by_term[2];
  if (slower > 0) {
    absl::StrAppendFormat(&s,
                          "  %d fit and are slower, mostly by: compute %d, exposed communication "
                          "%d, bubble %d\n",
                          slower, by_term[0], by_term[1], by_term[2]);
  }
  for (size_t i = 1; i < plans.size() && (rows == 0 || i < rows); ++i) {
    const Planned& p = plans[i];
    if (!p.fits) break;
    double diff[3];
    const int term = LosingTerm(p, best, diff);
    absl::StrAppendFormat(&s,
                          "  #%zu %s: %+.1f%% step, compute %+.3f s, exposed communication %+.3f "
                          "s, bubble %+.3f s (mostly %s)\n",
                          i + 1, DescribeLayout(p.config), 100 * (p.time.step / best.time.step - 1),
                          diff[0], diff[1], diff[2], kTerms[term]);
  }
  return s;
}

std::string Explain(const Planned& p, const Hardware& hw) {
  return absl::StrCat("layout: ", DescribeLayout(p.config), "\n//train:gpt flags: ",
                      LayoutFlags(p.config), "\n", ExplainMemory(p.config, p.memory),
                      ExplainTime(p.config, hw, p.time));
}

}  // namespace loom::plan
