#include "core/memory_stats.h"

#include <memory>
#include <thread>
#include <vector>

#include "core/tensor.h"
#include "gtest/gtest.h"

namespace loom::core {
namespace {

using C = MemoryCategory;

TEST(MemoryStatsTest, CategoryNames) {
  EXPECT_STREQ(MemoryCategoryName(C::kParameters), "parameters");
  EXPECT_STREQ(MemoryCategoryName(C::kGradients), "gradients");
  EXPECT_STREQ(MemoryCategoryName(C::kOptimizer), "optimizer");
  EXPECT_STREQ(MemoryCategoryName(C::kActivations), "activations");
  EXPECT_STREQ(MemoryCategoryName(C::kCommunication), "communication");
  EXPECT_STREQ(MemoryCategoryName(C::kOther), "other");
}

TEST(MemoryStatsTest, LedgerCountsCurrentAndPeak) {
  MemoryLedger ledger;
  ledger.Allocated(DeviceType::kCPU, C::kActivations, 100);
  ledger.Allocated(DeviceType::kCPU, C::kActivations, 50);
  ledger.Freed(DeviceType::kCPU, C::kActivations, 100);
  ledger.Allocated(DeviceType::kCPU, C::kParameters, 30);
  MemoryStats s = ledger.Stats();
  EXPECT_EQ(s.current_of(C::kActivations), 50);
  EXPECT_EQ(s.peak_of(C::kActivations), 150);
  EXPECT_EQ(s.current_of(C::kParameters), 30);
  EXPECT_EQ(s.peak_of(C::kParameters), 30);
  EXPECT_EQ(s.total_current, 80);
  EXPECT_EQ(s.total_peak, 150);  // the peak of the sum, not the sum of the peaks
  // Device types are separate accounts.
  EXPECT_EQ(ledger.Stats(DeviceType::kCUDA).total_peak, 0);

  ledger.ResetPeak();
  s = ledger.Stats();
  EXPECT_EQ(s.peak_of(C::kActivations), 50);
  EXPECT_EQ(s.total_peak, 80);
  ledger.Allocated(DeviceType::kCPU, C::kActivations, 10);
  EXPECT_EQ(ledger.Stats().peak_of(C::kActivations), 60);
  EXPECT_EQ(ledger.Stats().total_peak, 90);
}

TEST(MemoryStatsTest, StorageChargesTheCurrentLedgerAndCategory) {
  auto ledger = std::make_shared<MemoryLedger>();
  LedgerScope use(ledger);
  EXPECT_EQ(CurrentMemoryLedger(), ledger);
  EXPECT_EQ(CurrentMemoryCategory(), C::kOther);
  Tensor weights, acts, untagged;
  {
    MemoryScope tag(C::kParameters);
    weights = *Tensor::Empty(Shape{256}, DType::kF32);  // 1 KiB
    {
      MemoryScope inner(C::kActivations);  // innermost wins
      acts = *Tensor::Empty(Shape{64}, DType::kF32);
    }
    EXPECT_EQ(CurrentMemoryCategory(), C::kParameters);
  }
  untagged = *Tensor::Empty(Shape{8}, DType::kF64);
  MemoryStats s = ledger->Stats();
  EXPECT_EQ(s.current_of(C::kParameters), 1024);
  EXPECT_EQ(s.current_of(C::kActivations), 256);
  EXPECT_EQ(s.current_of(C::kOther), 64);
  EXPECT_EQ(s.total_current, 1024 + 256 + 64);

  // Views share the storage: no new bytes; the last view frees them, to
  // the category they were allocated under (not the one current now).
  Tensor view = *weights.Narrow(0, 16);
  EXPECT_EQ(ledger->Stats().total_current, 1024 + 256 + 64);
  {
    MemoryScope tag(C::kOptimizer);
    weights = Tensor();
    EXPECT_EQ(ledger->Stats().current_of(C::kParameters), 1024);
    view = Tensor();
  }
  s = ledger->Stats();
  EXPECT_EQ(s.current_of(C::kParameters), 0);
  EXPECT_EQ(s.peak_of(C::kParameters), 1024);
  EXPECT_EQ(s.current_of(C::kOptimizer), 0);
  EXPECT_EQ(s.total_peak, 1024 + 256 + 64);
}

TEST(MemoryStatsTest, SetMemoryCategoryMovesTheBytes) {
  auto ledger = std::make_shared<MemoryLedger>();
  LedgerScope use(ledger);
  MemoryScope tag(C::kParameters);
  Tensor grads = *Tensor::Empty(Shape{100}, DType::kF32);
  grads.storage()->set_memory_category(C::kGradients);
  EXPECT_EQ(grads.storage()->memory_category(), C::kGradients);
  MemoryStats s = ledger->Stats();
  EXPECT_EQ(s.current_of(C::kParameters), 0);
  EXPECT_EQ(s.current_of(C::kGradients), 400);
  EXPECT_EQ(s.total_peak, 400);  // moving does not raise the total
  grads = Tensor();
  EXPECT_EQ(ledger->Stats().current_of(C::kGradients), 0);
}

TEST(MemoryStatsTest, ScopesRestoreThePreviousLedger) {
  auto outer = std::make_shared<MemoryLedger>();
  auto inner = std::make_shared<MemoryLedger>();
  EXPECT_EQ(CurrentMemoryLedger(), ProcessMemoryLedger());
  {
    LedgerScope a(outer);
    {
      LedgerScope b(inner);
      EXPECT_EQ(CurrentMemoryLedger(), inner);
    }
    EXPECT_EQ(CurrentMemoryLedger(), outer);
  }
  EXPECT_EQ(CurrentMemoryLedger(), ProcessMemoryLedger());
}

TEST(MemoryStatsTest, LedgerOutlivesItsOwnerWhileItsStorageLives) {
  Tensor t;
  std::weak_ptr<MemoryLedger> weak;
  {
    auto ledger = std::make_shared<MemoryLedger>();
    weak = ledger;
    LedgerScope use(ledger);
    t = *Tensor::Empty(Shape{4}, DType::kF32);
  }
  EXPECT_FALSE(weak.expired());
  t = Tensor();
  EXPECT_TRUE(weak.expired());
}

// Ranks as threads: each thread's ledger sees its own allocations only,
// whichever thread frees them.
TEST(MemoryStatsTest, PerThreadLedgers) {
  constexpr int kRanks = 4;
  std::vector<std::shared_ptr<MemoryLedger>> ledgers;
  for (int r = 0; r < kRanks; ++r) ledgers.push_back(std::make_shared<MemoryLedger>());
  std::vector<Tensor> kept(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      LedgerScope use(ledgers[r]);
      MemoryScope tag(C::kActivations);
      for (int i = 0; i < 1000; ++i) {
        Tensor t = *Tensor::Empty(Shape{(r + 1) * 16}, DType::kF32);  // freed at once
      }
      kept[r] = *Tensor::Empty(Shape{(r + 1) * 256}, DType::kF32);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    const MemoryStats s = ledgers[r]->Stats();
    EXPECT_EQ(s.current_of(C::kActivations), (r + 1) * 1024) << "rank " << r;
    EXPECT_EQ(s.peak_of(C::kActivations), (r + 1) * 1024) << "rank " << r;
  }
  kept.clear();  // freed on this thread: still charged to each rank's ledger
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(ledgers[r]->Stats().total_current, 0);
}

// Concurrent updates of one ledger: `current` is exact.
TEST(MemoryStatsTest, ConcurrentUpdatesOfOneLedger) {
  MemoryLedger ledger;
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        ledger.Allocated(DeviceType::kCPU, C::kCommunication, 8);
        ledger.Freed(DeviceType::kCPU, C::kCommunication, 8);
      }
      ledger.Allocated(DeviceType::kCPU, C::kCommunication, 8);
    });
  }
  for (std::thread& t : threads) t.join();
  const MemoryStats s = ledger.Stats();
  EXPECT_EQ(s.current_of(C::kCommunication), 32);
  EXPECT_GE(s.peak_of(C::kCommunication), 32);
  EXPECT_LE(s.peak_of(C::kCommunication), 64);
}

TEST(MemoryStatsTest, FormatBytes) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(int64_t{25} << 19), "12.5 MiB");
  EXPECT_EQ(FormatBytes(int64_t{142} << 20), "142 MiB");
  EXPECT_EQ(FormatBytes(int64_t{5} << 29), "2.50 GiB");
}

}  // namespace
}  // namespace loom::core
