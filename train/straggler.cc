#include "train/straggler.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "core/tensor.h"

namespace loom::train {
namespace {

// Bytes per host name in the one-time gather (longer names are cut).
constexpr int64_t kHostBytes = 64;

std::string ThisHost() {
  char name[kHostBytes] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

RankTime Entry(int rank, const std::vector<double>& ms, const std::vector<std::string>& hosts,
               double median) {
  RankTime t;
  t.rank = rank;
  t.ms = ms[rank];
  t.slowdown = median > 0      ? ms[rank] / median
               : ms[rank] > 0 ? std::numeric_limits<double>::infinity()
                              : 1.0;
  if (static_cast<size_t>(rank) < hosts.size()) t.host = hosts[rank];
  return t;
}

std::string FormatList(const std::vector<RankTime>& list) {
  std::vector<std::string> parts;
  for (const RankTime& t : list) {
    parts.push_back(absl::StrFormat("rank %d%s %.1f ms %.2fx", t.rank,
                                    t.host.empty() ? "" : absl::StrCat(" (host ", t.host, ")"),
                                    t.ms, t.slowdown));
  }
  return absl::StrJoin(parts, ", ");
}

}  // namespace

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  const size_t n = values.size(), mid = n / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  if (n % 2 == 1) return values[mid];
  // The even count's lower middle is the largest of the lower half.
  const double upper = values[mid];
  const double lower = *std::max_element(values.begin(), values.begin() + mid);
  return (lower + upper) / 2;
}

StragglerReport MakeStragglerReport(int64_t iteration, const std::vector<double>& ms,
                                    const std::vector<std::string>& hosts, int minmax_count) {
  StragglerReport r;
  r.iteration = iteration;
  r.ranks = static_cast<int>(ms.size());
  r.median_ms = Median(ms);
  std::vector<int> order(ms.size());
  std::iota(order.begin(), order.end(), 0);
  // Equal times list the lower rank first, both ways: the same line on every run.
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return ms[a] > ms[b] || (ms[a] == ms[b] && a < b); });
  const int k = std::clamp(minmax_count, 0, r.ranks);
  for (int i = 0; i < k; ++i) r.slowest.push_back(Entry(order[i], ms, hosts, r.median_ms));
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return ms[a] < ms[b] || (ms[a] == ms[b] && a < b); });
  for (int i = 0; i < k; ++i) r.fastest.push_back(Entry(order[i], ms, hosts, r.median_ms));
  return r;
}

std::string FormatStragglerReport(const StragglerReport& r) {
  return absl::StrFormat(
      " straggler: iteration %d: median compute %.1f ms/iteration over %d rank%s; slowest %s; "
      "fastest %s",
      r.iteration, r.median_ms, r.ranks, r.ranks == 1 ? "" : "s", FormatList(r.slowest),
      FormatList(r.fastest));
}

StragglerDetector::StragglerDetector(bool enabled, int minmax_count, Clock clock)
    : enabled_(enabled), minmax_count_(minmax_count), clock_(std::move(clock)) {}

int64_t StragglerDetector::Now() const {
  if (clock_) return clock_();
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void StragglerDetector::Start() {
  if (!enabled_ || running_) return;
  running_ = true;
  started_ns_ = Now();
}

void StragglerDetector::Stop() {
  if (!enabled_ || !running_) return;
  running_ = false;
  elapsed_ns_ += Now() - started_ns_;
}

absl::StatusOr<StragglerReport> StragglerDetector::Report(comm::Communicator* world,
                                                          int64_t iteration, int64_t iterations) {
  if (!enabled_) return StragglerReport{};
  using core::DType;
  using core::Shape;
  using core::Tensor;
  const int n = world->size();
  if (hosts_.empty()) {
    // Once: the names do not change, and a rank's host is what a reader
    // needs to find the machine.
    LOOM_ASSIGN_OR_RETURN(Tensor mine, Tensor::Zeros(Shape{kHostBytes}, DType::kU8));
    const std::string host = ThisHost();
    std::memcpy(mine.data<uint8_t>(), host.data(),
                std::min<size_t>(host.size(), kHostBytes - 1));
    Tensor all = mine;
    if (n > 1) {
      LOOM_ASSIGN_OR_RETURN(all, Tensor::Zeros(Shape{kHostBytes * n}, DType::kU8));
      LOOM_RETURN_IF_ERROR(comm::AllGatherHost(world, mine, all));
    }
    for (int r = 0; r < n; ++r) {
      const char* name = reinterpret_cast<const char*>(all.data<uint8_t>() + r * kHostBytes);
      hosts_.emplace_back(name, strnlen(name, kHostBytes));
    }
  }
  LOOM_ASSIGN_OR_RETURN(Tensor mine, Tensor::Empty(Shape{1}, DType::kF64));
  const double per_iteration = static_cast<double>(std::max<int64_t>(1, iterations));
  mine.data<double>()[0] = static_cast<double>(elapsed_ns_) / 1e6 / per_iteration;
  elapsed_ns_ = 0;
  Tensor all = mine;
  if (n > 1) {
    LOOM_ASSIGN_OR_RETURN(all, Tensor::Empty(Shape{n}, DType::kF64));
    LOOM_RETURN_IF_ERROR(comm::AllGatherHost(world, mine, all));
  }
  const std::vector<double> ms(all.data<double>(), all.data<double>() + n);
  return MakeStragglerReport(iteration, ms, hosts_, minmax_count_);
}

}  // namespace loom::train
