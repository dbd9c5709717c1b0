#ifndef LOOM_CORE_CUDA_ALLOCATOR_H_
#define LOOM_CORE_CUDA_ALLOCATOR_H_

// The CUDA caching allocator. Linking //core/cuda:allocator registers it with
// core::SetAllocator, so Tensor::Empty(shape, dtype, Device::CUDA(i)) works.
//
// Blocks come from plain cudaMalloc (never managed memory) and, once freed,
// go to per-device free lists binned by size (requests up to 1 MiB rounded up
// to 512 B, larger ones to 2 MiB) and are handed out again without cudaFree.
//
// Stream order: Free() returns a block to the cache immediately, while
// kernels that use it may still be queued. That is safe because every Loom
// kernel and copy runs on the thread's compute stream (runtime.h) and one
// thread computes on each device (one rank per GPU): the next user of the
// block is enqueued on that same stream after them. Blocks are not tagged
// with a stream, so two threads computing on one device, or a thread that
// switches streams (SetCurrentStream) while work is queued, would need a
// stream tag or an event per block first. A tensor that
// another stream reads or writes (e.g. an NCCL stream) must be kept alive by
// its owner until that stream's work is ordered before the compute stream
// again (an Event), exactly as with PyTorch's caching allocator.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "core/memory_stats.h"
#include "core/storage.h"

namespace loom::core::cuda {

struct AllocatorStats {
  int64_t in_use_bytes = 0;     // block bytes held by live tensors
  int64_t reserved_bytes = 0;   // everything cudaMalloc'd and not yet cudaFree'd
  int64_t peak_in_use_bytes = 0;
  int64_t cached_bytes = 0;     // reserved - in_use: free blocks in the cache
  int64_t num_cuda_mallocs = 0;
  int64_t num_cache_hits = 0;   // allocations served from the cache
  // in_use_bytes and its peak by the category the allocating thread had
  // (core/memory_stats.h; Storage::set_memory_category moves a block), as
  // block bytes. Peaks since the last ResetPeak.
  std::array<int64_t, core::kNumMemoryCategories> category_in_use_bytes{};
  std::array<int64_t, core::kNumMemoryCategories> category_peak_bytes{};
};

class CachingAllocator : public core::Allocator {
 public:
  // The process-wide instance (the one registered with //core). Never
  // destroyed: tensors may be freed during static destruction.
  static CachingAllocator& Get();

  absl::StatusOr<void*> Allocate(size_t bytes, Device device) override;
  void Free(void* ptr, size_t bytes, Device device) override;
  // cudaMemcpyAsync on the current stream; returns once the host side may be
  // reused or read: downloads and uploads from pinned memory are waited for,
  // uploads from pageable memory are staged by CUDA and not waited for.
  absl::Status CopyBytes(void* dst, Device dst_device, const void* src, Device src_device,
                         size_t bytes) override;
  // Stats(device.index) as core's MemoryStats: per-category block bytes in
  // use and at their peak, total in use and peak, reserved.
  std::optional<core::MemoryStats> DeviceMemoryStats(Device device) const override;
  void SetMemoryCategory(void* ptr, Device device, core::MemoryCategory category) override;

  // cudaFree of every cached (unused) block on every device.
  absl::Status EmptyCache();
  AllocatorStats Stats(int device) const;
  void ResetPeak(int device);

  // The block size a request of `bytes` occupies.
  static size_t RoundSize(size_t bytes);

 private:
  CachingAllocator() = default;
  struct DeviceCache;
  DeviceCache& Cache(int device) const;
  absl::Status EmptyCacheLocked(int device, DeviceCache& cache);
};

// Shorthands for CachingAllocator::Get().
AllocatorStats GetAllocatorStats(int device);
absl::Status EmptyCache();

}  // namespace loom::core::cuda

#endif  // LOOM_CORE_CUDA_ALLOCATOR_H_
