#ifndef LOOM_PLAN_HARDWARE_H_
#define LOOM_PLAN_HARDWARE_H_

// The hardware description (plan/hardware.proto): reading it and the
// primitive costs every model above it uses.
//
//   gemm time        t = flops / (peak · eff(flops))   (eff: the file's curve)
//   memory-bound     t = bytes / memory_bandwidth   (element-wise kernels and the
//                        optimizer at their own measured rates where the file has them)
//   attention        t = flops / (peak · attention_curve(flops))
//                        (no curve: peak · eff(flops) · attention_efficiency)
//   all-reduce       t = latency + 2(n−1)/n · bytes / busbw
//   all-gather, reduce-scatter, all-to-all
//                    t = latency + (n−1)/n · bytes / busbw   (bytes: the whole gathered tensor)
//   send/recv        t = latency + bytes / busbw
// plus, where the link has a step_latency, one per ring step: 2(n−1) steps for
// all-reduce, n−1 for the others (NCCL's ring model); over the inter-node link
// the steps between ranks of one node (ranks_per_node − 1 of every node's)
// take the intra-node link's step_latency; and with k = ranks_per_node > 1 the
// inter-node bus bandwidth is k × the link's (k rings, each through its own
// rank's NIC), at most the intra-node link's.
// `bytes` is always the full buffer one rank holds (all-reduce) or the
// gathered/scattered whole (all-gather, reduce-scatter, all-to-all).

#include <string>

#include "absl/status/statusor.h"
#include "plan/hardware.pb.h"

namespace loom::plan {

// Parses text-format Hardware; errors name `what` (the file) and the field.
absl::StatusOr<Hardware> ParseHardware(const std::string& text, const std::string& what);
absl::StatusOr<Hardware> LoadHardware(const std::string& path);

enum class CollectiveKind { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kSendRecv };

// Efficiency of one GEMM of `flops` FLOPs (1 when the curve is empty).
double GemmEfficiency(const Hardware& hw, double flops);

// Seconds for a GEMM of m×n×k on one rank; `ranks_on_node` divides the peak
// when ranks_share_compute.
double GemmSeconds(const Hardware& hw, double m, double n, double k, int ranks_on_node = 1);

// Seconds to move `bytes` through memory once (read or write).
double MemorySeconds(const Hardware& hw, double bytes, int ranks_on_node = 1);

// The same at the element-wise kernels' rate (elementwise_bandwidth; 0:
// memory_bandwidth), and at the optimizer's (optimizer_bandwidth).
double ElementwiseSeconds(const Hardware& hw, double bytes, int ranks_on_node = 1);
double OptimizerSeconds(const Hardware& hw, double bytes, int ranks_on_node = 1);

// Seconds of causal attention of `flops` (QKᵀ and PV over the visible half):
// the attention_curve's efficiency when the file has one, else
// attention_efficiency (0: 1) × the GEMM curve's.
double AttentionSeconds(const Hardware& hw, double flops, int ranks_on_node = 1);
// Attention's backward over its forward (attention_backward_ratio; 0: 2.5).
double AttentionBackwardRatio(const Hardware& hw);

// Seconds of one collective over `group` ranks; inter_node picks the link;
// ranks_per_node: how many of the group share a node (inter-node only).
double CollectiveSeconds(const Hardware& hw, CollectiveKind kind, double bytes, int group,
                         bool inter_node, int ranks_per_node = 1);

}  // namespace loom::plan

#endif  // LOOM_PLAN_HARDWARE_H_
