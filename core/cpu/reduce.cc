#include "core/cpu/reduce.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cpu/check.h"
#include "core/cpu/vec_math.h"

namespace loom::core::cpu {
namespace {

// Elements per block: blocks are summed in parallel, then added in order, so
// the result does not depend on the thread count.
constexpr int64_t kBlock = int64_t{1} << 16;

// sum_{i < n} x[i] (squared if `squares`) in double, with 32 independent
// accumulators (4 AVX-512 or 8 AVX2 vectors): one vector accumulator made the
// loop wait on the add latency (the gradient norm read 0.5 GB at 1/3 of the
// AdamW step's bandwidth). Products of floats are exact in double.
template <bool squares>
LOOM_CPU_INLINE double BlockSum(const float* x, int64_t n) {
  double acc[32] = {};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int l = 0; l < 32; ++l) {
      const double v = x[i + l];
      acc[l] += squares ? v * v : v;
    }
  }
  double tail = 0;
  for (; i < n; ++i) {
    const double v = x[i];
    tail += squares ? v * v : v;
  }
  for (int l = 0; l < 16; ++l) acc[l] += acc[l + 16];
  for (int l = 0; l < 8; ++l) acc[l] += acc[l + 8];
  double s = tail;
  for (int l = 0; l < 8; ++l) s += acc[l];
  return s;
}
LOOM_CPU_INLINE void BlockSumOfBody(const float* x, int64_t n, double* out) {
  *out = BlockSum<false>(x, n);
}
LOOM_CPU_MULTIVERSION(BlockSumOf, (const float* x, int64_t n, double* out), (x, n, out))
LOOM_CPU_INLINE void BlockSumSquaresOfBody(const float* x, int64_t n, double* out) {
  *out = BlockSum<true>(x, n);
}
LOOM_CPU_MULTIVERSION(BlockSumSquaresOf, (const float* x, int64_t n, double* out), (x, n, out))

template <bool squares>
absl::StatusOr<double> SumInDouble(const char* op, const Tensor& x) {
  LOOM_RETURN_IF_ERROR(internal::CheckInput(op, "x", x));
  const int64_t n = x.numel();
  const float* p = x.data<float>();
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t len = std::min(kBlock, n - b * kBlock);
    if (squares) {
      BlockSumSquaresOf(p + b * kBlock, len, &partial[b]);
    } else {
      BlockSumOf(p + b * kBlock, len, &partial[b]);
    }
  }
  double total = 0.0;
  for (double v : partial) total += v;
  return total;
}

}  // namespace

absl::StatusOr<double> Sum(const Tensor& x) {
  return SumInDouble<false>("Sum", x);
}

absl::StatusOr<double> SumSquares(const Tensor& x) {
  return SumInDouble<true>("SumSquares", x);
}

absl::StatusOr<double> L2Norm(const Tensor& x) {
  LOOM_RETURN_IF_ERROR(internal::CheckInput("L2Norm", "x", x));
  absl::StatusOr<double> ss = SumSquares(x);
  if (!ss.ok()) return ss.status();
  return std::sqrt(*ss);
}

}  // namespace loom::core::cpu
