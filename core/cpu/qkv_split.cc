#include "core/cpu/qkv_split.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/cpu/check.h"
#include "core/cpu/parallel.h"
#include "core/cpu/rope.h"
#include "core/ops/contracts/qkv_split_checks.h"

namespace loom::core::cpu {
namespace {

using internal::CheckInput;
using internal::CheckOutput;

// cos / sin of one token row's position, computed once per sequence position
// a thread meets (as RopeForward does); sin negated for the inverse.
class RowAngles {
 public:
  RowAngles(const std::vector<float>& inv_freq, int64_t offset, bool inverse)
      : inv_freq_(inv_freq), cos_(inv_freq.size()), sin_(inv_freq.size()), offset_(offset),
        inverse_(inverse) {}
  void At(int64_t s) {
    if (s == cached_) return;
    internal::RopeCosSin(s + offset_, inv_freq_.data(), static_cast<int64_t>(inv_freq_.size()),
                         cos_.data(), sin_.data());
    if (inverse_) {
      for (float& v : sin_) v = -v;
    }
    cached_ = s;
  }
  const float* cos() const { return cos_.data(); }
  const float* sin() const { return sin_.data(); }

 private:
  const std::vector<float>& inv_freq_;
  std::vector<float> cos_, sin_;
  int64_t offset_, cached_ = -1;
  bool inverse_;
};

std::vector<float> InvFreq(const QkvSplitOptions& o, int64_t r) {
  std::vector<float> inv_freq(r / 2);
  if (o.rope) internal::RopeInvFreq(o.rope_options.base, r, inv_freq.data());
  return inv_freq;
}

}  // namespace

absl::Status QkvSplitRopeForward(const Tensor& proj, const QkvSplitOptions& o, Tensor* qkv) {
  constexpr const char* kOp = "QkvSplitRopeForward";
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "proj", proj));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "qkv", qkv));
  LOOM_ASSIGN_OR_RETURN(const ops::QkvSplitDims g,
                        ops::CheckQkvSplitArgs(kOp, "proj", proj, "qkv", *qkv, o));
  const int64_t d = g.d, n = g.n, r = g.r, h = r / 2;
  const int64_t width = g.groups * (n + 2) * d, out_width = g.heads * 3 * d;
  const std::vector<float> inv_freq = InvFreq(o, r);
  const float* pp = proj.data<float>();
  float* pq = qkv->data<float>();
  internal::ParallelRowRuns(g.s * g.b, [&](int64_t lo, int64_t hi) {
    RowAngles angles(inv_freq, o.rope_options.position_offset, /*inverse=*/false);
    // RopeForward's rotation of one row (the gathered copy rotated in place
    // there: the same loop, so the same bits).
    auto rotate = [&](const float* in, float* out) {
      internal::RopeRotate(in, angles.cos(), angles.sin(), h, out);
      std::copy(in + r, in + d, out + r);
    };
    for (int64_t t = lo; t < hi; ++t) {
      if (o.rope) angles.At(t / g.b);
      const float* src = pp + t * width;
      float* dst = pq + t * out_width;
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        const float* in = src + grp * (n + 2) * d;  // q x n, k, v
        float* first = dst + grp * n * 3 * d;       // the group's first head's {q, k, v}
        for (int64_t j = 0; j < n; ++j) {
          float* out = first + j * 3 * d;
          if (o.rope) {
            rotate(in + j * d, out);
          } else {
            std::memcpy(out, in + j * d, d * sizeof(float));
          }
          if (j == 0) {
            if (o.rope) {
              rotate(in + n * d, out + d);
            } else {
              std::memcpy(out + d, in + n * d, d * sizeof(float));
            }
            std::memcpy(out + 2 * d, in + (n + 1) * d, d * sizeof(float));
          } else {  // the group's k and v, as rotated for its first head
            std::memcpy(out + d, first + d, 2 * d * sizeof(float));
          }
        }
      }
    }
  });
  return absl::OkStatus();
}

absl::Status QkvSplitRopeBackward(const Tensor& dqkv, const QkvSplitOptions& o, Tensor* dproj) {
  constexpr const char* kOp = "QkvSplitRopeBackward";
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "dqkv", dqkv));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "dproj", dproj));
  LOOM_ASSIGN_OR_RETURN(const ops::QkvSplitDims g,
                        ops::CheckQkvSplitArgs(kOp, "dproj", *dproj, "dqkv", dqkv, o));
  const int64_t d = g.d, n = g.n, r = g.r, h = r / 2;
  const int64_t width = g.groups * (n + 2) * d, in_width = g.heads * 3 * d;
  const std::vector<float> inv_freq = InvFreq(o, r);
  const float* pq = dqkv.data<float>();
  float* pp = dproj->data<float>();
  // The unfused path's operations, element by element: the scatter-add into a
  // zeroed f32 table (0 + each head's gradient, heads in order), with RoPE
  // the inverse rotation in place and a second scatter-add into a zeroed
  // dproj (0 + the row). The additions of 0 are kept: they turn -0 into +0.
  internal::ParallelRowRuns(g.s * g.b, [&](int64_t lo, int64_t hi) {
    RowAngles angles(inv_freq, o.rope_options.position_offset, /*inverse=*/true);
    std::vector<float> acc_buffer(d);
    float* acc = acc_buffer.data();
    auto store = [&](float* out, bool rotate) {
      if (o.rope) {
        if (rotate) internal::RopeRotate(acc, angles.cos(), angles.sin(), h, acc);
#pragma omp simd
        for (int64_t e = 0; e < d; ++e) out[e] = 0.0f + acc[e];
      } else {
        std::memcpy(out, acc, d * sizeof(float));
      }
    };
    for (int64_t t = lo; t < hi; ++t) {
      if (o.rope) angles.At(t / g.b);
      const float* src = pq + t * in_width;
      float* dst = pp + t * width;
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        const float* heads = src + grp * n * 3 * d;  // the group's [n, {q, k, v}, d]
        float* out = dst + grp * (n + 2) * d;
        for (int64_t j = 0; j < n; ++j) {
          const float* dq = heads + j * 3 * d;
#pragma omp simd
          for (int64_t e = 0; e < d; ++e) acc[e] = 0.0f + dq[e];
          store(out + j * d, /*rotate=*/true);
        }
        for (int64_t slot = 1; slot <= 2; ++slot) {  // k, v: summed over the heads in order
          std::fill(acc, acc + d, 0.0f);
          for (int64_t j = 0; j < n; ++j) {
            const float* dkv = heads + (j * 3 + slot) * d;
#pragma omp simd
            for (int64_t e = 0; e < d; ++e) acc[e] += dkv[e];
          }
          store(out + (n - 1 + slot) * d, /*rotate=*/slot == 1);
        }
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace loom::core::cpu
