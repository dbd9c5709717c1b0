#include "core/cpu/swiglu.h"

#include <algorithm>

#include "core/cpu/check.h"
#include "core/ops/contracts/shape_checks.h"
#include "core/cpu/vec_math.h"

namespace loom::core::cpu {
namespace {

using internal::CheckInput;
using internal::CheckOutput;
using internal::ExpF;

// Columns per parallel task: rows are split into segments of at most this
// many outputs, so a few long rows still spread over the threads.
constexpr int64_t kSegment = 1 << 12;

LOOM_CPU_INLINE void SwigluForwardRangeBody(const float* gate, const float* up, int64_t n,
                                            float* out) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const float g = gate[j];
    out[j] = g / (1.0f + ExpF(-g)) * up[j];
  }
}
LOOM_CPU_MULTIVERSION(SwigluForwardRange,
                      (const float* gate, const float* up, int64_t n, float* out),
                      (gate, up, n, out))

// dgate/dup may be gate/up: element j of both is read before it is written.
LOOM_CPU_INLINE void SwigluBackwardRangeBody(const float* dout, const float* gate, const float* up,
                                             int64_t n, float* dgate, float* dup) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const float g = gate[j], u = up[j], d = dout[j];
    const float s = 1.0f / (1.0f + ExpF(-g));
    dgate[j] = d * u * (s * (1.0f + g * (1.0f - s)));
    dup[j] = d * (g * s);
  }
}
LOOM_CPU_MULTIVERSION(SwigluBackwardRange,
                      (const float* dout, const float* gate, const float* up, int64_t n,
                       float* dgate, float* dup),
                      (dout, gate, up, n, dgate, dup))

// Runs fn(row, j0, n) over segments [j0, j0 + n) of every row of F outputs,
// in parallel.
template <typename Fn>
void ForEachSegment(const ops::SwigluDims& dims, Fn&& fn) {
  const int64_t per_row = (dims.f + kSegment - 1) / kSegment;
#pragma omp parallel for schedule(static)
  for (int64_t task = 0; task < dims.rows * per_row; ++task) {
    const int64_t row = task / per_row, j0 = task % per_row * kSegment;
    fn(row, j0, std::min(kSegment, dims.f - j0));
  }
}

}  // namespace

absl::Status SwigluForward(const Tensor& x, Tensor* out) {
  constexpr const char* kOp = "SwigluForward";
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "x", x));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "out", out));
  LOOM_ASSIGN_OR_RETURN(const ops::SwigluDims dims, ops::CheckSwigluHalves(kOp, x, "out", *out));
  const int64_t f = dims.f;
  const float* px = x.data<float>();
  float* po = out->data<float>();
  ForEachSegment(dims, [&](int64_t row, int64_t j0, int64_t n) {
    const float* gate = px + row * 2 * f + j0;
    SwigluForwardRange(gate, gate + f, n, po + row * f + j0);
  });
  return absl::OkStatus();
}

absl::Status SwigluBackward(const Tensor& dout, const Tensor& x, Tensor* dx) {
  constexpr const char* kOp = "SwigluBackward";
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "dout", dout));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "x", x));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "dx", dx));
  LOOM_ASSIGN_OR_RETURN(const ops::SwigluDims dims, ops::CheckSwigluHalves(kOp, x, "dout", dout));
  LOOM_RETURN_IF_ERROR(CheckSameShape(kOp, "x", x, "dx", *dx));
  const int64_t f = dims.f;
  const float* pd = dout.data<float>();
  const float* px = x.data<float>();
  float* pdx = dx->data<float>();
  ForEachSegment(dims, [&](int64_t row, int64_t j0, int64_t n) {
    const float* gate = px + row * 2 * f + j0;
    float* dgate = pdx + row * 2 * f + j0;
    SwigluBackwardRange(pd + row * f + j0, gate, gate + f, n, dgate, dgate + f);
  });
  return absl::OkStatus();
}

}  // namespace loom::core::cpu
