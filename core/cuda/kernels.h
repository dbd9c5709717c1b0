#ifndef LOOM_CORE_CUDA_KERNELS_H_
#define LOOM_CORE_CUDA_KERNELS_H_

// Launchers of the nvcc-compiled kernels (the *.cu files). Internal to
// //core/cuda: the public API is the per-topic headers (elementwise.h, ...),
// which check arguments and call these. Plain types only (no Abseil, no
// Tensor), so nvcc never parses Abseil. Every launcher enqueues on `stream`,
// returns the launch status (cudaGetLastError) and accepts n == 0.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::core::cuda::kernels {

enum class Elem { kF32, kBF16, kF16 };  // element type of a float tensor
enum class Index { kI32, kI64 };        // element type of an id tensor

// ---- elementwise.cu
// out[r, c] = x[r, c] + bias[c]; all of type t.
cudaError_t BiasAdd(Elem t, const void* x, const void* bias, void* out, int64_t rows, int64_t c,
                    cudaStream_t stream);
// partials[k, j] = sum of dout[r, j] over rows r of chunk k (kColumnChunkRows rows each).
// With x/rstd non-null also gpartials[k, j] = sum dout[r, j] (x[r, j] - mean[r]) rstd[r]
// (LayerNorm's dgamma; mean null: 0, RMSNorm's dgamma). partials may then be
// null (not written). Partials are f32 [ColumnChunks(rows), c].
inline constexpr int64_t kColumnChunkRows = 256;
inline int64_t ColumnChunks(int64_t rows) { return (rows + kColumnChunkRows - 1) / kColumnChunkRows; }
cudaError_t ColumnPartials(Elem t, const void* dout, const void* x, const float* mean,
                           const float* rstd, int64_t rows, int64_t c, float* partials,
                           float* gpartials, cudaStream_t stream);
// dst[j] += sum_k partials[k, j] (k in order: deterministic); dst of type g.
cudaError_t AccumulatePartials(Elem g, const float* partials, int64_t chunks, int64_t c, void* dst,
                               cudaStream_t stream);
cudaError_t Gelu(Elem t, const void* x, void* out, int64_t n, cudaStream_t stream);
cudaError_t GeluGrad(Elem t, const void* x, const void* dout, void* dx, int64_t n,
                     cudaStream_t stream);
cudaError_t Add(Elem t, const void* a, const void* b, void* out, int64_t n, cudaStream_t stream);
cudaError_t Scale(Elem t, float scale, void* x, int64_t n, cudaStream_t stream);

// ---- layernorm.cu: LayerNorm (mean, rstd: f32 [rows]) and RMSNorm
cudaError_t LayerNormForward(Elem t, const void* x, const void* gamma, const void* beta, float eps,
                             int64_t rows, int64_t c, void* out, float* mean, float* rstd,
                             cudaStream_t stream);
// dx only (dgamma/dbeta come from ColumnPartials). dx may alias dout.
cudaError_t LayerNormBackwardDx(Elem t, const void* dout, const void* x, const void* gamma,
                                const float* mean, const float* rstd, int64_t rows, int64_t c,
                                void* dx, cudaStream_t stream);

// RMSNorm (rstd: f32 [rows]); its dgamma: ColumnPartials with mean null.
cudaError_t RmsNormForward(Elem t, const void* x, const void* gamma, float eps, int64_t rows,
                           int64_t c, void* out, float* rstd, cudaStream_t stream);
// dx may alias dout.
cudaError_t RmsNormBackwardDx(Elem t, const void* dout, const void* x, const void* gamma,
                              const float* rstd, int64_t rows, int64_t c, void* dx,
                              cudaStream_t stream);

// ---- rope.cu: x, out [rows = S * B * H, d]; rows of position s are
// [s * heads, (s + 1) * heads). cos/sin: f32 [S, r / 2].
// cos[s, i] = cos(theta), sin[s, i] = sign * sin(theta) for
// theta = f32(f32(s + offset) * inv_freq_i), inv_freq_i = 1 / f32(base^(2i / r)):
// core/cpu/rope.h's f32 angles, cos/sin rounded once from double.
cudaError_t RopeTable(float base, int64_t r, int64_t offset, int64_t seq, float sign, float* cos,
                      float* sin, cudaStream_t stream);
// Rotates dims [0, r) of every row by the table; copies dims [r, d) unless
// out == x (in place allowed).
cudaError_t RopeApply(Elem t, const void* x, const float* cos, const float* sin, int64_t rows,
                      int64_t heads, int64_t d, int64_t r, void* out, cudaStream_t stream);

