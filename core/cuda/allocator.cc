#include "core/cuda/allocator.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cuda/check.h"
#include "core/cuda/runtime.h"

namespace loom::core::cuda {
namespace {

// Host memory CUDA does not know (not pinned, not registered, not managed).
bool IsPageable(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // older runtimes report unregistered memory as an error
    return true;
  }
  return attr.type == cudaMemoryTypeUnregistered;
}

constexpr size_t kSmallRound = 512;
constexpr size_t kSmallLimit = size_t{1} << 20;  // up to 1 MiB: "small"
constexpr size_t kLargeRound = size_t{2} << 20;
constexpr int kMaxDevices = 64;

std::mutex& Mu() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}

// Switches the calling thread to `device` for its lifetime, then back: the
// allocator must not change the caller's current device.
class DeviceGuard {
 public:
  absl::Status Enter(int device) {
    LOOM_CUDA_RETURN_IF_ERROR(cudaGetDevice(&prev_));
    if (prev_ != device) {
      LOOM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
      switched_ = true;
    }
    return absl::OkStatus();
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(prev_);
  }

 private:
  int prev_ = 0;
  bool switched_ = false;
};

std::string StatsString(const AllocatorStats& s) {
  return absl::StrCat("in use ", s.in_use_bytes, " B, reserved ", s.reserved_bytes,
                      " B, cached ", s.cached_bytes, " B, peak in use ", s.peak_in_use_bytes,
                      " B, ", s.num_cuda_mallocs, " cudaMallocs");
}

}  // namespace

// Guarded by Mu(). Free blocks are binned by their exact (rounded) size.
struct CachingAllocator::DeviceCache {
  struct Block {
    size_t size;
    core::MemoryCategory category;
  };
  std::map<size_t, std::vector<void*>> free_blocks;
  std::unordered_map<void*, Block> live;
  AllocatorStats stats;

  void Charge(core::MemoryCategory category, int64_t bytes) {
    const int c = static_cast<int>(category);
    stats.category_in_use_bytes[c] += bytes;
    stats.category_peak_bytes[c] =
        std::max(stats.category_peak_bytes[c], stats.category_in_use_bytes[c]);
  }
};

CachingAllocator& CachingAllocator::Get() {
  static CachingAllocator* instance = new CachingAllocator();
  return *instance;
}

CachingAllocator::DeviceCache& CachingAllocator::Cache(int device) const {
  static DeviceCache* caches = new DeviceCache[kMaxDevices];
  return caches[device];
}

size_t CachingAllocator::RoundSize(size_t bytes) {
  if (bytes == 0) return kSmallRound;  // a unique, valid pointer even for empty tensors
  if (bytes <= kSmallLimit) return (bytes + kSmallRound - 1) / kSmallRound * kSmallRound;
  return (bytes + kLargeRound - 1) / kLargeRound * kLargeRound;
}

absl::StatusOr<void*> CachingAllocator::Allocate(size_t bytes, Device device) {
  if (device.type != DeviceType::kCUDA || device.index < 0 || device.index >= kMaxDevices) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA allocator: cannot allocate on ", device.ToString()));
  }
  const size_t size = RoundSize(bytes);
  std::lock_guard<std::mutex> lock(Mu());
  DeviceCache& cache = Cache(device.index);
  void* ptr = nullptr;
  auto bin = cache.free_blocks.find(size);
  if (bin != cache.free_blocks.end() && !bin->second.empty()) {
    ptr = bin->second.back();
    bin->second.pop_back();
    ++cache.stats.num_cache_hits;
  } else {
    DeviceGuard guard;
    if (absl::Status s = guard.Enter(device.index); !s.ok()) return s;
    cudaError_t err = cudaMalloc(&ptr, size);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky: clear it so later launch checks do not see it
      // Give every cached block back to the driver and try once more.
      if (absl::Status s = EmptyCacheLocked(device.index, cache); !s.ok()) return s;
      err = cudaMalloc(&ptr, size);
      if (err == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        cudaGetLastError();
        cache.stats.cached_bytes = cache.stats.reserved_bytes - cache.stats.in_use_bytes;
        return absl::ResourceExhaustedError(absl::StrCat(
            "CUDA out of memory on ", device.ToString(), ": requested ", bytes, " bytes (block ",
            size, " B) after emptying the cache; allocator: ", StatsString(cache.stats),
            "; device: ", free_b, " B free of ", total_b, " B"));
      }
    }
    if (err != cudaSuccess) {
      return CudaStatus(err, "cudaMalloc", __FILE__, __LINE__);
    }
    cache.stats.reserved_bytes += static_cast<int64_t>(size);
    ++cache.stats.num_cuda_mallocs;
  }
  const core::MemoryCategory category = core::CurrentMemoryCategory();
  cache.live[ptr] = DeviceCache::Block{size, category};
  cache.Charge(category, static_cast<int64_t>(size));
  cache.stats.in_use_bytes += static_cast<int64_t>(size);
  cache.stats.peak_in_use_bytes = std::max(cache.stats.peak_in_use_bytes, cache.stats.in_use_bytes);
  return ptr;
}

