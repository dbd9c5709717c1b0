#include "core/cpu/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/cpu/check.h"
#include "core/cpu/vec_math.h"

namespace loom::core::cpu {
namespace {

// Elements per block: blocks are summed in parallel, then added in order, so
// the result does not depend on the thread count.
constexpr int64_t kBlock = int64_t{1} << 16;
// Blocks a thread reads at once, element by element in lockstep: one stream
// per thread read the gradients (0.5 GB for the norm) at about 2/3 of the rate
// four streams reach on this machine's cores (25 vs 17 ms).
constexpr int kStreams = 4;
constexpr int kLanes = 8;  // independent accumulators per block (two vectors of 4)

// out[s] = sum_{i < n} x[s][i] (squared if `squares`) in double, for S blocks
// of n elements each. Element i of a block goes to accumulator i % kLanes,
// whatever S is, so a block's sum has the same bits alone or in a group.
// Only a single block (S == 1) can be short; a group is kStreams full blocks
// (kBlock, a multiple of kLanes) and has no tail loop: with n == kBlock known,
// the never-run one had a wrapped trip count (-Waggressive-loop-optimizations).
// Products of floats are exact in double (FMA or not: same bits). Vector
// types, not arrays: GCC kept a [S][lanes] array in memory (5x slower).
template <bool squares, int S>
LOOM_CPU_INLINE void BlockSums(const float* const* x, int64_t n, double* out) {
  typedef float F4 __attribute__((vector_size(16)));
  typedef double D4 __attribute__((vector_size(32)));
  D4 acc[S][2];
  for (int s = 0; s < S; ++s) acc[s][0] = acc[s][1] = D4{0, 0, 0, 0};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int s = 0; s < S; ++s) {
      for (int k = 0; k < 2; ++k) {
        F4 f;
        std::memcpy(&f, x[s] + i + 4 * k, sizeof(f));
        const D4 v = __builtin_convertvector(f, D4);
        acc[s][k] += squares ? v * v : v;
      }
    }
  }
  for (int s = 0; s < S; ++s) {
    double tail = 0;
    if constexpr (S == 1) {
      for (int64_t j = i; j < n; ++j) {
        const double v = x[s][j];
        tail += squares ? v * v : v;
      }
    }
    const D4 pair = acc[s][0] + acc[s][1];
    out[s] = tail + ((pair[0] + pair[2]) + (pair[1] + pair[3]));
  }
}
LOOM_CPU_INLINE void BlockSumOfBody(const float* x, int64_t n, double* out) {
  BlockSums<false, 1>(&x, n, out);
}
LOOM_CPU_MULTIVERSION(BlockSumOf, (const float* x, int64_t n, double* out), (x, n, out))
LOOM_CPU_INLINE void BlockSumSquaresOfBody(const float* x, int64_t n, double* out) {
  BlockSums<true, 1>(&x, n, out);
}
LOOM_CPU_MULTIVERSION(BlockSumSquaresOf, (const float* x, int64_t n, double* out), (x, n, out))
// kStreams full blocks of kBlock elements each.
static_assert(kBlock % kLanes == 0, "a full block has no tail");
LOOM_CPU_INLINE void StreamsSumOfBody(const float* const* x, double* out) {
  BlockSums<false, kStreams>(x, kBlock, out);
}
LOOM_CPU_MULTIVERSION(StreamsSumOf, (const float* const* x, double* out), (x, out))
LOOM_CPU_INLINE void StreamsSumSquaresOfBody(const float* const* x, double* out) {
  BlockSums<true, kStreams>(x, kBlock, out);
}
LOOM_CPU_MULTIVERSION(StreamsSumSquaresOf, (const float* const* x, double* out), (x, out))

template <bool squares>
absl::StatusOr<double> SumInDouble(const char* op, const Tensor& x) {
  LOOM_RETURN_IF_ERROR(internal::CheckInput(op, "x", x));
  const int64_t n = x.numel();
  const float* p = x.data<float>();
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  const int64_t full_blocks = n / kBlock;
  // Groups of kStreams full blocks, in lockstep; the blocks after the last
  // whole group (the short one included) one at a time.
  const int64_t groups = full_blocks / kStreams;
  std::vector<double> partial(static_cast<size_t>(blocks));
#pragma omp parallel if (blocks > 1)
  {
#pragma omp for schedule(static) nowait
    for (int64_t g = 0; g < groups; ++g) {
      const float* streams[kStreams];
      for (int s = 0; s < kStreams; ++s) streams[s] = p + (g * kStreams + s) * kBlock;
      if (squares) {
        StreamsSumSquaresOf(streams, &partial[g * kStreams]);
      } else {
        StreamsSumOf(streams, &partial[g * kStreams]);
      }
    }
#pragma omp for schedule(static)
    for (int64_t b = groups * kStreams; b < blocks; ++b) {
      const int64_t len = std::min(kBlock, n - b * kBlock);
      if (squares) {
        BlockSumSquaresOf(p + b * kBlock, len, &partial[b]);
      } else {
        BlockSumOf(p + b * kBlock, len, &partial[b]);
      }
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

absl::Status SumSquaresInto(const Tensor& x, Tensor* acc) {
  constexpr const char* kOp = "SumSquaresInto";
  LOOM_RETURN_IF_ERROR(ops::CheckDoubleAccumulator(kOp, acc));
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "acc", *acc, DType::kF64));
  LOOM_ASSIGN_OR_RETURN(const double s, SumInDouble<true>(kOp, x));
  acc->data<double>()[0] += s;
  return absl::OkStatus();
}

}  // namespace loom::core::cpu
