#include "core/cuda/allocator.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "core/cuda/copy.h"
#include "core/cuda/event.h"
#include "core/cuda/runtime.h"
#include "core/cuda/test_util.h"
#include "core/memory_stats.h"
#include "gtest/gtest.h"

namespace loom::core::cuda {
namespace {

using testing::Random;

TEST(AllocatorTest, RegisteredWithCore) {
  EXPECT_EQ(core::GetAllocator(DeviceType::kCUDA), &CachingAllocator::Get());
}

TEST(AllocatorTest, RoundsSmallTo512AndLargeTo2MiB) {
  EXPECT_EQ(CachingAllocator::RoundSize(0), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(1), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(513), 1024u);
  EXPECT_EQ(CachingAllocator::RoundSize(1 << 20), size_t{1} << 20);
  EXPECT_EQ(CachingAllocator::RoundSize((1 << 20) + 1), size_t{2} << 20);
  EXPECT_EQ(CachingAllocator::RoundSize((size_t{5} << 20) + 3), size_t{6} << 20);
}

TEST(AllocatorTest, WithoutGpuAllocationFailsCleanly) {
  if (testing::GpuStatus().ok()) GTEST_SKIP() << "a GPU is present";
  absl::StatusOr<Tensor> t = Tensor::Empty(Shape{4}, DType::kF32, Device::CUDA(0));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kUnavailable) << t.status();
}

TEST(AllocatorTest, FreedBlocksAreReusedWithoutCudaMalloc) {
  LOOM_REQUIRE_GPU();
  LOOM_ASSERT_OK(EmptyCache());
  void* first = nullptr;
  {
    absl::StatusOr<Tensor> t = Tensor::Empty(Shape{1000}, DType::kF32, Device::CUDA(0));
    ASSERT_TRUE(t.ok()) << t.status();
    first = t->raw_data();
  }
  const AllocatorStats before = GetAllocatorStats(0);
  absl::StatusOr<Tensor> again = Tensor::Empty(Shape{999}, DType::kF32, Device::CUDA(0));
  ASSERT_TRUE(again.ok());
  const AllocatorStats after = GetAllocatorStats(0);
  EXPECT_EQ(again->raw_data(), first);  // same 4096-byte bin
  EXPECT_EQ(after.num_cuda_mallocs, before.num_cuda_mallocs);
  EXPECT_EQ(after.num_cache_hits, before.num_cache_hits + 1);
}

TEST(AllocatorTest, StatsTrackInUseReservedAndPeak) {
  LOOM_REQUIRE_GPU();
  LOOM_ASSERT_OK(EmptyCache());
  CachingAllocator::Get().ResetPeak(0);
  const AllocatorStats s0 = GetAllocatorStats(0);
  {
    absl::StatusOr<Tensor> a = Tensor::Empty(Shape{3 << 20}, DType::kU8, Device::CUDA(0));
    ASSERT_TRUE(a.ok());
    const AllocatorStats s1 = GetAllocatorStats(0);
    EXPECT_EQ(s1.in_use_bytes - s0.in_use_bytes, int64_t{4} << 20);  // 3 MiB -> 4 MiB block
    EXPECT_GE(s1.reserved_bytes - s0.reserved_bytes, int64_t{4} << 20);
    EXPECT_GE(s1.peak_in_use_bytes, s1.in_use_bytes);
  }
  const AllocatorStats s2 = GetAllocatorStats(0);
  EXPECT_EQ(s2.in_use_bytes, s0.in_use_bytes);
  EXPECT_GE(s2.cached_bytes, int64_t{4} << 20);
  EXPECT_GE(s2.peak_in_use_bytes, s0.in_use_bytes + (int64_t{4} << 20));
  LOOM_ASSERT_OK(EmptyCache());
  EXPECT_EQ(GetAllocatorStats(0).cached_bytes, 0);
}

// The same categories as the ledgers (core/memory_stats.h), in block bytes.
TEST(AllocatorTest, StatsPerMemoryCategory) {
  LOOM_REQUIRE_GPU();
  CachingAllocator::Get().ResetPeak(0);
  const auto act = static_cast<int>(MemoryCategory::kActivations);
  const auto grads = static_cast<int>(MemoryCategory::kGradients);
  const AllocatorStats s0 = GetAllocatorStats(0);
  auto ledger = std::make_shared<MemoryLedger>();
  LedgerScope use(ledger);
  {
    MemoryScope tag(MemoryCategory::kActivations);
    absl::StatusOr<Tensor> a = Tensor::Empty(Shape{3 << 20}, DType::kU8, Device::CUDA(0));
    ASSERT_TRUE(a.ok());
    const AllocatorStats s1 = GetAllocatorStats(0);
    EXPECT_EQ(s1.category_in_use_bytes[act] - s0.category_in_use_bytes[act], int64_t{4} << 20);
    // The ledger counts the tensor's bytes on the device's account.
    EXPECT_EQ(ledger->Stats(DeviceType::kCUDA).current_of(MemoryCategory::kActivations),
              int64_t{3} << 20);
    a->storage()->set_memory_category(MemoryCategory::kGradients);
    const AllocatorStats s2 = GetAllocatorStats(0);
    EXPECT_EQ(s2.category_in_use_bytes[act], s0.category_in_use_bytes[act]);
    EXPECT_EQ(s2.category_in_use_bytes[grads] - s0.category_in_use_bytes[grads],
              int64_t{4} << 20);
    std::optional<MemoryStats> d =
        CachingAllocator::Get().DeviceMemoryStats(Device::CUDA(0));
    ASSERT_TRUE(d.has_value());
    EXPECT_EQ(d->total_current, s2.in_use_bytes);
    EXPECT_GE(d->reserved, d->total_current);
    EXPECT_GE(d->peak_of(MemoryCategory::kActivations), s0.category_in_use_bytes[act] +
                                                            (int64_t{4} << 20));
  }
  EXPECT_EQ(GetAllocatorStats(0).category_in_use_bytes[grads], s0.category_in_use_bytes[grads]);
  EXPECT_EQ(ledger->Stats(DeviceType::kCUDA).total_current, 0);
}

TEST(AllocatorTest, OutOfMemoryIsResourceExhaustedWithStats) {
  LOOM_REQUIRE_GPU();
  const int64_t huge = int64_t{1} << 50;  // 1 PiB
  absl::StatusOr<Tensor> t = Tensor::Empty(Shape{huge}, DType::kU8, Device::CUDA(0));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted) << t.status();
  EXPECT_NE(t.status().message().find(std::to_string(huge)), absl::string_view::npos);
  EXPECT_NE(t.status().message().find("reserved"), absl::string_view::npos);
  // The failure is not sticky: the next allocation and a launch still work.
  absl::StatusOr<Tensor> ok = Tensor::Empty(Shape{16}, DType::kF32, Device::CUDA(0));
  ASSERT_TRUE(ok.ok()) << ok.status();
  LOOM_ASSERT_OK(ZeroTensor(&*ok));
  LOOM_ASSERT_OK(SynchronizeCurrentStream());
}

