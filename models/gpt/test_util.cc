#include "models/gpt/test_util.h"

#include "absl/strings/str_cat.h"
#include "core/enum_names.h"

namespace loom::layers::testing {

std::string Recompute::Name() const {
  if (granularity.empty()) return "none";
  if (method.empty()) return granularity;
  return absl::StrCat(granularity, "_", method, n);
}

GptConfig Recompute::Apply(GptConfig c) const {
  c.recompute_granularity = core::FindEnum<RecomputeGranularity>(granularity).value();
  c.recompute_method = core::FindEnum<RecomputeMethod>(method).value();
  c.recompute_num_layers = n;
  return c;
}

}  // namespace loom::layers::testing
