#include "core/storage.h"

#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace loom::core {
namespace {

class CpuAllocator : public Allocator {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes, Device device) override {
    // aligned_alloc needs a size that is a multiple of the alignment.
    size_t rounded = (bytes + kStorageAlignment - 1) / kStorageAlignment * kStorageAlignment;
    void* p = std::aligned_alloc(kStorageAlignment, rounded == 0 ? kStorageAlignment : rounded);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("CPU allocation of ", bytes, " bytes failed"));
    }
    return p;
  }
  void Free(void* ptr, size_t, Device) override { std::free(ptr); }
};

CpuAllocator* DefaultCpuAllocator() {
  static CpuAllocator* allocator = new CpuAllocator();
  return allocator;
}

std::atomic<Allocator*>& Slot(DeviceType type) {
  static std::atomic<Allocator*> cpu{DefaultCpuAllocator()};
  static std::atomic<Allocator*> cuda{nullptr};
  return type == DeviceType::kCPU ? cpu : cuda;
}

}  // namespace

absl::Status Allocator::CopyBytes(void* dst, Device dst_device, const void* src,
                                  Device src_device, size_t bytes) {
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  return absl::UnimplementedError(absl::StrCat("this allocator cannot copy ", bytes, " bytes from ",
                                               src_device.ToString(), " to ",
                                               dst_device.ToString()));
}

std::optional<MemoryStats> Allocator::DeviceMemoryStats(Device) const { return std::nullopt; }

void Allocator::SetMemoryCategory(void*, Device, MemoryCategory) {}

Allocator* SetAllocator(DeviceType type, Allocator* allocator) {
  return Slot(type).exchange(allocator);
}

Allocator* GetAllocator(DeviceType type) { return Slot(type).load(); }

void ReuseFreedHostBlocks() {
  mallopt(M_MMAP_MAX, 0);                // every block from the heap
  mallopt(M_TRIM_THRESHOLD, 1 << 30);    // and the heap kept, up to 1 GiB free at its top
}

absl::StatusOr<std::shared_ptr<Storage>> Storage::Allocate(size_t bytes, Device device) {
  Allocator* allocator = GetAllocator(device.type);
  if (allocator == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no allocator for device ", device.ToString(),
        ": link //core/cuda (and run on a machine with a GPU) to use CUDA tensors"));
  }
  absl::StatusOr<void*> data = allocator->Allocate(bytes, device);
  if (!data.ok()) return data.status();
  std::shared_ptr<Storage> storage(new Storage(*data, bytes, device, allocator));
  storage->ledger_ = CurrentMemoryLedger();
  storage->category_ = CurrentMemoryCategory();
  storage->ledger_->Allocated(device.type, storage->category_, static_cast<int64_t>(bytes));
  return storage;
}

std::shared_ptr<Storage> Storage::Borrow(void* data, size_t bytes, Device device) {
  return std::shared_ptr<Storage>(new Storage(data, bytes, device, nullptr));
}

void Storage::set_memory_category(MemoryCategory category) {
  if (ledger_ == nullptr || category == category_) return;
  // Freed first: the total does not rise on the way.
  ledger_->Freed(device_.type, category_, static_cast<int64_t>(bytes_));
  ledger_->Allocated(device_.type, category, static_cast<int64_t>(bytes_));
  category_ = category;
  if (allocator_ != nullptr) allocator_->SetMemoryCategory(data_, device_, category);
}

Storage::~Storage() {
  if (allocator_ != nullptr) allocator_->Free(data_, bytes_, device_);
  if (ledger_ != nullptr) ledger_->Freed(device_.type, category_, static_cast<int64_t>(bytes_));
}

}  // namespace loom::core
