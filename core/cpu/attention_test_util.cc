#include "core/cpu/attention_test_util.h"

#include <algorithm>
#include <cmath>

#include "core/cpu/flash_attention.h"
#include "core/cpu/philox.h"
#include "core/cpu/test_tolerances.h"
#include "core/cpu/test_util.h"

namespace loom::core::cpu::testing {

void PrintTo(const AttentionCase& c, std::ostream* os) {
  *os << "s=" << c.s << " b=" << c.b << " heads=" << c.heads << " d=" << c.d << " p=" << c.p;
}

Reference RefAttention(const Tensor& qkv, int64_t heads, const AttentionDropout& dr,
                       const Tensor* dout) {
  const int64_t s = qkv.dim(0), b = qkv.dim(1), d = qkv.dim(2) / (3 * heads);
  const int64_t total = dr.total_heads == 0 ? heads : dr.total_heads;
  const std::vector<double> x = ToDouble(qkv);
  const std::vector<double> dy = dout != nullptr ? ToDouble(*dout) : std::vector<double>();
  const uint32_t threshold = DropoutThreshold(dr.p);
  const double keep_scale = dr.p >= 1.0f ? 0.0 : 1.0 / (1.0 - static_cast<double>(dr.p));
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  auto at = [&](int64_t t, int64_t bi, int64_t h, int64_t which) {
    return ((t * b + bi) * heads + h) * 3 * d + which * d;
  };
  auto at_out = [&](int64_t t, int64_t bi, int64_t h) { return ((t * b + bi) * heads + h) * d; };
  Reference ref;
  ref.out.assign(s * b * heads * d, 0.0);
  ref.probs.assign(b * heads * s * s, 0.0);
  ref.lse.assign(b * heads * s, 0.0);
  if (dout != nullptr) ref.dqkv.assign(x.size(), 0.0);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t h = 0; h < heads; ++h) {
      double* p = ref.probs.data() + (bi * heads + h) * s * s;
      std::vector<double> keep(s * s, 0.0);
      for (int64_t i = 0; i < s; ++i) {
        double mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < d; ++e) dot += x[at(i, bi, h, 0) + e] * x[at(j, bi, h, 1) + e];
          p[i * s + j] = dot * scale;
          mx = std::max(mx, p[i * s + j]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) sum += p[i * s + j] = std::exp(p[i * s + j] - mx);
        ref.lse[(bi * heads + h) * s + i] = mx + std::log(sum);
        for (int64_t j = 0; j <= i; ++j) {
          p[i * s + j] /= sum;
          const uint64_t index =
              static_cast<uint64_t>(((bi * total + dr.head_offset + h) * s + i) * s + j);
          keep[i * s + j] = dr.p == 0.0f                                            ? 1.0
                            : DropoutBitsAt(dr.seed, dr.offset, index) >= threshold ? keep_scale
                                                                                    : 0.0;
          for (int64_t e = 0; e < d; ++e) {
            ref.out[at_out(i, bi, h) + e] +=
                p[i * s + j] * keep[i * s + j] * x[at(j, bi, h, 2) + e];
          }
        }
      }
      if (dout == nullptr) continue;
      // Backward: dPd = dO Vᵀ, dP = dPd keep, dS = P (dP - rowsum(P dP)).
      for (int64_t i = 0; i < s; ++i) {
        std::vector<double> dp(i + 1);
        double dot = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double v = 0;
          for (int64_t e = 0; e < d; ++e) v += dy[at_out(i, bi, h) + e] * x[at(j, bi, h, 2) + e];
          dp[j] = v * keep[i * s + j];
          dot += p[i * s + j] * dp[j];
          for (int64_t e = 0; e < d; ++e) {  // dV_j += Pd_ij dO_i
            ref.dqkv[at(j, bi, h, 2) + e] +=
                p[i * s + j] * keep[i * s + j] * dy[at_out(i, bi, h) + e];
          }
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double ds = p[i * s + j] * (dp[j] - dot) * scale;
          for (int64_t e = 0; e < d; ++e) {
            ref.dqkv[at(i, bi, h, 0) + e] += ds * x[at(j, bi, h, 1) + e];
            ref.dqkv[at(j, bi, h, 1) + e] += ds * x[at(i, bi, h, 0) + e];
          }
        }
      }
    }
  }
  return ref;
}

AttentionRun RunAttention(AttentionSaved kernel, const Tensor& qkv, int64_t heads,
                          const AttentionDropout& dr, const Tensor* dout) {
  const AttentionDims g{qkv.dim(0), qkv.dim(1), heads, qkv.dim(2) / (3 * heads)};
  const bool flash = kernel == AttentionSaved::kLse;
  AttentionRun run{Make({g.s, g.b, g.heads * g.d}), Make(ops::SavedShape(kernel, g)), Tensor()};
  const absl::Status fwd = flash ? FlashAttentionForward(qkv, heads, &run.out, &run.saved, dr)
                                 : AttentionForward(qkv, heads, &run.out, &run.saved, dr);
  EXPECT_TRUE(fwd.ok()) << fwd;
  if (dout == nullptr) return run;
  run.dqkv = Random(qkv.shape(), 9);  // overwritten
  const absl::Status bwd =
      flash ? FlashAttentionBackward(*dout, qkv, run.out, run.saved, heads, &run.dqkv, dr)
            : AttentionBackward(*dout, qkv, run.saved, heads, &run.dqkv, dr);
  EXPECT_TRUE(bwd.ok()) << bwd;
  return run;
}

