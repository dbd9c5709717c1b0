#include "core/ops/testing/fake_device.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/cpu/adamw.h"
#include "core/cpu/attention.h"
#include "core/cpu/convert.h"
#include "core/cpu/cross_entropy.h"
#include "core/cpu/dropout.h"
#include "core/cpu/elementwise.h"
#include "core/cpu/embedding.h"
#include "core/cpu/flash_attention.h"
#include "core/cpu/flash_block.h"
#include "core/cpu/layernorm.h"
#include "core/cpu/linear.h"
#include "core/cpu/matmul.h"
#include "core/cpu/moe.h"
#include "core/cpu/qkv_split.h"
#include "core/cpu/reduce.h"
#include "core/cpu/residual_norm.h"
#include "core/cpu/rmsnorm.h"
#include "core/cpu/rope.h"
#include "core/cpu/softmax.h"
#include "core/cpu/swiglu.h"
#include "core/cpu/vocab_parallel_ce.h"
#include "core/ops/kernel_table.h"
#include "core/ops/kernel_timer.h"
#include "core/storage.h"
#include "core/tensor.h"

namespace loom::core::ops::testing {
namespace {

// Bit 62 set makes an x86-64/AArch64 user address non-canonical: a host
// dereference faults.
constexpr uintptr_t kPoison = uintptr_t{1} << 62;

std::atomic<long> g_kernel_calls{0};
std::atomic<long> g_copied_bytes{0};

void* Poison(void* p) { return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) | kPoison); }
void* Unpoison(const void* p) {
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) & ~kPoison);
}
void* HostAddress(const void* p, Device d) { return d.is_cpu() ? const_cast<void*>(p) : Unpoison(p); }

class FakeAllocator : public Allocator {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes, Device) override {
    void* p = std::aligned_alloc(kStorageAlignment,
                                 (bytes + kStorageAlignment) / kStorageAlignment * kStorageAlignment);
    if (p == nullptr) return absl::ResourceExhaustedError("fake device allocation failed");
    return Poison(p);
  }
  void Free(void* ptr, size_t, Device) override { std::free(Unpoison(ptr)); }
  absl::Status CopyBytes(void* dst, Device dst_device, const void* src, Device src_device,
                         size_t bytes) override {
    std::memcpy(HostAddress(dst, dst_device), HostAddress(src, src_device), bytes);
    g_copied_bytes += static_cast<long>(bytes);
    return absl::OkStatus();
  }
};

// The host alias of a fake-device tensor (CPU tensors pass through).
Tensor Alias(const Tensor& t) {
  if (!t.defined() || t.device().is_cpu()) return t;
  const Storage& s = *t.storage();
  return *Tensor::FromStorage(Storage::Borrow(Unpoison(s.data()), s.bytes(), Device::CPU()),
                              t.storage_offset_bytes(), t.shape(), t.dtype());
}

// Turns each tensor argument into its alias; the aliases live as long as the call.
struct Aliaser {
  std::deque<Tensor> keep;  // deque: push_back keeps earlier references valid
  const Tensor& operator()(const Tensor& t) {
    keep.push_back(Alias(t));
    return keep.back();
  }
  Tensor* operator()(Tensor* t) {
    if (t == nullptr) return nullptr;
    keep.push_back(Alias(*t));
    return &keep.back();
  }
  template <typename T>
  T&& operator()(T&& x) {
    return std::forward<T>(x);
  }
};

template <auto Fn>
struct OnHost;
template <typename R, typename... Args, R (*Fn)(Args...)>
struct OnHost<Fn> {
  static R Call(Args... args) {
    ++g_kernel_calls;
    Aliaser a;
    return Fn(a(args)...);
  }
};

absl::Status FakeZero(Tensor* t) {
  std::memset(Unpoison(t->raw_data()), 0, t->nbytes());
  return absl::OkStatus();
}
absl::Status FakeSynchronize() { return absl::OkStatus(); }

const KernelTable* FakeTable() {
  static const KernelTable* table = [] {
    auto* t = new KernelTable;
    t->name = "fake-cuda";
    t->zero = &FakeZero;
    t->synchronize = &FakeSynchronize;
#define LOOM_REGISTER(Name, member, ...) t->member = &OnHost<&cpu::Name>::Call;
    LOOM_KERNEL_OPS(LOOM_REGISTER)
#undef LOOM_REGISTER
    return t;
  }();
  return table;
}

// The fake device's kernels run on the host when called: its kernel clock
// (KernelTimer's device path) is the host's. A mark holds the start time,
// then (after stop) the elapsed time.
using Clock = std::chrono::steady_clock;
void* ClockStart() { return new Clock::duration(Clock::now().time_since_epoch()); }
void ClockStop(void* mark) {
  auto* d = static_cast<Clock::duration*>(mark);
  *d = Clock::now().time_since_epoch() - *d;
}
double ClockSeconds(void* mark) {
  auto* d = static_cast<Clock::duration*>(mark);
  const double s = std::chrono::duration<double>(*d).count();
  delete d;
  return s;
}
const KernelClock kFakeClock{&ClockStart, &ClockStop, &ClockSeconds};

}  // namespace

ScopedFakeDevice::ScopedFakeDevice() {
  RegisterKernelClock(DeviceType::kCUDA, &kFakeClock);
  static FakeAllocator* allocator = new FakeAllocator;
  previous_allocator_ = SetAllocator(DeviceType::kCUDA, allocator);
  previous_table_ = RegisterKernelTable(DeviceType::kCUDA, FakeTable());
}

ScopedFakeDevice::~ScopedFakeDevice() {
  RegisterKernelClock(DeviceType::kCUDA, nullptr);
  SetAllocator(DeviceType::kCUDA,
               static_cast<Allocator*>(const_cast<void*>(previous_allocator_)));
  RegisterKernelTable(DeviceType::kCUDA, static_cast<const KernelTable*>(previous_table_));
}

long ScopedFakeDevice::kernel_calls() { return g_kernel_calls.load(); }
long ScopedFakeDevice::copied_bytes() { return g_copied_bytes.load(); }

}  // namespace loom::core::ops::testing
