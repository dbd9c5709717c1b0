#ifndef LOOM_CORE_CPU_FLASH_ATTENTION_H_
#define LOOM_CORE_CPU_FLASH_ATTENTION_H_

// Causal multi-head attention that never holds an s x s matrix: the scores
// are computed tile by tile with an online softmax (FlashAttention-2, Dao
// 2023), so a head needs O(s·d) memory instead of O(s²).
//
// Same contract as core/cpu/attention.h (the reference kernel, kept for tests
// and the bench): qkv f32[s, b, heads * 3 * d] ([s, b, heads, {q, k, v}, d]),
// out f32[s, b, heads * d], scores scaled by 1/sqrt(d), position i attends to
// j <= i, and EXACTLY the same attention dropout: element (i, j) of pair
// (b_i, h) is kept iff
//   DropoutBitsAt(seed, offset, ((b_i * total_heads + head_offset + h) * s + i) * s + j)
//       >= DropoutThreshold(p),
// kept probabilities scaled by 1 / (1 - p). Both kernels drop the same
// elements; their results differ only by f32 rounding (summation order).
//
// Instead of the probabilities the forward keeps the log-sum-exp of each
// score row, lse f32[b, heads, s] (lse[b, h, i] = log sum_{j <= i}
// exp(q_i·k_j / sqrt(d)), before dropout); the backward recomputes each tile
// of probabilities as exp(score - lse) and uses D_i = rowsum(dO_i ∘ O_i)
// (= sum_j P_ij dP'_ij, dropout included) for the softmax gradient.
//
// Threads: the forward runs OpenMP over (b, head, query tile); the backward
// over (b, head) (each pair accumulates its dK, dV and dQ in order). Every
// result depends only on its own pair's inputs, never on the thread count or
// on which other heads the call holds (a TP rank's slice is bitwise its part
// of the full run).

#include <cstdint>

#include "absl/status/status.h"
#include "core/cpu/attention.h"
#include "core/tensor.h"

namespace loom::core::cpu {

//   qkv:  f32[s, b, heads * 3 * d]
//   out:  f32[s, b, heads * d], written (after dropout)
//   lse:  f32[b, heads, s], written; keep it (and out) for the backward
//   dropout: as AttentionForward's; pass the same options to the backward
absl::Status FlashAttentionForward(const Tensor& qkv, int64_t heads, Tensor* out, Tensor* lse,
                                   const AttentionDropout& dropout = {});

//   dout: f32[s, b, heads * d]
//   qkv, out, lse: the forward's input and outputs
//   dqkv: f32[s, b, heads * 3 * d], written
absl::Status FlashAttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                    const Tensor& lse, int64_t heads, Tensor* dqkv,
                                    const AttentionDropout& dropout = {});

// ---- The block API ---------------------------------------------------------
//
// The kernels above are loops over these functions; a context-parallel ring
// attention calls them directly, one (Q chunk, K/V chunk) pair at a time.
// Positions are GLOBAL sequence positions: they decide the causal mask and
// the dropout index, so any split of Q and K/V into blocks (any order of
// K/V blocks, any owner) draws the same mask as the whole-sequence kernel.
//
// Forward of a Q chunk, with K/V chunks arriving one by one:
//   FlashRunningInit(q_len, d, &st);
//   for each K/V chunk: FlashForwardBlock(block, &st);
//   FlashRunningFinish(q_len, d, st, out, ld_out, lse);
// or, with partial results computed elsewhere (each its own Init/Block/
// Finish), combine (O_a, lse_a) and (O_b, lse_b) with FlashMergePartial —
// the log-sum-exp merge is exact up to rounding and order-independent.
// Backward of the same chunk pair, after the forward is complete (lse and O
// are the FINAL, merged ones):
//   FlashDelta(...) once per Q chunk; FlashBackwardBlock(...) per K/V chunk,
//   which ACCUMULATES into dQ, dK, dV (zero them first).
// All block functions are single-threaded (call them from many threads on
// disjoint outputs) and allocate only small per-thread tiles.

// One (Q block, K/V block) pair of one (batch, head).
struct FlashBlock {
  int64_t d = 0;  // head dim
  // Q rows at global positions [q_start, q_start + q_len): row r at q + r * ld_q.
  const float* q = nullptr;
  int64_t ld_q = 0;
  int64_t q_start = 0, q_len = 0;
  // K and V rows at global positions [k_start, k_start + k_len): row r at
  // k + r * ld_kv and v + r * ld_kv.
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t ld_kv = 0;
  int64_t k_start = 0, k_len = 0;
  // The global sequence length s (the dropout index's row length).
  int64_t seq_len = 0;
  // The pair's global index b_i * total_heads + head_offset + h (the dropout
  // index's pair); dropout's head_offset and total_heads are not read.
  int64_t global_pair = 0;
  AttentionDropout dropout;  // p, seed, offset
  bool causal = true;        // query i sees key j iff j <= i (global positions)
  // Packed documents: query row r sees only keys j >= q_doc_start[r] (the
  // global position of its document's first token; null: no limit). Key
  // tiles before every query's document are skipped, not masked.
  const int32_t* q_doc_start = nullptr;
};

// The running softmax state of a Q block.
struct FlashRunning {
  float* acc = nullptr;  // [q_len, d] row stride ld_acc: sum_j keep_ij exp(s_ij - m_i) v_j
  int64_t ld_acc = 0;
  float* m = nullptr;  // [q_len]: max score seen (-inf: none yet)
  float* l = nullptr;  // [q_len]: sum_j exp(s_ij - m_i), before dropout
};

// acc = 0, m = -inf, l = 0.
void FlashRunningInit(int64_t q_len, int64_t d, FlashRunning* st);

// Adds K/V block `b` to the running state of its Q block (st sized b.q_len).
absl::Status FlashForwardBlock(const FlashBlock& b, FlashRunning* st);

// out (row stride ld_out) = acc / l and lse = m + log(l); a row that saw no
// key (all masked) gets out = 0 and lse = -inf.
void FlashRunningFinish(int64_t q_len, int64_t d, const FlashRunning& st, float* out,
                        int64_t ld_out, float* lse);

// (o, lse) <- the merge of partials (o, lse) and (o_b, lse_b) of the same Q
// rows over disjoint key sets: lse' = log(e^lse + e^lse_b),
// o' = o e^(lse - lse') + o_b e^(lse_b - lse'). -inf (no keys) is neutral.
void FlashMergePartial(int64_t q_len, int64_t d, const float* o_b, int64_t ld_b,
                       const float* lse_b, float* o, int64_t ld_o, float* lse);

// delta[r] = sum_e dout[r, e] * out[r, e] (the final O of the Q block).
void FlashDelta(int64_t q_len, int64_t d, const float* dout, int64_t ld_dout, const float* out,
                int64_t ld_out, float* delta);

// Gradients of one (Q block, K/V block) pair, ACCUMULATED:
//   dq [q_len, d] (row stride ld_dq) += the block's part of dQ;
//   dk, dv [k_len, d] (row stride ld_dkv) += its part of dK, dV.
// dout [q_len, d] (row stride ld_dout); lse, delta [q_len]: the final ones.
struct FlashGrads {
  float* dq = nullptr;
  int64_t ld_dq = 0;
  float* dk = nullptr;
  float* dv = nullptr;
  int64_t ld_dkv = 0;
};
absl::Status FlashBackwardBlock(const FlashBlock& b, const float* dout, int64_t ld_dout,
                                const float* lse, const float* delta, const FlashGrads& g);

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_FLASH_ATTENTION_H_
