#ifndef LOOM_MODELS_GPT_TEST_UTIL_H_
#define LOOM_MODELS_GPT_TEST_UTIL_H_

// The GPT family's test helpers, beside the family-independent ones
// (layers/test_util.h: ranks as threads, random inputs, comparisons).

#include <cstdint>
#include <string>

#include "layers/test_util.h"
#include "models/gpt/gpt_config.h"

namespace loom::layers::testing {

// An activation-recomputation setting (--recompute-granularity,
// --recompute-method, --recompute-num-layers); empty granularity: none.
struct Recompute {
  std::string granularity, method;
  int64_t n = 0;
  std::string Name() const;  // "none", "selective", "full_uniform2": a test-parameter name
  GptConfig Apply(GptConfig c) const;
};

}  // namespace loom::layers::testing

#endif  // LOOM_MODELS_GPT_TEST_UTIL_H_
