#include "core/ops/kernel_timer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

#include "core/cpu/matmul.h"
#include "core/ops/kernel_table.h"

namespace loom::core::ops {
namespace {

// Every member of KernelTable but `name`: the two device services and one
// per line of the op list.
// Each X is called as X(Name, member, ...).
#define LOOM_TIMED_KERNELS(X) \
  X(Zero, zero)               \
  X(Synchronize, synchronize) \
  LOOM_KERNEL_OPS(X)

#define LOOM_COUNT_ONE(...) +1
constexpr int kTimedKernels = 0 LOOM_TIMED_KERNELS(LOOM_COUNT_ONE);
static_assert(sizeof(KernelTable) == sizeof(const char*) + kTimedKernels * sizeof(void (*)()),
              "a KernelTable member is missing from LOOM_TIMED_KERNELS");

// The clock of the device being timed; null: the CPU's wall clock.
std::atomic<const KernelClock*> g_clock{nullptr};
std::atomic<const KernelClock*> g_cuda_clock{nullptr};

struct Counters {
  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> nanoseconds{0};
  std::atomic<int64_t> flops{0};
  void Reset() {
    calls = 0;
    nanoseconds = 0;
    flops = 0;
  }
};

// 2·M·N·K per product, from the same shape arithmetic the kernels use; 0 for
// a call the kernel refuses.
int64_t GemmFlops(bool batched, const Tensor& a, const Tensor& b, const Tensor* c,
                  const cpu::MatmulOptions& opts) {
  if (c == nullptr) return 0;
  ops::GemmDims d{};
  if (!ops::GemmMatrixDims("timer", a, b, *c, opts, &d).ok()) return 0;
  int64_t batch = 1;
  if (batched) {
    absl::StatusOr<int64_t> n = ops::GemmBatchCount("timer", a, b, *c);
    if (!n.ok()) return 0;
    batch = *n;
  }
  return 2 * batch * d.m * d.n * d.k;
}

// A linear layer's GEMM with its epilogue: 2·rows·M·K for x [rows, K] and
// w [M, K] (the forward and the data gradient), or dy [rows, M] and
// x [rows, K] (the weight gradient). 0 for shapes the kernel refuses.
int64_t LinearFlops(const Tensor& a, const Tensor& b, bool weight_gradient) {
  if (a.rank() != 2 || b.rank() != 2) return 0;
  const int64_t rows = a.dim(0);
  return weight_gradient ? 2 * rows * a.dim(1) * b.dim(1) : 2 * rows * b.dim(0) * b.dim(1);
}

template <auto Member>
constexpr bool kIsGemm = false;
template <>
constexpr bool kIsGemm<&KernelTable::matmul> = true;
template <>
constexpr bool kIsGemm<&KernelTable::batched_matmul> = true;
template <auto Member>
constexpr bool kIsLinear = false;
template <>
constexpr bool kIsLinear<&KernelTable::linear_forward> = true;
template <>
constexpr bool kIsLinear<&KernelTable::linear_backward_data> = true;
template <>
constexpr bool kIsLinear<&KernelTable::linear_backward_weight> = true;
template <auto Member>
constexpr bool kIsWeightGradient = false;
template <>
constexpr bool kIsWeightGradient<&KernelTable::linear_backward_weight> = true;

// The first two tensor arguments of a linear op.
template <typename... Rest>
int64_t LinearOpFlops(bool weight_gradient, const Tensor& a, const Tensor& b, const Rest&...) {
  return LinearFlops(a, b, weight_gradient);
}

// The timed stand-in for KernelTable member `Member` (of function type Fn).
template <auto Member, typename Fn>
struct Timed;
template <auto Member, typename R, typename... Args>
struct Timed<Member, R (*)(Args...)> {
  static inline R (*original)(Args...) = nullptr;
  static inline Counters counters;
  static inline absl::Mutex marks_mu;
  static inline std::vector<void*> marks;  // device marks not yet read
  static R Call(Args... args) {
    const KernelClock* clock = g_clock.load(std::memory_order_acquire);
    if (clock != nullptr) {
      void* mark = clock->start();
      R result = original(args...);
      clock->stop(mark);
      {
        absl::MutexLock lock(&marks_mu);
        marks.push_back(mark);
      }
      Count(args...);
      return result;
    }
    const auto start = std::chrono::steady_clock::now();
    R result = original(args...);
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    counters.nanoseconds.fetch_add(ns, std::memory_order_relaxed);
    Count(args...);
    return result;
  }
  static void Count(const Args&... args) {
    counters.calls.fetch_add(1, std::memory_order_relaxed);
    if constexpr (kIsGemm<Member>) {
      counters.flops.fetch_add(GemmFlops(Member == &KernelTable::batched_matmul, args...),
                               std::memory_order_relaxed);
    }
    if constexpr (kIsLinear<Member>) {
      counters.flops.fetch_add(
          LinearOpFlops(kIsWeightGradient<Member>, args...),
          std::memory_order_relaxed);
    }
  }
  // Reads the device time of the marks so far (waits for their work).
  static void Drain(const KernelClock* clock) {
    absl::MutexLock lock(&marks_mu);
    for (void* mark : marks) {
      counters.nanoseconds.fetch_add(static_cast<int64_t>(clock->seconds(mark) * 1e9),
                                     std::memory_order_relaxed);
    }
    marks.clear();
  }
};

template <auto Member>
using TimedMember =
    Timed<Member, std::remove_reference_t<decltype(std::declval<KernelTable&>().*Member)>>;

std::atomic<bool> g_running{false};

// `base` with every member replaced by its timed stand-in (one timer at a
// time: the stand-ins' originals are `base`'s).
const KernelTable* TimedTable(const KernelTable* base) {
  static KernelTable* table = new KernelTable;
  *table = *base;
#define LOOM_WRAP(Name, member, ...)                              \
  if (base->member != nullptr) {                                  \
    TimedMember<&KernelTable::member>::original = base->member;   \
    table->member = &TimedMember<&KernelTable::member>::Call;     \
  }
  LOOM_TIMED_KERNELS(LOOM_WRAP)
#undef LOOM_WRAP
  return table;
}

// The untimed table of the device being timed, put back when the timer ends.
const KernelTable* g_untimed = nullptr;

}  // namespace

void RegisterKernelClock(DeviceType type, const KernelClock* clock) {
  if (type != DeviceType::kCPU) g_cuda_clock.store(clock, std::memory_order_release);
}

absl::StatusOr<std::unique_ptr<KernelTimer>> KernelTimer::Start(DeviceType device) {
  if (g_running.exchange(true)) {
    return absl::FailedPreconditionError("KernelTimer::Start: another kernel timer is running");
  }
  const KernelClock* clock = nullptr;
  const KernelTable* base = BuiltInCpuKernels();
  if (device != DeviceType::kCPU) {
    clock = g_cuda_clock.load(std::memory_order_acquire);
    absl::StatusOr<const KernelTable*> table = KernelsFor(Device{device, 0});
    if (clock == nullptr || !table.ok()) {
      g_running = false;
      return absl::FailedPreconditionError(absl::StrCat(
          "KernelTimer::Start: ", Device{device, 0}.ToString(),
          table.ok() ? " has no kernel clock registered" : " has no kernels linked"));
    }
    base = *table;
  }
  std::unique_ptr<KernelTimer> timer(new KernelTimer(device));
  timer->Reset();
  g_clock.store(clock, std::memory_order_release);
  g_untimed = RegisterKernelTable(device, TimedTable(base));
  return timer;
}

KernelTimer::~KernelTimer() {
  RegisterKernelTable(device_, device_ == DeviceType::kCPU ? nullptr : g_untimed);
  Totals();  // reads (and frees) the device marks
  g_clock.store(nullptr, std::memory_order_release);
  g_running = false;
}

void KernelTimer::Reset() {
  Totals();  // reads (and frees) the device marks before they are forgotten
#define LOOM_RESET(Name, member, ...) TimedMember<&KernelTable::member>::counters.Reset();
  LOOM_TIMED_KERNELS(LOOM_RESET)
#undef LOOM_RESET
}

std::vector<KernelTime> KernelTimer::Totals() const {
  if (const KernelClock* clock = g_clock.load(std::memory_order_acquire); clock != nullptr) {
#define LOOM_DRAIN(Name, member, ...) TimedMember<&KernelTable::member>::Drain(clock);
    LOOM_TIMED_KERNELS(LOOM_DRAIN)
#undef LOOM_DRAIN
  }
  std::vector<KernelTime> totals;
#define LOOM_TOTAL(Name, member, ...)                                                  \
  {                                                                           \
    const Counters& c = TimedMember<&KernelTable::member>::counters;          \
    if (c.calls.load() > 0) {                                                 \
      totals.push_back({#member, c.calls.load(), c.nanoseconds.load() * 1e-9, \
                        static_cast<double>(c.flops.load())});                \
    }                                                                         \
  }
  LOOM_TIMED_KERNELS(LOOM_TOTAL)
#undef LOOM_TOTAL
  std::sort(totals.begin(), totals.end(),
            [](const KernelTime& a, const KernelTime& b) { return a.seconds > b.seconds; });
  return totals;
}

}  // namespace loom::core::ops