absl::Status CachingAllocator::CopyBytes(void* dst, Device dst_device, const void* src,
                                         Device src_device, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  absl::StatusOr<cudaStream_t> stream = CurrentStream();
  if (!stream.ok()) return stream.status();
  LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, *stream));
  // The host side may be reused or read as soon as we return. An upload from
  // pageable host memory needs no wait: cudaMemcpyAsync has staged the bytes
  // before it returns (CUDA's API synchronisation rules), and waiting would
  // drain every kernel queued before it (a host sync per micro-batch's
  // tokens). Downloads, and uploads from pinned memory the DMA still reads,
  // are waited for.
  if (dst_device.is_cpu() || (src_device.is_cpu() && !IsPageable(src))) {
    LOOM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(*stream));
  }
  return absl::OkStatus();
}

void CachingAllocator::Free(void* ptr, size_t bytes, Device device) {
  if (ptr == nullptr || device.index < 0 || device.index >= kMaxDevices) return;
  std::lock_guard<std::mutex> lock(Mu());
  DeviceCache& cache = Cache(device.index);
  auto it = cache.live.find(ptr);
  if (it == cache.live.end()) return;  // not ours: nothing safe to do
  const size_t size = it->second.size;
  cache.Charge(it->second.category, -static_cast<int64_t>(size));
  cache.live.erase(it);
  cache.stats.in_use_bytes -= static_cast<int64_t>(size);
  cache.free_blocks[size].push_back(ptr);
}

absl::Status CachingAllocator::EmptyCacheLocked(int device, DeviceCache& cache) {
  if (cache.free_blocks.empty()) return absl::OkStatus();
  DeviceGuard guard;
  if (absl::Status s = guard.Enter(device); !s.ok()) return s;
  // cudaFree waits for the device, so no queued kernel still uses a block.
  for (auto& [size, ptrs] : cache.free_blocks) {
    for (void* p : ptrs) {
      LOOM_CUDA_RETURN_IF_ERROR(cudaFree(p));
      cache.stats.reserved_bytes -= static_cast<int64_t>(size);
    }
    ptrs.clear();
  }
  cache.free_blocks.clear();
  return absl::OkStatus();
}

absl::Status CachingAllocator::EmptyCache() {
  std::lock_guard<std::mutex> lock(Mu());
  for (int d = 0; d < kMaxDevices; ++d) {
    DeviceCache& cache = Cache(d);
    if (absl::Status s = EmptyCacheLocked(d, cache); !s.ok()) return s;
  }
  return absl::OkStatus();
}

AllocatorStats CachingAllocator::Stats(int device) const {
  if (device < 0 || device >= kMaxDevices) return {};
  std::lock_guard<std::mutex> lock(Mu());
  AllocatorStats s = Cache(device).stats;
  s.cached_bytes = s.reserved_bytes - s.in_use_bytes;
  return s;
}

void CachingAllocator::ResetPeak(int device) {
  if (device < 0 || device >= kMaxDevices) return;
  std::lock_guard<std::mutex> lock(Mu());
  DeviceCache& cache = Cache(device);
  cache.stats.peak_in_use_bytes = cache.stats.in_use_bytes;
  cache.stats.category_peak_bytes = cache.stats.category_in_use_bytes;
}

std::optional<core::MemoryStats> CachingAllocator::DeviceMemoryStats(Device device) const {
  if (device.type != DeviceType::kCUDA || device.index < 0 || device.index >= kMaxDevices) {
    return std::nullopt;
  }
  const AllocatorStats a = Stats(device.index);
  core::MemoryStats s;
  s.current = a.category_in_use_bytes;
  s.peak = a.category_peak_bytes;
  s.total_current = a.in_use_bytes;
  s.total_peak = a.peak_in_use_bytes;
  s.reserved = a.reserved_bytes;
  return s;
}

void CachingAllocator::SetMemoryCategory(void* ptr, Device device,
                                         core::MemoryCategory category) {
  if (ptr == nullptr || device.index < 0 || device.index >= kMaxDevices) return;
  std::lock_guard<std::mutex> lock(Mu());
  DeviceCache& cache = Cache(device.index);
  auto it = cache.live.find(ptr);
  if (it == cache.live.end() || it->second.category == category) return;
  cache.Charge(it->second.category, -static_cast<int64_t>(it->second.size));
  cache.Charge(category, static_cast<int64_t>(it->second.size));
  it->second.category = category;
}

AllocatorStats GetAllocatorStats(int device) { return CachingAllocator::Get().Stats(device); }
absl::Status EmptyCache() { return CachingAllocator::Get().EmptyCache(); }

namespace {
// Registration at static-initialisation time (the target is alwayslink).
const bool kRegistered = [] {
  core::SetAllocator(DeviceType::kCUDA, &CachingAllocator::Get());
  return true;
}();
}  // namespace

}  // namespace loom::core::cuda
