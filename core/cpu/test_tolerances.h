#ifndef LOOM_CORE_CPU_TEST_TOLERANCES_H_
#define LOOM_CORE_CPU_TEST_TOLERANCES_H_

// Tolerances shared by the CPU kernel tests, which compare f32 kernels with
// references computed in double. A test whose error has another source (a
// GEMM's long sums, several optimizer steps, a double accumulator) keeps its
// own constant beside its reason.

namespace loom::core::cpu::testing {

// f32 forward results against the double reference, as RelError (relative to
// the largest reference value). The kernels sum at most a few thousand f32
// terms per output (a row of C <= 768 for LayerNorm, a softmax row, d and s
// terms in attention); the rounding of such sums stays well below 1e-5.
inline constexpr double kFwdTol = 1e-5;

// Step of the central differences (DirectionalDerivative) that the backward
// tests check gradients against.
inline constexpr double kFdEps = 1e-2;

// An analytic directional derivative against the central difference with
// step kFdEps, relative to the difference: the truncation error is
// O(kFdEps^2) ~ 1e-4, and the f32 rounding of the two losses, divided by
// 2 kFdEps, adds up to ~1e-3 on losses summed over thousands of elements.
inline constexpr double kGradTol = 2e-3;

}  // namespace loom::core::cpu::testing

#endif  // LOOM_CORE_CPU_TEST_TOLERANCES_H_