void SetIdentityV(Tensor* qkv, int64_t heads) {
  const int64_t s = qkv->dim(0), b = qkv->dim(1), d = qkv->dim(2) / (3 * heads);
  for (int64_t t = 0; t < s; ++t) {
    for (int64_t bi = 0; bi < b; ++bi) {
      for (int64_t h = 0; h < heads; ++h) {
        float* v = qkv->data<float>() + ((t * b + bi) * heads + h) * 3 * d + 2 * d;
        for (int64_t e = 0; e < d; ++e) v[e] = e == t ? 1.0f : 0.0f;
      }
    }
  }
}

Tensor SliceHeads(const Tensor& t, int64_t heads, int64_t first, int64_t count) {
  const int64_t tokens = t.dim(0) * t.dim(1), w = t.dim(2) / heads;
  Tensor slice = Make({t.dim(0), t.dim(1), count * w});
  for (int64_t i = 0; i < tokens; ++i) {
    const float* src = t.data<float>() + i * heads * w + first * w;
    std::copy(src, src + count * w, slice.data<float>() + i * count * w);
  }
  return slice;
}

::testing::AssertionResult SameFloats(const Tensor& got, const Tensor& want) {
  if (got.shape() != want.shape()) {
    return ::testing::AssertionFailure() << got.DebugString() << " vs " << want.DebugString();
  }
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (got.data<float>()[i] != want.data<float>()[i]) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << got.data<float>()[i] << " vs " << want.data<float>()[i];
    }
  }
  return ::testing::AssertionSuccess();
}

void ExpectMatchesDoubleReference(AttentionSaved kernel, const AttentionCase& c) {
  const AttentionDropout dr = c.Dropout();
  const Tensor qkv = Random(c.Qkv(), 1, -2.0f, 2.0f);
  const Tensor dout = Random(c.Out(), 2);
  const AttentionRun run = RunAttention(kernel, qkv, c.heads, dr, &dout);
  const Reference ref = RefAttention(qkv, c.heads, dr, &dout);
  EXPECT_LE(RelError(run.out, ref.out), kFwdTol);
  EXPECT_LE(RelError(run.saved, kernel == AttentionSaved::kProbs ? ref.probs : ref.lse), kFwdTol)
      << ops::SavedName(kernel);
  // dQ, dK sum s products of d-long dots: a little above the forward's error.
  EXPECT_LE(RelError(run.dqkv, ref.dqkv), 5 * kFwdTol);
}

void ExpectGradientMatchesFiniteDifferences(AttentionSaved kernel, const AttentionCase& c,
                                            const AttentionDropout& dr, uint64_t qkv_seed,
                                            uint64_t dir_seed) {
  Tensor qkv = Random(c.Qkv(), qkv_seed, -1.0f, 1.0f);
  const Tensor w = Random(c.Out(), qkv_seed + 1);
  auto loss = [&] { return Dot(RunAttention(kernel, qkv, c.heads, dr).out, w); };
  const Tensor dqkv = RunAttention(kernel, qkv, c.heads, dr, &w).dqkv;
  for (int which = -1; which < 3; ++which) {  // all of qkv, then q, k, v alone
    Tensor dir = Random(qkv.shape(), dir_seed + which);
    float* p = dir.data<float>();
    for (int64_t i = 0; i < dir.numel(); ++i) {
      if (which >= 0 && (i % (3 * c.d)) / c.d != which) p[i] = 0.0f;
    }
    const double fd = DirectionalDerivative(qkv, dir, kFdEps, loss);
    EXPECT_NEAR(Dot(dqkv, dir), fd, kGradTol * std::fabs(fd) + 1e-4) << "direction " << which;
  }
}

void ExpectTensorParallelSliceIsBitwiseTheFullRun(AttentionSaved kernel) {
  const int64_t s = 150, b = 2, heads = 4, d = 5, local = 2, first = 2;
  const AttentionDropout full_dr{0.2f, 3, 9, 0, 0};
  const AttentionDropout rank_dr{0.2f, 3, 9, first, heads};
  const Tensor qkv = Random({s, b, heads * 3 * d}, 1);
  const Tensor dout = Random({s, b, heads * d}, 2);
  const AttentionRun full = RunAttention(kernel, qkv, heads, full_dr, &dout);
  const Tensor qkv_r = SliceHeads(qkv, heads, first, local);
  const Tensor dout_r = SliceHeads(dout, heads, first, local);
  const AttentionRun rank = RunAttention(kernel, qkv_r, local, rank_dr, &dout_r);
  EXPECT_TRUE(SameFloats(rank.out, SliceHeads(full.out, heads, first, local))) << "out";
  EXPECT_TRUE(SameFloats(rank.dqkv, SliceHeads(full.dqkv, heads, first, local))) << "dqkv";
  // The rank's mask is not the one of heads [0, 2): head_offset matters.
  const AttentionRun first_heads = RunAttention(kernel, qkv_r, local, full_dr);
  EXPECT_GT(RelError(first_heads.out, ToDouble(rank.out)), 1e-3);
}

}  // namespace loom::core::cpu::testing
