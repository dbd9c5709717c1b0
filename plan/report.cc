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
      "%-4s %-44s %7s %7s %7s %7s %7s %8s %4s %9s %9s %9s %9s %11s %6s\n", "#", "layout",
      "param", "grad", "optim", "activ", "comm", "GiB/rank", "fits", "step s", "compute",
      "comm", "bubble", "tokens/s", "MFU");
  size_t n = 0;
  for (const Planned& p : plans) {
    if (rows > 0 && n >= rows) break;
    ++n;
    const MemoryBreakdown& m = p.memory.bytes;
    absl::StrAppendFormat(&s,
                          "%-4d %-44s %7.2f %7.2f %7.2f %7.2f %7.2f %8.2f %4s %9.4g %9.4g %9.4g "
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

std::string Explain(const Planned& p, const Hardware& hw) {
  return absl::StrCat("layout: ", DescribeLayout(p.config), "\n//train:gpt flags: ",
                      LayoutFlags(p.config), "\n", ExplainMemory(p.config, p.memory),
                      ExplainTime(p.config, hw, p.time));
}

}  // namespace loom::plan
