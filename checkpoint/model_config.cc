#include "checkpoint/model_config.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace loom::checkpoint {
namespace {

using google::protobuf::FieldDescriptor;
using layers::ArchitectureField;
using layers::FieldValue;

// ModelConfig's field for an architecture field; a missing one or one of
// another type is a build mistake that //checkpoint:model_config_test names.
const FieldDescriptor* ProtoField(const ArchitectureField& f) {
  const FieldDescriptor* d =
      ModelConfig::descriptor()->FindFieldByName(std::string(f.flag.data(), f.flag.size()));
  if (d == nullptr) {
    std::fprintf(stderr, "checkpoint.proto's ModelConfig has no field %s\n", std::string(f.flag.data(), f.flag.size()).c_str());
    std::abort();
  }
  return d;
}

void Store(const FieldValue& v, const FieldDescriptor* d, ModelConfig* m) {
  const auto* r = m->GetReflection();
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, int64_t>) r->SetInt64(m, d, x);
        if constexpr (std::is_same_v<T, float>) r->SetFloat(m, d, x);
        if constexpr (std::is_same_v<T, bool>) r->SetBool(m, d, x);
        if constexpr (std::is_same_v<T, std::string>) r->SetString(m, d, x);
      },
      v);
}

// The stored value in `like`'s type (its zero when absent).
FieldValue Load(const ModelConfig& m, const FieldDescriptor* d, const FieldValue& like) {
  const auto* r = m.GetReflection();
  return std::visit(
      [&](const auto& x) -> FieldValue {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, int64_t>) return r->GetInt64(m, d);
        if constexpr (std::is_same_v<T, float>) return r->GetFloat(m, d);
        if constexpr (std::is_same_v<T, bool>) return r->GetBool(m, d);
        if constexpr (std::is_same_v<T, std::string>) return r->GetString(m, d);
      },
      like);
}

}  // namespace

ModelConfig ModelConfigProto(const layers::GptConfig& c) {
  ModelConfig m;
  for (const ArchitectureField& f : layers::ArchitectureFields()) {
    if (f.applies(c)) Store(f.defining(c), ProtoField(f), &m);
  }
  m.set_vocab_size(c.vocab_size);
  m.set_init_method_std(c.init_method_std);
  m.set_seed(c.seed);
  // A training setting, recorded for export (Mixtral's router_aux_loss_coef).
  if (c.moe()) {
    m.set_moe_aux_loss_coeff(c.moe_router_load_balancing_type == layers::MoeLoadBalancing::kAuxLoss ? c.moe_aux_loss_coeff
                                                                            : 0.0f);
  }
  return m;
}

absl::StatusOr<layers::GptConfig> GptConfigFromProto(const ModelConfig& m,
                                                     const std::string& manifest) {
  layers::GptConfig c;
  for (const ArchitectureField& f : layers::ArchitectureFields()) {
    const FieldValue v = Load(m, ProtoField(f), f.get(c));
    if (v == layers::ZeroLike(v)) continue;  // absent: the default
    if (absl::Status s = f.set(c, v); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(manifest, ": model field ", s.message()));
    }
  }
  c.vocab_size = m.vocab_size();
  c.init_method_std = m.init_method_std();
  c.seed = m.seed();
  if (m.has_moe_aux_loss_coeff()) c.moe_aux_loss_coeff = m.moe_aux_loss_coeff();
  return c;
}

absl::Status CheckModelConfig(const ModelConfig& saved, const layers::GptConfig& flags,
                              const std::string& path) {
  auto mismatch = [&](const std::string& flag, const std::string& s, const std::string& f) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model config mismatch: ", flag, " is ", s, " in checkpoint ", path, " but ", f,
        " from the flags (resume with the flags the checkpoint was saved with, see ", path,
        "/manifest.txt)"));
  };
  LOOM_ASSIGN_OR_RETURN(const layers::GptConfig s,
                        GptConfigFromProto(saved, absl::StrCat(path, "/manifest.pb")));
  for (const ArchitectureField& f : layers::ArchitectureFields()) {
    if (!f.compared) continue;
    const FieldValue a = layers::ComparedValue(f, s), b = layers::ComparedValue(f, flags);
    if (a != b) {
      return mismatch(f.dashed(), layers::FieldValueString(a), layers::FieldValueString(b));
    }
  }
  if (s.vocab_size != flags.vocab_size) {
    return mismatch("vocabulary size (--tokenizer-type / --vocab-file)",
                    absl::StrCat(s.vocab_size), absl::StrCat(flags.vocab_size));
  }
  return absl::OkStatus();
}

}  // namespace loom::checkpoint
