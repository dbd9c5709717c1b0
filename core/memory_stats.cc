#include "core/memory_stats.h"

#include <cstdio>
#include <utility>

namespace loom::core {
namespace {

// Trivially destructible thread-locals: no TLS wrapper on the hot path.
// The ledger pointer aims at the innermost LedgerScope's shared_ptr, which
// lives on that thread's stack while it is current.
thread_local const std::shared_ptr<MemoryLedger>* t_ledger = nullptr;
thread_local MemoryCategory t_category = MemoryCategory::kOther;

}  // namespace

const char* MemoryCategoryName(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::kParameters:
      return "parameters";
    case MemoryCategory::kGradients:
      return "gradients";
    case MemoryCategory::kOptimizer:
      return "optimizer";
    case MemoryCategory::kActivations:
      return "activations";
    case MemoryCategory::kCommunication:
      return "communication";
    case MemoryCategory::kOther:
      return "other";
  }
  return "?";
}

void MemoryLedger::Counter::Add(int64_t bytes) {
  const int64_t now = current.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  if (bytes <= 0) return;
  int64_t seen = peak.load(std::memory_order_relaxed);
  while (now > seen &&
         !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

void MemoryLedger::Allocated(DeviceType device, MemoryCategory category, int64_t bytes) {
  Account& a = accounts_[static_cast<int>(device)];
  a.categories[static_cast<int>(category)].Add(bytes);
  a.total.Add(bytes);
}

void MemoryLedger::Freed(DeviceType device, MemoryCategory category, int64_t bytes) {
  Account& a = accounts_[static_cast<int>(device)];
  a.categories[static_cast<int>(category)].Add(-bytes);
  a.total.Add(-bytes);
}

MemoryStats MemoryLedger::Stats(DeviceType device) const {
  const Account& a = accounts_[static_cast<int>(device)];
  MemoryStats s;
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    s.current[c] = a.categories[c].current.load(std::memory_order_relaxed);
    s.peak[c] = a.categories[c].peak.load(std::memory_order_relaxed);
  }
  s.total_current = a.total.current.load(std::memory_order_relaxed);
  s.total_peak = a.total.peak.load(std::memory_order_relaxed);
  return s;
}

void MemoryLedger::ResetPeak() {
  for (Account& a : accounts_) {
    for (Counter& c : a.categories) {
      c.peak.store(c.current.load(std::memory_order_relaxed), std::memory_order_relaxed);
    }
    a.total.peak.store(a.total.current.load(std::memory_order_relaxed),
                       std::memory_order_relaxed);
  }
}

const std::shared_ptr<MemoryLedger>& ProcessMemoryLedger() {
  static const std::shared_ptr<MemoryLedger>* ledger =
      new std::shared_ptr<MemoryLedger>(std::make_shared<MemoryLedger>());
  return *ledger;
}

const std::shared_ptr<MemoryLedger>& CurrentMemoryLedger() {
  return t_ledger != nullptr ? *t_ledger : ProcessMemoryLedger();
}

MemoryCategory CurrentMemoryCategory() { return t_category; }

LedgerScope::LedgerScope(std::shared_ptr<MemoryLedger> ledger)
    : ledger_(std::move(ledger)), previous_(t_ledger) {
  t_ledger = ledger_ ? &ledger_ : nullptr;
}

LedgerScope::~LedgerScope() { t_ledger = previous_; }

MemoryScope::MemoryScope(MemoryCategory category) : previous_(t_category) {
  t_category = category;
}

MemoryScope::~MemoryScope() { t_category = previous_; }

std::string FormatBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes < 0 ? -bytes : bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof(buf), "%s%lld B", bytes < 0 ? "-" : "",
                  static_cast<long long>(v));
  } else {
    std::snprintf(buf, sizeof(buf), "%s%.*f %s", bytes < 0 ? "-" : "",
                  v >= 100 ? 0 : v >= 10 ? 1 : 2, v, units[u]);
  }
  return buf;
}

}  // namespace loom::core
