#include "train/fault_injection.h"

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "checkpoint/writer.h"

namespace loom::train {
namespace {

// Global ranks armed by BeforeSave; the shard writer's hook kills the
// process when one of them writes its shard. Process-wide, as the hook is.
std::mutex g_mu;
std::set<int>* g_armed_save_ranks = new std::set<int>();
std::string* g_armed_description = new std::string();

void Announce(const std::string& what) {
  std::fprintf(stderr, "loom: %s fires: %s\n", kFaultVariable, what.c_str());
  std::fflush(nullptr);  // every stream: the logs so far survive the fault
}

void KillDuringShardWrite(const std::string& path, int global_rank) {
  std::string description;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_armed_save_ranks->count(global_rank) == 0) return;
    description = *g_armed_description;
  }
  Announce(absl::StrCat(description, " (SIGKILL with ", path, " half written)"));
  std::raise(SIGKILL);
}

}  // namespace

absl::StatusOr<FaultInjector> FaultInjector::Create(absl::string_view spec, int global_rank,
                                                    int restart_count) {
  absl::StatusOr<std::vector<Fault>> faults = ParseFaults(spec);
  if (!faults.ok()) return faults.status();
  FaultInjector injector;
  for (const Fault& f : *faults) {
    if (f.global_rank == global_rank &&
        (f.attempt == Fault::kAnyAttempt || f.attempt == restart_count)) {
      injector.faults_.push_back(f);
    }
  }
  return injector;
}

absl::Status FaultInjector::FireAtStep(int64_t iteration, comm::Communicator* world) {
  for (const Fault& f : faults_) {
    if (f.iteration != iteration || f.kind == FaultKind::kSave || f.kind == FaultKind::kSlow) {
      continue;
    }
    switch (f.kind) {
      case FaultKind::kExit:
        Announce(absl::StrCat(f.Describe(), " (exit status 3)"));
        std::_Exit(3);  // no destructors: the other rank threads are still running
      case FaultKind::kSigkill:
        Announce(f.Describe());
        std::raise(SIGKILL);
        break;
      case FaultKind::kHang:
        Announce(absl::StrCat(f.Describe(), " (no more heartbeats; sleeping forever)"));
        for (;;) ::sleep(3600);
      case FaultKind::kCollective: {
        Announce(absl::StrCat(f.Describe(), " (a barrier on the world no other rank joins)"));
        absl::Status s = world->Barrier()->Wait();
        return absl::AbortedError(absl::StrCat(
            kFaultVariable, " ", f.Describe(), ": the unmatched barrier ended with: ",
            s.ok() ? std::string("OK (another rank's collective matched it)") : s.ToString()));
      }
      case FaultKind::kSave:
      case FaultKind::kSlow:
        break;
    }
  }
  return absl::OkStatus();
}

void FaultInjector::SlowDown(int64_t iteration) {
  slow_announced_.resize(faults_.size(), false);
  for (size_t i = 0; i < faults_.size(); ++i) {
    const Fault& f = faults_[i];
    if (f.kind != FaultKind::kSlow || iteration < f.iteration) continue;
    if (!slow_announced_[i]) {
      // Once: every later step sleeps as well, and a line per step would
      // drown the log. A resumed run announces at its first step.
      slow_announced_[i] = true;
      Announce(absl::StrCat(f.Describe(), " (sleeping ", f.delay_ms, " ms in the forward-backward "
                            "of iteration ", iteration, " and every later step)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(f.delay_ms));
  }
}

void FaultInjector::ArmSave(int64_t iteration) {
  for (const Fault& f : faults_) {
    if (f.kind != FaultKind::kSave || f.iteration != iteration) continue;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      g_armed_save_ranks->insert(f.global_rank);
      *g_armed_description = f.Describe();
    }
    checkpoint::SetShardWriteHookForTesting(&KillDuringShardWrite);
  }
}

}  // namespace loom::train
