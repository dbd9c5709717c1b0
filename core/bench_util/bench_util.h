#ifndef LOOM_CORE_BENCH_UTIL_BENCH_UTIL_H_
#define LOOM_CORE_BENCH_UTIL_BENCH_UTIL_H_

// What every bench main prints or computes the same way: the CPU it ran on
// and the median of its timed samples. Benches only; tests never time things.

#include <chrono>
#include <string>
#include <vector>

namespace loom::core::bench {

// The "model name" of /proc/cpuinfo's first CPU (benches quote it next to
// their figures); `unknown` where there is none (e.g. most ARM kernels).
std::string CpuModel(const std::string& unknown = "unknown");

// The middle sample; of an even count the upper of the two middle ones (not
// their mean: every sample is a time the machine really took). NaN if none.
double Median(std::vector<double> samples);

// Wall time since `start` on the steady clock, in ms.
double MillisecondsSince(std::chrono::steady_clock::time_point start);

}  // namespace loom::core::bench

#endif  // LOOM_CORE_BENCH_UTIL_BENCH_UTIL_H_
