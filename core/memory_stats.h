#ifndef LOOM_CORE_MEMORY_STATS_H_
#define LOOM_CORE_MEMORY_STATS_H_

// Memory as a number: bytes per category (parameters, gradients, optimizer
// state, activations, communication buffers, other), now and at their peak,
// per rank.
//
// Every Storage::Allocate (core/storage.h) charges a *ledger* under a
// *category*, both read from the allocating thread:
//
//   auto ledger = std::make_shared<core::MemoryLedger>();
//   core::LedgerScope use(ledger);      // this thread charges `ledger`
//   {
//     core::MemoryScope tag(core::MemoryCategory::kActivations);
//     ... allocations here are activations (innermost scope wins) ...
//   }
//   int64_t peak = ledger->Stats().peak_of(core::MemoryCategory::kActivations);
//
// The storage remembers its ledger and category, so its free is charged to
// the same ones whichever thread frees it (and keeps the ledger alive). A
// thread with no LedgerScope charges the process ledger; with no MemoryScope,
// kOther. Ranks that are threads of one process (--distributed-backend=local)
// each set their own ledger: the stats are per rank, not per process.
//
// Bytes are the tensors' bytes (what Storage::Allocate was asked for), kept
// per device type: a CUDA run's device memory is Stats(DeviceType::kCUDA).
// A device allocator's own view (block sizes, cached bytes) is
// Allocator::DeviceMemoryStats (core/storage.h).
//
// Cost: a few relaxed atomic adds per allocation and free, plus a
// compare-and-swap when a peak rises. Concurrent updates of one ledger are
// exact for `current`; a peak is the largest value some update observed.

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "core/device.h"

namespace loom::core {

enum class MemoryCategory : int {
  kParameters = 0,  // weights: the f32 master copy and the compute (bf16) copy
  kGradients,       // the flat gradient buffer
  kOptimizer,       // Adam moments
  kActivations,     // what the forward keeps for the backward, and the backward's temporaries
  kCommunication,   // staging and receive buffers of collectives
  kOther,           // everything untagged
};
inline constexpr int kNumMemoryCategories = 6;

// "parameters", "gradients", "optimizer", "activations", "communication", "other".
const char* MemoryCategoryName(MemoryCategory category);

// A copy of a ledger's counters for one device type.
struct MemoryStats {
  std::array<int64_t, kNumMemoryCategories> current{};  // bytes held now
  std::array<int64_t, kNumMemoryCategories> peak{};     // most held since creation / ResetPeak
  int64_t total_current = 0;
  int64_t total_peak = 0;  // peak of the sum (<= the sum of the category peaks)
  // A caching device allocator's reserved bytes (in use + cached); 0 when
  // not filled in (the CPU, or stats that come from a ledger).
  int64_t reserved = 0;

  int64_t current_of(MemoryCategory c) const { return current[static_cast<int>(c)]; }
  int64_t peak_of(MemoryCategory c) const { return peak[static_cast<int>(c)]; }
};

// Per-category byte counters of one rank (or the process), per device type.
// Thread-safe; never blocks.
class MemoryLedger {
 public:
  MemoryLedger() = default;
  MemoryLedger(const MemoryLedger&) = delete;
  MemoryLedger& operator=(const MemoryLedger&) = delete;

  void Allocated(DeviceType device, MemoryCategory category, int64_t bytes);
  void Freed(DeviceType device, MemoryCategory category, int64_t bytes);
  MemoryStats Stats(DeviceType device = DeviceType::kCPU) const;
  // Peaks := current values (every category and device type): from here on
  // the peaks are those of what follows (e.g. the steps after the setup).
  void ResetPeak();

 private:
  struct Counter {
    std::atomic<int64_t> current{0};
    std::atomic<int64_t> peak{0};
    void Add(int64_t bytes);
  };
  struct Account {
    std::array<Counter, kNumMemoryCategories> categories;
    Counter total;
  };
  std::array<Account, 2> accounts_;  // by DeviceType
};

// The ledger of threads that set none (never destroyed).
const std::shared_ptr<MemoryLedger>& ProcessMemoryLedger();
// The calling thread's ledger: the innermost LedgerScope's, else the process's.
const std::shared_ptr<MemoryLedger>& CurrentMemoryLedger();
// The calling thread's category: the innermost MemoryScope's, else kOther.
MemoryCategory CurrentMemoryCategory();

// Makes `ledger` the calling thread's until destroyed (then the previous one
// again). Scopes nest; create and destroy on the same thread.
class LedgerScope {
 public:
  explicit LedgerScope(std::shared_ptr<MemoryLedger> ledger);
  ~LedgerScope();
  LedgerScope(const LedgerScope&) = delete;
  LedgerScope& operator=(const LedgerScope&) = delete;

 private:
  std::shared_ptr<MemoryLedger> ledger_;
  const std::shared_ptr<MemoryLedger>* previous_;
};

// Tags the calling thread's allocations with `category` until destroyed;
// nested scopes: the innermost wins. Create and destroy on the same thread.
class MemoryScope {
 public:
  explicit MemoryScope(MemoryCategory category);
  ~MemoryScope();
  MemoryScope(const MemoryScope&) = delete;
  MemoryScope& operator=(const MemoryScope&) = delete;

 private:
  MemoryCategory previous_;
};

// "12.5 MiB", "1.25 GiB", "512 B": binary units, 3 significant digits.
std::string FormatBytes(int64_t bytes);

}  // namespace loom::core

#endif  // LOOM_CORE_MEMORY_STATS_H_
