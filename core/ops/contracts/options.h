#ifndef LOOM_CORE_OPS_CONTRACTS_OPTIONS_H_
#define LOOM_CORE_OPS_CONTRACTS_OPTIONS_H_

// The option structs of the kernels' contracts (op_list.h), and the checks
// every device's implementation runs on them, so a bad option gets the same
// error on every device. Each failure is an InvalidArgument naming the op and
// the offending values.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace loom::core::ops {

// ---- matmul
struct MatmulOptions {
  bool trans_a = false;  // use Aᵀ
  bool trans_b = false;  // use Bᵀ
  float alpha = 1.0f;
  float beta = 0.0f;  // 0: C is overwritten (its old contents may be NaN); 1: accumulate
  // CPU: multiply in bf16 even when both operands are f32 (they are rounded
  // to bf16 in a per-thread scratch; products summed in f32). Implied when an
  // operand is bf16. Ignored by the CUDA kernels (they follow the dtypes).
  bool bf16 = false;
};

// ---- linear: a linear layer's GEMMs with their epilogues (op_list.h's
// LinearForward, LinearBackwardData, LinearBackwardWeight)
struct LinearOptions {
  // Forward: y = gelu(x·wᵀ + bias) keeping pre = x·wᵀ + bias (the GELU MLP's
  // up-projection). BackwardData: dx = gelu'(pre) ⊙ (dy·w). GELU is the tanh
  // approximation (GeluForward), what cuBLASLt's GELU epilogues compute.
  bool gelu = false;
  // As MatmulOptions::bf16 (the CPU's bf16 GEMM mode; CUDA follows the dtypes).
  bool bf16 = false;
};

// ---- attention
struct AttentionDropout {
  float p = 0.0f;  // drop probability in [0, 1]; 0 disables dropout
  uint64_t seed = 0;
  uint64_t offset = 0;        // stream id, as DropoutOptions::offset
  int64_t head_offset = 0;    // global index of this call's first head
  int64_t total_heads = 0;    // global head count; 0 means `heads`
  // Packed documents (--reset-attention-mask): query i of batch row bi sees
  // key j iff doc_start[bi * seq_len + i] <= j <= i, where doc_start (host
  // i32 [b, seq_len], GLOBAL positions, seq_len the whole sequence) holds the
  // first position of i's document. Null: plain causal. Every kernel takes
  // it: the CPU's s x s and flash kernels and ring blocks, the CUDA s x s
  // and flash kernels; cuDNN's variant refuses it (the plan falls back to
  // the reference), as do the CUDA ring blocks.
  const int32_t* doc_start = nullptr;
  // The same table on the tensors' device, for a device's kernels (layers
  // copy it there once per micro-batch: PackedDocuments::DeviceDocStart).
  // Null with doc_start set: a device kernel copies doc_start itself, per call.
  const int32_t* device_doc_start = nullptr;
};

// One block of the context-parallel ring's flash attention (FlashBlock* ops,
// core/cpu/flash_block.h): Q rows [q_row, q_row + q_len) of qkv (and of dout,
// the running state, lse, delta and dqkv) at GLOBAL positions from q_start,
// against K/V rows [k_row, k_row + k_len) of kv (and dkv) from k_start. The
// positions decide the causal mask and the dropout index, as in the
// whole-sequence kernel over seq_len positions.
struct FlashBlockOptions {
  int64_t heads = 1;  // this call's (TP-local) heads
  int64_t q_row = 0, q_len = 0, q_start = 0;
  int64_t k_row = 0, k_len = 0, k_start = 0;
  int64_t seq_len = 0;       // the global sequence length
  bool causal = true;        // query i sees key j iff j <= i (global positions)
  AttentionDropout dropout;  // head_offset and total_heads as the whole kernel's
};

// ---- dropout
struct DropoutOptions {
  float p = 0.1f;  // probability of dropping; kept elements are scaled by 1/(1-p)
  uint64_t seed = 0;
  uint64_t offset = 0;  // stream id (e.g. layer and step), see DropoutBitsAt
};

// Where the local tensor sits in the global one. The local tensor is viewed
// as rows of its last dim C; local element (r, c) is global element
//   first_index + r * row_stride + c.
// The whole tensor: {0, C}. Rows [r0, r1) of a [R, C] tensor (sequence
// parallel): {r0 * C, C}. Columns [c0, c0 + C) of a [R, H] tensor (tensor
// parallel): {c0, H}. row_stride = 0 means C (a contiguous slice).
struct GlobalIndex {
  int64_t first_index = 0;
  int64_t row_stride = 0;
};

// ---- cross_entropy
struct CrossEntropyOptions {
  // Tokens whose target equals ignore_index give zero loss and gradient and
  // are not counted in the mean (padding).
  int64_t ignore_index = -100;
};

