#include "comm/testing/ranks_as_threads.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace loom::comm::testing {

namespace {

absl::Status OfRank(int r, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("rank ", r, ": ", s.message()));
}

}  // namespace

RankStatuses RunThreads(int n, const std::function<absl::Status(int rank)>& fn) {
  RankStatuses out;
  n = std::max(n, 0);
  out.each.resize(n);
  std::mutex mu;
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      absl::Status s = fn(r);
      std::lock_guard<std::mutex> lock(mu);
      if (!s.ok() && out.first.ok()) out.first = OfRank(r, s);
      out.each[r] = std::move(s);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < n && out.lowest.ok(); ++r) {
    if (!out.each[r].ok()) out.lowest = OfRank(r, out.each[r]);
  }
  return out;
}

RankStatuses RunRanksAsThreadsEach(
    int world_size, const std::function<absl::Status(int rank, Communicator* comm)>& fn,
    const local::LocalOptions& options) {
  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> world =
      world_size >= 1 ? local::CreateWorld(world_size, options)
                      : absl::InvalidArgumentError(absl::StrCat(
                            "ranks as threads: world size ", world_size, " (at least 1 rank)"));
  if (!world.ok()) {
    RankStatuses out;
    out.each.assign(std::max(world_size, 0), world.status());
    out.first = out.lowest = world.status();
    return out;
  }
  return RunThreads(world_size, [&](int r) { return fn(r, (*world)[r].get()); });
}

absl::Status RunRanksAsThreads(
    int world_size, const std::function<absl::Status(int rank, Communicator* comm)>& fn,
    const local::LocalOptions& options) {
  return RunRanksAsThreadsEach(world_size, fn, options).first;
}

}  // namespace loom::comm::testing
