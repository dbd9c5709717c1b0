#ifndef LOOM_CORE_CPU_ROPE_H_
#define LOOM_CORE_CPU_ROPE_H_

// Rotary position embedding (RoPE) in Hugging Face Llama's rotate-half
// convention (also Megatron's default, non-interleaved): the first
// rotary_dim dims of every head are rotated as pairs (i, i + r/2), the rest
// pass through unchanged.
//
// Angles follow transformers' f32 arithmetic, so Loom matches its logits: for
// position p and i < r/2 (r = rotary_dim),
//   inv_freq_i = 1.0f / f32(base ^ f32(f32(2i) / f32(r)))
//                (HF: 1.0 / (base ** (torch.arange(0, r, 2).float() / r)))
//   theta      = f32(f32(p) * inv_freq_i)
//                (HF: outer product of position_ids.float() and inv_freq, in f32)
//   cos, sin   = the f32 nearest to the exact cos(theta), sin(theta)
// The power and cos/sin are evaluated in double and rounded once, so each is
// the correctly rounded f32 value in nearly all cases (PyTorch's f32 pow, cos
// and sin are within an ulp of those). At large positions the f32 theta is
// what HF computes, not p * base^(-2i/r) in exact arithmetic: the two differ
// by up to p * 2^-24 radians, which is why the angle is not taken in double.
// No rope scaling (Llama 3.1's "llama3", YaRN, linear): the default
// "attention_scaling" of 1 only.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/ops/contracts/options.h"
#include "core/tensor.h"

namespace loom::core::cpu {

using ops::RopeOptions;  // the contract's options (core/ops/contracts/options.h)

// x is [S, B, H, D] with D > 0 (dtype and placement are checked by each
// device), base finite and > 0, rotary_dim 0 (then D must be
// even) or even in (0, D], position_offset >= 0. Returns r, the rotary dim.
// Every device's RoPE checks its arguments with this.
absl::StatusOr<int64_t> CheckRopeArgs(const char* op, const char* x_name, const Tensor& x,
                                      const RopeOptions& o);

// For s < S, every (b, h) row and i < r/2, with theta of position
// s + position_offset:
//   out[i]       = x[i] cos(theta_i) - x[i + r/2] sin(theta_i)
//   out[i + r/2] = x[i + r/2] cos(theta_i) + x[i] sin(theta_i)
//   out[j]       = x[j] for j >= r
//   x, out: f32[S, B, H, D] (sequence-first, as Loom lays activations out),
//   same shape; out may be x (in place).
absl::Status RopeForward(const Tensor& x, const RopeOptions& o, Tensor* out);

// The inverse rotation (by -theta), which is also RopeForward's gradient:
//   dx[i] = dout[i] cos + dout[i + r/2] sin; dx[i + r/2] = dout[i + r/2] cos - dout[i] sin.
//   dout, dx: f32[S, B, H, D], same shape; dx may be dout (in place).
absl::Status RopeBackward(const Tensor& dout, const RopeOptions& o, Tensor* dx);

namespace internal {
// inv_freq[i] for i < r / 2, as above.
void RopeInvFreq(float base, int64_t r, float* inv_freq);
// cos[i], sin[i] of theta_i = f32(f32(position) * inv_freq[i]), i < n.
void RopeCosSin(int64_t position, const float* inv_freq, int64_t n, float* cos, float* sin);
// One head's rotation, the loop RopeForward / RopeBackward run (so fused
// kernels reusing it give their bits): for i < h, out[i] = x[i] cos[i] -
// x[i + h] sin[i], out[i + h] = x[i + h] cos[i] + x[i] sin[i] (sin negated:
// the inverse). out may be x; dims from 2h on are not touched.
void RopeRotate(const float* x, const float* cos, const float* sin, int64_t h, float* out);
}  // namespace internal

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_ROPE_H_
