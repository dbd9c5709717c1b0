#include "core/cpu/bf16_gemm.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "core/cpu/convert.h"
#include "core/cpu/cpu_features.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace loom::core::cpu {
namespace {

// ---------------------------------------------------------------- conversion

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void ConvertAvx512Bf16(
    const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 lo = _mm512_loadu_ps(src + i);
    const __m512 hi = _mm512_loadu_ps(src + i + 16);
    const __m512bh packed = _mm512_cvtne2ps_pbh(hi, lo);  // [lo, hi]
    _mm512_storeu_si512(reinterpret_cast<void*>(dst + i), reinterpret_cast<__m512i>(packed));
  }
  for (; i < n; ++i) dst[i] = FloatToBf16Bits(src[i]);
}

// ---------------------------------------------------------------- primitives

struct Key {
  int64_t m, n, k, lda, ldb, ldc;
  bool ta, tb;
  float alpha, beta;
  bool operator==(const Key& o) const {
    return m == o.m && n == o.n && k == o.k && lda == o.lda && ldb == o.ldb && ldc == o.ldc &&
           ta == o.ta && tb == o.tb && alpha == o.alpha && beta == o.beta;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = 0;
    auto mix = [&h](uint64_t v) { h ^= std::hash<uint64_t>()(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    mix(k.m), mix(k.n), mix(k.k), mix(k.lda), mix(k.ldb), mix(k.ldc);
    mix((k.ta ? 1 : 0) | (k.tb ? 2 : 0));
    uint32_t a, b;
    std::memcpy(&a, &k.alpha, 4);
    std::memcpy(&b, &k.beta, 4);
    mix((static_cast<uint64_t>(a) << 32) | b);
    return h;
  }
};

struct Cached {
  dnnl::memory::desc a, b, c;
  dnnl::matmul prim;
};

const dnnl::engine& Engine() {
  static const dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

// Per thread: ranks run as threads, and a primitive is executed by one thread at a time.
struct ThreadState {
  dnnl::stream stream{Engine()};
  std::unordered_map<Key, Cached, KeyHash> cache;
};

ThreadState& State() {
  thread_local ThreadState state;
  return state;
}

absl::StatusOr<Cached*> Lookup(const Key& key) {
  ThreadState& st = State();
  auto it = st.cache.find(key);
  if (it != st.cache.end()) return &it->second;
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  try {
    Cached c;
    c.a = dnnl::memory::desc(dims{key.m, key.k}, dt::bf16,
                             key.ta ? dims{1, key.lda} : dims{key.lda, 1});
    c.b = dnnl::memory::desc(dims{key.k, key.n}, dt::bf16,
                             key.tb ? dims{1, key.ldb} : dims{key.ldb, 1});
    c.c = dnnl::memory::desc(dims{key.m, key.n}, dt::f32, dims{key.ldc, 1});
    dnnl::primitive_attr attr;
    if (key.alpha != 1.0f) attr.set_output_scales(0, {key.alpha});
    if (key.beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(key.beta);
      attr.set_post_ops(ops);
    }
    dnnl::matmul::desc desc(c.a, c.b, c.c);
    dnnl::matmul::primitive_desc pd(desc, attr, Engine());
    c.prim = dnnl::matmul(pd);
    return &st.cache.emplace(key, std::move(c)).first->second;
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("Bf16Gemm: oneDNN matmul for M=", key.m, " N=", key.n,
                                            " K=", key.k, " trans_a=", key.ta, " trans_b=", key.tb,
                                            ": ", e.what()));
  }
}

}  // namespace

void ConvertF32ToBf16(const float* src, uint16_t* dst, int64_t n) {
  static const bool avx512_bf16 = HostCpuFeatures().avx512_bf16;
  if (!avx512_bf16) {  // (AMX-BF16 without AVX512_BF16) convert.h's exact rounding
    F32ToBf16(src, dst, n);
    return;
  }
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1 && !omp_in_parallel())
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk;
    ConvertAvx512Bf16(src + begin, dst + begin, std::min(kChunk, n - begin));
  }
}

absl::Status Bf16Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                      const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                      float* c, int64_t ldc) {
  if (m == 0 || n == 0) return absl::OkStatus();
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    }
    return absl::OkStatus();
  }
  const Key key{m, n, k, lda, ldb, ldc, trans_a, trans_b, alpha, beta};
  absl::StatusOr<Cached*> cached = Lookup(key);
  if (!cached.ok()) return cached.status();
  try {
    const dnnl::engine& eng = Engine();
    dnnl::memory am((*cached)->a, eng, const_cast<uint16_t*>(a));
    dnnl::memory bm((*cached)->b, eng, const_cast<uint16_t*>(b));
    dnnl::memory cm((*cached)->c, eng, c);
    dnnl::stream& s = State().stream;
    (*cached)->prim.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    s.wait();
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("Bf16Gemm: oneDNN matmul failed for M=", m, " N=", n,
                                            " K=", k, ": ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace loom::core::cpu