// ---- swiglu.cu: x [rows, 2f] = [gate | up], out / dout [rows, f].
cudaError_t SwigluForward(Elem t, const void* x, int64_t rows, int64_t f, void* out,
                          cudaStream_t stream);
// dx [rows, 2f]; may alias x.
cudaError_t SwigluBackward(Elem t, const void* dout, const void* x, int64_t rows, int64_t f,
                           void* dx, cudaStream_t stream);

// ---- softmax.cu
cudaError_t SoftmaxForward(Elem t, const void* x, void* out, int64_t rows, int64_t c,
                           cudaStream_t stream);
cudaError_t SoftmaxBackward(Elem t, const void* out, const void* dout, void* dx, int64_t rows,
                            int64_t c, cudaStream_t stream);

// ---- dropout.cu: local (r, j) has global index first + r * stride + j.
struct DropoutParams {
  uint64_t seed = 0;
  uint64_t offset = 0;
  uint32_t threshold = 0;  // kept iff bits >= threshold
  float scale = 1.0f;      // applied to kept elements
};
cudaError_t Dropout(Elem t, const void* x, void* out, uint8_t* mask, int64_t rows, int64_t c,
                    int64_t first, int64_t stride, const DropoutParams& p, cudaStream_t stream);

// ---- attention.cu. `pairs` = b * heads (pair = bi * heads + h), rows of s.
struct AttentionMask {
  bool dropout = false;
  DropoutParams params;
  int64_t heads = 1;        // local heads
  int64_t total_heads = 1;  // global heads
  int64_t head_offset = 0;
  // Packed documents: device i32 [b, seq_len] (the global sequence; ops'
  // AttentionDropout::doc_start), query i of row bi sees keys
  // doc_start[bi * seq_len + i]..i. Null: plain causal.
  const int32_t* doc_start = nullptr;
};
// In place on scores [pairs, s, s] (already scaled): row i becomes the
// softmax over columns lo..i (lo: its document's start, else 0), zeros
// elsewhere. With dropout also dropped = probs * keep * scale (zeros elsewhere).
cudaError_t CausalSoftmaxForward(Elem t, void* scores, void* dropped, int64_t pairs, int64_t s,
                                 const AttentionMask& mask, cudaStream_t stream);
// ds holds dP (the gradient of the dropped probabilities) and becomes
// dS = attn_scale * P * (dP' - rowsum(P * dP')), dP' = dP * keep * scale;
// with dropout also dropped = P * keep * scale. Zeros outside lo..i.
cudaError_t CausalSoftmaxBackward(Elem t, const void* probs, void* ds, void* dropped, int64_t pairs,
                                  int64_t s, float attn_scale, const AttentionMask& mask,
                                  cudaStream_t stream);
// Flash attention (core/cpu/flash_attention.h's algorithm): qkv [s, b,
// heads, 3, d], out / dout [s, b, heads, d] of type t; lse, delta f32
// [b * heads, s]. Tiles of FlashRows(d) rows; d <= kFlashMaxHeadDim.
inline constexpr int64_t kFlashMaxHeadDim = 256;
inline int FlashRows(int64_t d) { return d <= 64 ? 64 : 32; }
cudaError_t FlashAttentionForward(Elem t, const void* qkv, void* out, float* lse, int64_t s,
                                  int64_t b, int64_t d, const AttentionMask& mask,
                                  cudaStream_t stream);
// delta: scratch f32 [b * heads, s] (rowsum(dO * O)); writes every element of dqkv.
cudaError_t FlashAttentionBackward(Elem t, const void* dout, const void* qkv, const void* out,
                                   const float* lse, float* delta, void* dqkv, int64_t s,
                                   int64_t b, int64_t d, const AttentionMask& mask,
                                   cudaStream_t stream);
// The context-parallel ring's blocks (core/cpu/flash_block.h) on the same
// kernels: Q rows of qkv against K/V rows of the packed buffer [kv_rows, b,
// heads, 2, d] at global positions. Pointers are at the block's first rows:
// the state (acc [pairs, st_rows, d], m, l, lse, delta [pairs, st_rows],
// f32) at its first Q row, dout and the f32 dQ accumulator (qkv's layout) at
// its first Q row, the f32 dK/dV accumulator (kv's layout) at its first K row.
struct FlashBlockArgs {
  const void* q = nullptr;
  const void* kv = nullptr;
  int64_t b = 0, d = 0;
  int64_t q_len = 0, k_len = 0;
  int64_t st_rows = 0;
  int64_t q_start = 0, k_start = 0, seq_len = 0;
  bool causal = true;
};
cudaError_t FlashBlockForward(Elem t, const FlashBlockArgs& a, float* acc, float* max,
                              float* sum, const AttentionMask& mask, cudaStream_t stream);