// ---- embedding
struct EmbeddingOptions {
  // The table holds rows [vocab_start, vocab_start + V) of the full vocabulary
  // (a vocab-parallel shard); ids are global.
  int64_t vocab_start = 0;
  // true: ids outside this shard give zero rows (forward) and no gradient
  // (backward) — VocabParallelEmbedding. false: such an id is an error.
  bool zero_out_of_range = false;
};

// ---- rope
struct RopeOptions {
  float base = 10000.0f;
  int64_t rotary_dim = 0;       // 0: head_dim; must be even and <= head_dim
  int64_t position_offset = 0;  // position of row s is s + position_offset
};

// ---- qkv_split
// Attention's fused QKV projection [S, B, groups * (n + 2) * d], rows ordered
// [group, {q x n, k, v}, d] with n = heads / groups (models/gpt/gpt_config.h),
// rearranged into the attention kernels' [S, B, heads, {q, k, v}, d] (each
// query head gets its group's k and v), q and k rotated when `rope`.
struct QkvSplitOptions {
  int64_t heads = 1;   // query heads of this call (TP-local)
  int64_t groups = 0;  // K/V heads of this call; 0: one per query head
  bool rope = false;   // rotate q and k (rope_options; row s is at s + position_offset)
  RopeOptions rope_options;
};

// ---- residual_norm
// The transformer block's residual path fused with the norm that follows it
// (op_list.h's ResidualNormForward / ResidualNormBackward):
//   resid = x + dropout(branch), out = Norm(resid)
// where dropout's mask is drawn at the branch's GLOBAL indices, as
// DropoutForward's at `where` (every TP/SP/CP layout draws the same mask).
struct ResidualNormOptions {
  bool rms = false;  // RMSNorm (gamma only); false: LayerNorm (gamma, beta, keeps mean)
  float eps = 1e-5f;
  // p = 0: no dropout (the branch is added as it is, as when not training).
  DropoutOptions dropout = {0.0f, 0, 0};
  GlobalIndex where;
};

// ---- vocab_parallel_ce
struct VocabShard {
  int64_t vocab_start = 0;  // global id of local column 0
  int64_t valid = 0;        // real columns among the local Vp
  int64_t vocab_size = 0;   // global vocabulary; targets outside it are an error
};

// ---- adamw
struct AdamWOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled: p -= lr * weight_decay * p
  float grad_scale = 1.0f;    // grads are multiplied by this first (clipping, 1/loss_scale)
};

// ---- moe: the mixture-of-experts router and token permutation (layers/moe.h)
// Top-k of `experts` per token and the dispatch layout: each expert's kept
// assignments in token order, experts one after the other.
struct MoeRouteOptions {
  int64_t experts = 0;
  int64_t topk = 1;
  int64_t capacity = 0;          // assignments an expert keeps (its most probable); 0: all
  bool pad_to_capacity = false;  // with a capacity, every expert gets `capacity` rows
};
// The router's backward beyond the combine weights' gradient: the
// load-balancing loss's (aux_grad, f64 [E], when aux_loss) and the z-loss's
// (z_scale · lse_t / T · softmax(logits_t), z_scale = loss weight · coeff · 2).
struct MoeRouterBackwardOptions {
  bool aux_loss = false;
  bool z_loss = false;
  double z_scale = 0;
};

// ---- checks

// p in [0, 1] and this call's heads inside the global ones; every device's
// attention checks its options with this.
absl::Status CheckAttentionDropout(const char* op, const AttentionDropout& dropout,
                                   int64_t heads);

// Dropout's arguments: p in [0, 1], x of rank >= 1, first_index >= 0 and
// row_stride 0 or at least x's last dim.
absl::Status CheckDropoutArgs(const char* op, const Tensor& x, const DropoutOptions& opts,
                              const GlobalIndex& where);

// The shape arithmetic shared by every device's GEMM: M, N, K of
// C = op(A)·op(B) from the last two dims (InvalidArgument naming both
// operands when inner dims or C disagree), and the batch count of a
// BatchedMatmul (all of rank 3 or all of rank 4, equal leading dims).
struct GemmDims {
  int64_t m, n, k;
};
absl::Status GemmMatrixDims(const char* op, const Tensor& a, const Tensor& b, const Tensor& c,
                            const MatmulOptions& opts, GemmDims* dims);
absl::StatusOr<int64_t> GemmBatchCount(const char* op, const Tensor& a, const Tensor& b,
                                       const Tensor& c);

}  // namespace loom::core::ops

#endif  // LOOM_CORE_OPS_CONTRACTS_OPTIONS_H_