TEST(CopyTest, RoundTripAndZero) {
  LOOM_REQUIRE_GPU();
  Tensor host = Random(Shape{3, 1001}, 1);
  absl::StatusOr<Tensor> dev = ToDevice(host, 0);
  ASSERT_TRUE(dev.ok()) << dev.status();
  absl::StatusOr<Tensor> back = ToHost(*dev);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(0, std::memcmp(back->raw_data(), host.raw_data(), host.nbytes()));
  // Device -> device and device -> host through CopyTensor.
  Tensor dev2 = testing::Poisoned(Shape{3003}, DType::kF32);
  LOOM_ASSERT_OK(CopyTensor(*dev, &dev2));
  Tensor host2 = testing::CpuEmpty(Shape{3003}, DType::kF32);
  LOOM_ASSERT_OK(CopyTensor(dev2, &host2));
  LOOM_ASSERT_OK(SynchronizeCurrentStream());
  EXPECT_EQ(0, std::memcmp(host2.raw_data(), host.raw_data(), host.nbytes()));
  LOOM_ASSERT_OK(ZeroTensor(&dev2));
  Tensor zeros = testing::Download(dev2);
  for (int64_t i = 0; i < zeros.numel(); ++i) ASSERT_EQ(zeros.data<float>()[i], 0.0f) << i;
}