// dQ, dK, dV += the block's parts (dkv: K at dkv, V at dkv + d).
cudaError_t FlashBlockBackward(Elem t, const FlashBlockArgs& a, const void* dout,
                               const float* lse, const float* delta, float* dq, float* dkv,
                               const AttentionMask& mask, cudaStream_t stream);
// delta [b * heads, rows] = rowsum(dout * out), dout / out [rows, b, heads, d].
cudaError_t FlashBlockDelta(Elem t, const void* dout, const void* out, int64_t rows, int64_t b,
                            int64_t heads, int64_t d, float* delta, cudaStream_t stream);
// acc [rows, d] = 0, max [rows] = -inf, sum [rows] = 0 (rows: of every pair).
cudaError_t FlashBlockInit(float* acc, float* max, float* sum, int64_t rows, int64_t d,
                           cudaStream_t stream);
// out [rows, pairs, d] = acc [pairs, rows, d] / sum, lse = max + log(sum).
cudaError_t FlashBlockFinish(Elem t, const float* acc, const float* max, const float* sum,
                             void* out, float* lse, int64_t rows, int64_t pairs, int64_t d,
                             cudaStream_t stream);
// n runs of `width` elements of type t from src + r * src_stride + src_first
// to dst + r * dst_stride + dst_first (the ring's K/V packing).
cudaError_t CopyRuns(Elem t, const void* src, int64_t src_stride, int64_t src_first, void* dst,
                     int64_t dst_stride, int64_t dst_first, int64_t n, int64_t width,
                     cudaStream_t stream);

// ---- cross_entropy.cu (losses, lse: f32 [rows])
// count += non-ignored rows; *bad_row = min row whose target is neither
// ignore_index nor in [0, v) (init it to rows).
cudaError_t CrossEntropyForward(Elem t, const void* logits, Index it, const void* targets,
                                int64_t rows, int64_t v, int64_t ignore_index, float* losses,
                                float* lse, unsigned long long* count, unsigned long long* bad_row,
                                cudaStream_t stream);
cudaError_t CountNotIgnored(Index it, const void* targets, int64_t rows, int64_t ignore_index,
                            unsigned long long* count, cudaStream_t stream);
// dlogits may alias logits. Rows with an out-of-range target become NaN.
cudaError_t CrossEntropyBackward(Elem t, const void* logits, Index it, const void* targets,
                                 const float* lse, int64_t rows, int64_t v, int64_t ignore_index,
                                 float dloss, const unsigned long long* count, void* dlogits,
                                 cudaStream_t stream);

// ---- vocab_parallel_ce.cu: logits [rows, vp], the first `valid` columns real.
cudaError_t VocabRowMax(Elem t, const void* logits, int64_t rows, int64_t vp, int64_t valid,
                        float* max, cudaStream_t stream);
// sums: f32 [2, rows] = (sum exp(x - max), target logit - max or 0).
cudaError_t VocabSumExp(Elem t, const void* logits, Index it, const void* targets, int64_t rows,
                        int64_t vp, int64_t valid, int64_t vocab_start, const float* max,
                        float* sums, cudaStream_t stream);
// One read of each row: max = the valid columns' max and sums as
// VocabSumExp for that max, by an online softmax (per-thread running max and
// sum, rescaled when the max grows, combined over the block).
cudaError_t VocabMaxSumExp(Elem t, const void* logits, Index it, const void* targets,
                           int64_t rows, int64_t vp, int64_t valid, int64_t vocab_start,
                           float* max, float* sums, cudaStream_t stream);
// sums[0, r] *= exp(local_max - max) (double); sums[1, r] = target logit - max or 0.
cudaError_t VocabRescaleSums(Elem t, const void* logits, Index it, const void* targets,
                             int64_t rows, int64_t vp, int64_t valid, int64_t vocab_start,
                             const float* local_max, const float* max, float* sums,
                             cudaStream_t stream);
cudaError_t VocabCrossEntropyBackward(Elem t, const void* logits, Index it, const void* targets,
                                      int64_t rows, int64_t vp, int64_t valid,
                                      int64_t vocab_start, const float* max, const float* sum,
                                      float scale, void* dlogits, cudaStream_t stream);

// ---- embedding.cu. Ids outside [vocab_start, vocab_start + v): zero rows
// when zero_out_of_range, else NaN rows (forward) / ignored (backward).
cudaError_t EmbeddingForward(Elem t, Index it, const void* ids, const void* table, int64_t n,
                             int64_t v, int64_t c, int64_t vocab_start, bool zero_out_of_range,
                             void* out, cudaStream_t stream);
