#ifndef LOOM_CORE_STORAGE_H_
#define LOOM_CORE_STORAGE_H_

#include <cstddef>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/memory_stats.h"

namespace loom::core {

// Alignment of every CPU allocation: one cache line, and what AVX-512 loads like.
inline constexpr size_t kStorageAlignment = 64;

// Allocates and frees raw bytes on one kind of device. CPU is built in; the
// CUDA allocator (a caching cudaMalloc allocator) registers itself when
// //core/cuda is linked, so //core never depends on CUDA.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual absl::StatusOr<void*> Allocate(size_t bytes, Device device) = 0;
  virtual void Free(void* ptr, size_t bytes, Device device) = 0;
  // Copies `bytes` between a tensor of this device and the host (or within
  // the device). When dst is host memory the copy has completed on return.
  // Lets //core and //comm move small host values (a loss, a norm) to and
  // from a device without depending on its toolkit.
  virtual absl::Status CopyBytes(void* dst, Device dst_device, const void* src, Device src_device,
                                 size_t bytes);
  // The allocator's own figures for `device`: bytes in use per category (as
  // it rounds them, over every user of the device) and reserved bytes (in use
  // + cached). Nullopt: it keeps none (the CPU allocator: see the ledgers,
  // core/memory_stats.h).
  virtual std::optional<MemoryStats> DeviceMemoryStats(Device device) const;
  // Storage::set_memory_category of a block this allocator returned: an
  // allocator that keeps per-category figures moves the block's bytes too.
  virtual void SetMemoryCategory(void* ptr, Device device, MemoryCategory category);
};

// Registers the allocator for `type`; returns the previous one. Called once
// at start-up by device libraries, not by user code.
Allocator* SetAllocator(DeviceType type, Allocator* allocator);
Allocator* GetAllocator(DeviceType type);  // null when none is registered

// Makes the host's freed blocks stay in the process for the next step: glibc
// maps each block above its mmap threshold (at most 32 MB) afresh and unmaps
// it when freed, so every step's large tensors ([tokens, vocab] logits and
// their gradient) were new pages for the kernel to fault in and zero (9 % of
// a GPT-2-small step at seq 1024). For a benchmark's main() only: it changes
// glibc's policy for the whole process, and a process that keeps small
// allocations across steps (the trainer's --profile spans, logs) fragments
// the heap it keeps: freed large blocks get split for small requests and the
// next step's large tensors need new ones (the trainer grew by ~20 MB a step
// under --profile with it). The trainer needs a size-keyed cache of large
// blocks in the CPU allocator instead (not built yet).
void ReuseFreedHostBlocks();

// A reference-counted block of device memory; tensors and their views hold a
// shared_ptr to one. Freed when the last view goes.
//
// Allocate charges its bytes to the calling thread's memory ledger under its
// current category (core/memory_stats.h); the free credits the same ledger
// and category, whichever thread drops the last view.
class Storage {
 public:
  static absl::StatusOr<std::shared_ptr<Storage>> Allocate(size_t bytes, Device device);
  // Memory owned elsewhere (another library's buffer, or the host alias of a
  // device block): never freed by Loom; the owner keeps it alive.
  static std::shared_ptr<Storage> Borrow(void* data, size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

  // The category its bytes are charged to (kOther for borrowed memory).
  MemoryCategory memory_category() const { return category_; }
  // Moves its bytes to `category` in the ledger it was charged to: for a
  // buffer allocated by code that cannot tag it (e.g. the gradient buffer
  // that the model's constructor allocates next to the parameters).
  // Concurrent calls on one storage race. No-op for borrowed memory.
  void set_memory_category(MemoryCategory category);

 private:
  Storage(void* data, size_t bytes, Device device, Allocator* allocator)
      : data_(data), bytes_(bytes), device_(device), allocator_(allocator) {}
  void* data_;
  size_t bytes_;
  Device device_;
  Allocator* allocator_;
  std::shared_ptr<MemoryLedger> ledger_;  // null for borrowed memory
  MemoryCategory category_ = MemoryCategory::kOther;
};

}  // namespace loom::core

#endif  // LOOM_CORE_STORAGE_H_
