#ifndef LOOM_MODELS_GPT_MOE_BLOCK_H_
#define LOOM_MODELS_GPT_MOE_BLOCK_H_

// The GPT family's MoE MLP: layers/moe.h's family-independent layer, with its
// options and parameters taken from a GptConfig and a block's parameter names.

#include <cstdint>

#include "layers/context_parallel.h"
#include "layers/moe.h"
#include "layers/params.h"
#include "layers/tp_group.h"
#include "models/gpt/gpt_config.h"

namespace loom::layers {

// The --moe-* settings of `config`.
MoeOptions MoeOptionsOf(const GptConfig& config);

// The MoE MLP of block `layer` over `params` (BlockParamSpecs' names: the
// router and this EP rank's experts, ep.shard() of c.num_experts).
MoeMlp MoeMlpForLayer(ParamBuffer* params, const GptConfig& c, int64_t layer, TpGroup tp,
                      EpGroup ep, CpGroup cp = {});

}  // namespace loom::layers

#endif  // LOOM_MODELS_GPT_MOE_BLOCK_H_