cudaError_t EmbeddingBackward(Elem t, Index it, const void* ids, const void* dout, int64_t n,
                              int64_t v, int64_t c, int64_t vocab_start, float* dtable,
                              cudaStream_t stream);

// ---- convert.cu: f32 <-> bf16, f32 <-> f16 (same rounding as core/cpu/convert.h).
cudaError_t Convert(Elem from, Elem to, const void* src, void* dst, int64_t n, cudaStream_t stream);

// ---- reduce.cu: *result = sum (or sum of squares) of x in double,
// deterministic; `partials` holds kReduceBlocks doubles.
inline constexpr int kReduceBlocks = 264;
// accumulate: *result += the sum (else *result = the sum).
cudaError_t ReduceToDouble(Elem t, const void* x, int64_t n, bool squares, double* partials,
                           double* result, cudaStream_t stream, bool accumulate = false);

// ---- adamw.cu
struct AdamWScalars {
  float beta1, beta2, eps, grad_scale, step_size, inv_sqrt_bc2, decay;
};
cudaError_t AdamW(float* param, const float* grad, float* m, float* v, void* param_bf16, int64_t n,
                  const AdamWScalars& s, cudaStream_t stream);

// ---- qkv_split.cu: attention's projection [rows, groups, n + 2, d] <-> the
// kernels' [rows, groups * n, 3, d] (core/cpu/qkv_split.h); row t is at
// position t / batch + offset; r: rotary dim (0: no rope). One block per row,
// no atomics: the backward's k/v sums are deterministic.
cudaError_t QkvSplitForward(Elem t, const void* proj, int64_t rows, int64_t batch, int64_t groups,
                            int64_t n, int64_t d, int64_t r, float base, int64_t offset, void* qkv,
                            cudaStream_t stream);
cudaError_t QkvSplitBackward(Elem t, const void* dqkv, int64_t rows, int64_t batch, int64_t groups,
                             int64_t n, int64_t d, int64_t r, float base, int64_t offset,
                             void* dproj, cudaStream_t stream);

// ---- moe.cu: the mixture-of-experts layer's per-token work
// (core/cpu/moe.h). Indices i32; logits, probabilities f32; statistics f64.
// Router top-k, one thread per token: expert/prob [t, K]; stats [2E + 1] =
// counts, softmax sums, lse² sum, reduced over tokens in a fixed order from
// `scratch` (f64 [T, 2E + 1]).
cudaError_t MoeRouteTopK(const float* logits, int64_t tokens, int64_t experts, int64_t topk,
                         int32_t* expert, float* prob, double* scratch, double* stats,
                         cudaStream_t stream);
// The dispatch layout, one block per expert; `scratch`: i32 [2 * T * K + E]
// (the experts' slot lists, their keep flags, the counts). row [T, K],
// row_token [n_rows] (writes past n_rows are dropped).
cudaError_t MoeRouteLayout(const int32_t* expert, const float* prob, int64_t tokens,
                           int64_t experts, int64_t topk, int64_t capacity, bool pad,
                           int32_t* scratch, int32_t* row, int32_t* row_token, int64_t n_rows,
                           cudaStream_t stream);
// dx [T, h] = per token the sum of its rows drows[row(t, k)] in ascending row order.
cudaError_t MoePermuteBackward(Elem t, const void* drows, const int32_t* row, int64_t tokens,
                               int64_t topk, int64_t h, void* dx, cudaStream_t stream);
// y [T, h] = Σ_k prob · rows[row(t, k)] in k order.
cudaError_t MoeCombineForward(Elem t, const void* rows, const float* prob, const int32_t* row,
                              int64_t tokens, int64_t topk, int64_t h, void* y,
                              cudaStream_t stream);
// drows [n_rows, h] (zeroed first), dprob [T, K] (double dot products).
cudaError_t MoeCombineBackward(Elem t, const void* dy, const void* rows, const float* prob,
                               const int32_t* row, int64_t tokens, int64_t topk, int64_t h,
                               int64_t n_rows, void* drows, float* dprob, cudaStream_t stream);
// dlogits [T, E]; aux_grad f64 [E] or null.
cudaError_t MoeRouterBackward(const float* logits, const int32_t* expert, const float* prob,
                              const float* dprob, const double* aux_grad, bool z_loss,
                              double z_scale, int64_t tokens, int64_t experts, int64_t topk,
                              float* dlogits, cudaStream_t stream);

}  // namespace loom::core::cuda::kernels

#endif  // LOOM_CORE_CUDA_KERNELS_H_