// Uploads from pageable host memory return without waiting for the stream
// (allocator.cc): the source may be overwritten at once, even while a long
// kernel queue is ahead of the copy, and the device still gets the old bytes.
TEST(CopyTest, UploadFromPageableMemoryMayReuseTheSourceAtOnce) {
  LOOM_REQUIRE_GPU();
  Tensor big = testing::Poisoned(Shape{64 << 20}, DType::kF32);
  for (int i = 0; i < 20; ++i) LOOM_ASSERT_OK(ZeroTensor(&big));  // keep the stream busy
  std::vector<float> src(4096);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  Tensor dev = testing::Poisoned(Shape{4096}, DType::kF32);
  LOOM_ASSERT_OK(CachingAllocator::Get().CopyBytes(dev.raw_data(), dev.device(), src.data(),
                                                   Device::CPU(), src.size() * sizeof(float)));
  std::fill(src.begin(), src.end(), -1.0f);
  Tensor back = testing::Download(dev);
  for (int64_t i = 0; i < back.numel(); ++i) {
    ASSERT_EQ(back.data<float>()[i], static_cast<float>(i)) << "element " << i;
  }
}

TEST(CopyTest, RejectsMismatchesWithoutTouchingTheGpu) {
  Tensor a = Random(Shape{4}, 1);
  Tensor b = testing::CpuEmpty(Shape{5}, DType::kF32);
  EXPECT_TRUE(testing::IsInvalidArgument(CopyTensor(a, &b), {"CopyTensor", "f32[5]"}));
  EXPECT_TRUE(testing::IsInvalidArgument(CopyTensor(a, nullptr), {"dst"}));
  absl::StatusOr<Tensor> bad = ToDevice(a, CurrentDevice() + 1);
  EXPECT_TRUE(testing::IsInvalidArgument(bad.status(), {"ToDevice", "current device"}));
}

TEST(EventTest, OrdersAndTimes) {
  LOOM_REQUIRE_GPU();
  absl::StatusOr<Event> start = Event::Create(/*timing=*/true);
  absl::StatusOr<Event> stop = Event::Create(/*timing=*/true);
  ASSERT_TRUE(start.ok() && stop.ok()) << start.status();
  LOOM_ASSERT_OK(start->Record());
  Tensor t = testing::Poisoned(Shape{1 << 20}, DType::kF32);
  LOOM_ASSERT_OK(ZeroTensor(&t));
  LOOM_ASSERT_OK(stop->Record());
  LOOM_ASSERT_OK(stop->Synchronize());
  absl::StatusOr<bool> done = stop->Query();
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
  absl::StatusOr<float> ms = stop->ElapsedMsSince(*start);
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_GE(*ms, 0.0f);
  // Another stream waits for the event without blocking the host.
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  LOOM_ASSERT_OK(stop->Wait(other));
  EXPECT_EQ(cudaStreamSynchronize(other), cudaSuccess);
  cudaStreamDestroy(other);
  Event moved = std::move(*start);
  EXPECT_NE(moved.get(), nullptr);
  EXPECT_EQ(start->get(), nullptr);
}

TEST(EventTest, DefaultEventReportsMisuse) {
  Event e;
  EXPECT_EQ(e.Record().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace loom::core::cuda
