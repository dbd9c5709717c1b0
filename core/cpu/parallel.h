#ifndef LOOM_CORE_CPU_PARALLEL_H_
#define LOOM_CORE_CPU_PARALLEL_H_

// Row loops shared by the CPU kernels: each OpenMP thread takes one
// contiguous run of rows, and parameter gradients are summed in per-thread
// partial rows that are added in thread order at the end. For a given thread
// count every result is deterministic (same inputs, same bits).

#include <omp.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

namespace loom::core::cpu::internal {

// Runs fn(lo, hi) on every thread of one parallel region, for its run
// [rows * t / nt, rows * (t + 1) / nt) of [0, rows) (runs may be empty).
template <typename Fn>
void ParallelRowRuns(int64_t rows, Fn&& fn) {
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    fn(rows * t / nt, rows * (t + 1) / nt);
  }
}

// ParallelRowRuns for a backward kernel that accumulates parameter
// gradients: fn(lo, hi, partial) gets a zeroed private row of
// dst.size() * width floats (the partial of dst[k] at partial + k * width);
// afterwards dst[k][j] += every thread's partial, in thread order.
template <typename Fn>
void ParallelRowRunsAccumulate(int64_t rows, int64_t width, std::initializer_list<float*> dst,
                               Fn&& fn) {
  const int nthreads = omp_get_max_threads();
  const size_t stride = dst.size() * static_cast<size_t>(width);
  std::vector<float> partial(static_cast<size_t>(nthreads) * stride, 0.0f);
#pragma omp parallel num_threads(nthreads)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    fn(rows * t / nt, rows * (t + 1) / nt, partial.data() + static_cast<size_t>(t) * stride);
  }
  for (int t = 0; t < nthreads; ++t) {
    const float* p = partial.data() + static_cast<size_t>(t) * stride;
    for (float* d : dst) {
      for (int64_t j = 0; j < width; ++j) d[j] += p[j];
      p += width;
    }
  }
}

}  // namespace loom::core::cpu::internal

#endif  // LOOM_CORE_CPU_PARALLEL_H_
