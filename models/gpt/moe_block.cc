#include "models/gpt/moe_block.h"

#include <utility>
#include <vector>

namespace loom::layers {

MoeOptions MoeOptionsOf(const GptConfig& c) {
  MoeOptions o;
  o.experts = c.num_experts;
  o.topk = c.moe_router_topk;
  o.swiglu = c.swiglu;
  o.aux_loss = c.moe_router_load_balancing_type == MoeLoadBalancing::kAuxLoss;
  o.aux_loss_coeff = c.moe_aux_loss_coeff;
  o.z_loss_coeff = c.moe_z_loss_coeff;
  o.capacity_factor = c.moe_expert_capacity_factor;
  o.pad_to_capacity = c.moe_pad_expert_input_to_capacity;
  o.grouped_gemm = c.moe_grouped_gemm;
  o.a2a_overlap_chunks = c.moe_a2a_overlap_chunks;
  return o;
}

MoeMlp MoeMlpForLayer(ParamBuffer* params, const GptConfig& c, int64_t layer, TpGroup tp,
                      EpGroup ep, CpGroup cp) {
  const BlockParamNames names(layer);
  std::vector<Param*> fc1, fc2;
  const int64_t first = ep.shard().first(c.num_experts);
  for (int64_t e = first; e < first + ep.shard().count(c.num_experts); ++e) {
    fc1.push_back(&params->at(names.expert_fc1_weight(e)));
    fc2.push_back(&params->at(names.expert_fc2_weight(e)));
  }
  return MoeMlp(&params->at(names.router_weight), std::move(fc1), std::move(fc2),
                MoeOptionsOf(c), tp, ep, cp);
}

}  // namespace loom::layers
