#include "core/ops/attention_plan.h"

#include <cstdio>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/ops/kernel_choice.h"
#include "core/ops/ops.h"
#include "core/status_macros.h"

namespace loom::core::ops {
namespace {

absl::Mutex g_mu(absl::kConstInit);

std::map<std::pair<int, std::string>, const AttentionVariant*>& Variants() {
  static auto* variants = new std::map<std::pair<int, std::string>, const AttentionVariant*>;
  return *variants;
}

const AttentionVariant* FindVariant(DeviceType type, const std::string& name) {
  absl::MutexLock lock(&g_mu);
  auto it = Variants().find({static_cast<int>(type), name});
  return it == Variants().end() ? nullptr : it->second;
}

// Says once per distinct message why a variant did not run.
void SayOnce(const std::string& message) {
  static auto* said = new std::set<std::string>;
  absl::MutexLock lock(&g_mu);
  if (said->insert(message).second) std::fprintf(stderr, "loom: %s\n", message.c_str());
}

AttentionPlan TablePlan(const std::string& name) {
  return {name, name == "sxs" ? AttentionSaved::kProbs : AttentionSaved::kLse};
}

}  // namespace

void RegisterAttentionVariant(DeviceType type, const AttentionVariant* variant) {
  absl::MutexLock lock(&g_mu);
  Variants()[{static_cast<int>(type), variant->name}] = variant;
}

absl::StatusOr<AttentionPlan> PlanAttention(const Tensor& qkv, int64_t heads,
                                            const AttentionDropout& dropout) {
  const DeviceType type = qkv.device().type;
  LOOM_ASSIGN_OR_RETURN(const KernelChoice choice, ChooseKernel("attention", type));
  if (choice.implementation == "sxs" || choice.implementation == "flash") {
    return TablePlan(choice.implementation);
  }
  const std::vector<std::string> names = KernelImplementations("attention", type);
  const std::string reference = names.empty() ? "sxs" : names.front();
  const AttentionVariant* variant = FindVariant(type, choice.implementation);
  if (variant == nullptr) {
    SayOnce(absl::StrCat("attention \"", choice.implementation, "\" is not linked into this "
                         "binary for ", qkv.device().ToString(), ": running \"", reference,
                         "\""));
    return TablePlan(reference);
  }
  const absl::Status supported = variant->supports(qkv, heads, dropout);
  if (!supported.ok()) {
    SayOnce(absl::StrCat("attention \"", variant->name, "\" cannot run this call (",
                         supported.message(), "): running \"", reference, "\""));
    return TablePlan(reference);
  }
  return AttentionPlan{variant->name, AttentionSaved::kLse};
}

absl::StatusOr<Tensor> EmptySaved(const AttentionPlan& plan, const Tensor& qkv, int64_t heads) {
  AttentionDims g;
  LOOM_RETURN_IF_ERROR(CheckQkv("EmptySaved", qkv, heads, &g));
  const DType dtype = plan.saved == AttentionSaved::kProbs ? qkv.dtype() : DType::kF32;
  return Tensor::Empty(SavedShape(plan.saved, g), dtype, qkv.device());
}

absl::Status PlannedAttentionForward(const AttentionPlan& plan, const Tensor& qkv, int64_t heads,
                                     Tensor* out, Tensor* saved, const AttentionDropout& dropout) {
  if (plan.implementation == "sxs") return AttentionForward(qkv, heads, out, saved, dropout);
  if (plan.implementation == "flash") return FlashAttentionForward(qkv, heads, out, saved, dropout);
  const AttentionVariant* variant = FindVariant(qkv.device().type, plan.implementation);
  if (variant == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "attention plan \"", plan.implementation, "\" is not registered for ",
        qkv.device().ToString()));
  }
  return variant->forward(qkv, heads, out, saved, dropout);
}

absl::Status PlannedAttentionBackward(const AttentionPlan& plan, const Tensor& dout,
                                      const Tensor& qkv, const Tensor& out, const Tensor& saved,
                                      int64_t heads, Tensor* dqkv,
                                      const AttentionDropout& dropout) {
  if (plan.implementation == "sxs") {
    return AttentionBackward(dout, qkv, saved, heads, dqkv, dropout);
  }
  if (plan.implementation == "flash") {
    return FlashAttentionBackward(dout, qkv, out, saved, heads, dqkv, dropout);
  }
  const AttentionVariant* variant = FindVariant(qkv.device().type, plan.implementation);
  if (variant == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "attention plan \"", plan.implementation, "\" is not registered for ",
        qkv.device().ToString()));
  }
  return variant->backward(dout, qkv, out, saved, heads, dqkv, dropout);
}

}  // namespace loom::core::ops
