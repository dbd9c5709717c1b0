#ifndef LOOM_CORE_CPU_ATTENTION_TEST_UTIL_H_
#define LOOM_CORE_CPU_ATTENTION_TEST_UTIL_H_

// What the tests of the two CPU attention kernels (attention_test.cc,
// flash_attention_test.cc) share: the cases, a double reference, both kernels
// behind one call, and the checks both must pass. A kernel is named by what
// its forward keeps (attention_checks.h): kProbs is attention.h's s x s
// kernel, kLse the flash kernel.

#include <cstdint>
#include <ostream>
#include <vector>

#include "core/cpu/attention.h"
#include "core/cpu/attention_checks.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace loom::core::cpu::testing {

struct AttentionCase {
  int64_t s, b, heads, d;
  float p = 0.0f;  // attention dropout probability (seed 11, offset 22)

  Shape Qkv() const { return {s, b, heads * 3 * d}; }
  Shape Out() const { return {s, b, heads * d}; }
  AttentionDropout Dropout() const { return {p, 11, 22, 0, 0}; }
};
void PrintTo(const AttentionCase& c, std::ostream* os);

// Naive causal attention with dropout in double over the documented layouts;
// the mask is DropoutBitsAt at the global index. probs: before dropout, zero
// above the diagonal; dqkv only with a dout.
struct Reference {
  std::vector<double> out, probs, lse, dqkv;
};
Reference RefAttention(const Tensor& qkv, int64_t heads, const AttentionDropout& dr,
                       const Tensor* dout = nullptr);

// One kernel's forward, and with a dout its backward (dqkv starts as random
// values, so that an element the kernel does not write shows). A failing
// status fails the test.
struct AttentionRun {
  Tensor out, saved, dqkv;  // saved: probs or lse
};
AttentionRun RunAttention(AttentionSaved kernel, const Tensor& qkv, int64_t heads,
                          const AttentionDropout& dr, const Tensor* dout = nullptr);

// Sets every head's v_t to e_t (needs d = s): out row i is then the dropped
// probability row i.
void SetIdentityV(Tensor* qkv, int64_t heads);

// Heads [first, first + count) of t [s, b, heads * w]: the [s, b, count * w]
// slice a tensor-parallel rank owns.
Tensor SliceHeads(const Tensor& t, int64_t heads, int64_t first, int64_t count);

// got == want element by element (same shape), naming the first difference.
::testing::AssertionResult SameFloats(const Tensor& got, const Tensor& want);

// The forward against RefAttention (out, the saved tensor, then dqkv) on
// random qkv in [-2, 2), with the case's dropout.
void ExpectMatchesDoubleReference(AttentionSaved kernel, const AttentionCase& c);

// dqkv (with dout = w) against central differences of the loss <out, w>:
// qkv in [-1, 1) from qkv_seed, w from qkv_seed + 1; the directions, from
// dir_seed - 1 on, span all of qkv, then q, k and v alone.
void ExpectGradientMatchesFiniteDifferences(AttentionSaved kernel, const AttentionCase& c,
                                            const AttentionDropout& dr, uint64_t qkv_seed,
                                            uint64_t dir_seed);

// A TP rank owning heads [2, 4) of 4 (dropout with head_offset = 2) gets
// exactly its part of the full run, forward and backward; with head_offset 0
// its mask, and so its out, differs.
void ExpectTensorParallelSliceIsBitwiseTheFullRun(AttentionSaved kernel);

}  // namespace loom::core::cpu::testing

#endif  // LOOM_CORE_CPU_ATTENTION_TEST_UTIL_H_
