#include "core/ops/kernel_choice.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "core/ops/kernel_manifest.pb.h"
#include "core/status_macros.h"
#include "google/protobuf/text_format.h"

extern const char kLoomKernelManifest[];  // kernel_manifest_embed.cc (generated)

namespace loom::core::ops {
namespace {

constexpr const char* kManifestPath = "core/ops/kernel_manifest.textproto";

const char* DeviceName(DeviceType device) { return device == DeviceType::kCPU ? "cpu" : "cuda"; }

const KernelManifest& Manifest() {
  static const KernelManifest* manifest = [] {
    auto* m = new KernelManifest;
    // The file is checked by kernel_manifest_test: a parse failure here is a
    // build that skipped its tests; run the references rather than guess.
    if (!google::protobuf::TextFormat::ParseFromString(kLoomKernelManifest, m)) {
      std::fprintf(stderr, "loom: %s does not parse; every op runs its reference kernel\n",
                   kManifestPath);
      m->Clear();
    }
    return m;
  }();
  return *manifest;
}

const OpChoice* Find(absl::string_view op, DeviceType device) {
  for (const OpChoice& c : Manifest().choice()) {
    if (c.op() == op && c.device() == DeviceName(device)) return &c;
  }
  return nullptr;
}

bool Lists(const OpChoice& c, absl::string_view name) {
  for (const Implementation& i : c.implementation()) {
    if (i.name() == name) return true;
  }
  return false;
}

bool EnvOn(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

// LOOM_KERNEL_IMPL parsed: op -> implementation.
absl::StatusOr<std::map<std::string, std::string>> Forced() {
  std::map<std::string, std::string> forced;
  const char* v = std::getenv("LOOM_KERNEL_IMPL");
  if (v == nullptr || v[0] == '\0') return forced;
  for (absl::string_view item : absl::StrSplit(v, ',', absl::SkipWhitespace())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (kv.first.empty() || kv.second.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("LOOM_KERNEL_IMPL=", v, ": expected op=implementation[,op=implementation] "
                       "(e.g. attention=cudnn), got \"", item, "\""));
    }
    forced[kv.first] = kv.second;
  }
  return forced;
}

absl::Mutex g_decided_mu(absl::kConstInit);

std::map<std::pair<std::string, int>, absl::StatusOr<KernelChoice>>* Decided() {
  static auto* decided = new std::map<std::pair<std::string, int>, absl::StatusOr<KernelChoice>>;
  return decided;
}

absl::StatusOr<KernelChoice> Decide(absl::string_view op, DeviceType device) {
  const OpChoice* c = Find(op, device);
  if (c == nullptr) {
    return absl::NotFoundError(absl::StrCat(kManifestPath, " has no choice for op \"", op,
                                            "\" on ", DeviceName(device)));
  }
  // A name no device lists is an error; one listed for another device
  // (attention=cudnn seen by the CPU) does not apply here.
  LOOM_RETURN_IF_ERROR(CheckKernelOverrides());
  if (EnvOn("LOOM_REFERENCE_KERNELS")) {
    return KernelChoice{c->reference(), "reference (LOOM_REFERENCE_KERNELS is set)"};
  }
  LOOM_ASSIGN_OR_RETURN(const auto forced, Forced());
  auto it = forced.find(std::string(op));
  if (it != forced.end() && Lists(*c, it->second)) {
    return KernelChoice{it->second, "forced by LOOM_KERNEL_IMPL (an A/B run; proven only if the "
                                    "manifest says so)"};
  }
  if (!c->proven_default().empty()) {
    for (const Implementation& i : c->implementation()) {
      if (i.name() != c->proven_default()) continue;
      // "card, commit date" on a device; the CPU's proof is its test suite.
      std::vector<std::string> parts;
      for (const std::string& s : {i.proof().card(), i.proof().commit().substr(0, 12),
                                   i.proof().date()}) {
        if (!s.empty()) parts.push_back(s);
      }
      if (i.proof().commit().empty()) parts.push_back(i.proof().correctness());
      return KernelChoice{i.name(),
                          absl::StrCat("proven default (", absl::StrJoin(parts, ", "), ")")};
    }
  }
  return KernelChoice{c->reference(),
                      absl::StrCat("reference: no device run has proven another implementation "
                                   "on ", DeviceName(device), " (", kManifestPath, ")")};
}

}  // namespace

absl::string_view KernelManifestText() { return kLoomKernelManifest; }

absl::StatusOr<KernelChoice> ChooseKernel(absl::string_view op, DeviceType device) {
  absl::MutexLock lock(&g_decided_mu);
  auto* decided = Decided();
  const std::pair<std::string, int> key{std::string(op), static_cast<int>(device)};
  auto it = decided->find(key);
  if (it == decided->end()) {
    it = decided->emplace(key, Decide(op, device)).first;
    if (it->second.ok()) {
      std::fprintf(stderr, "loom: %s on %s runs \"%s\": %s\n", std::string(op).c_str(),
                   DeviceName(device), it->second->implementation.c_str(),
                   it->second->reason.c_str());
    }
  }
  return it->second;
}

void ForgetKernelChoicesForTesting() {
  absl::MutexLock lock(&g_decided_mu);
  Decided()->clear();
}

std::vector<std::string> KernelImplementations(absl::string_view op, DeviceType device) {
  std::vector<std::string> names;
  const OpChoice* c = Find(op, device);
  if (c == nullptr) return names;
  names.push_back(c->reference());
  for (const Implementation& i : c->implementation()) {
    if (i.name() != c->reference()) names.push_back(i.name());
  }
  return names;
}

absl::Status CheckKernelOverrides() {
  absl::StatusOr<std::map<std::string, std::string>> forced = Forced();
  if (!forced.ok()) return forced.status();
  for (const auto& [op, impl] : *forced) {
    bool listed_somewhere = false;
    for (const OpChoice& c : Manifest().choice()) {
      if (c.op() == op && Lists(c, impl)) listed_somewhere = true;
    }
    if (!listed_somewhere) {
      std::vector<std::string> known;
      for (const OpChoice& c : Manifest().choice()) {
        for (const Implementation& i : c.implementation()) {
          known.push_back(absl::StrCat(c.op(), "=", i.name(), " (", c.device(), ")"));
        }
      }
      return absl::InvalidArgumentError(
          absl::StrCat("LOOM_KERNEL_IMPL=", std::getenv("LOOM_KERNEL_IMPL"), ": no device has \"",
                       op, "=", impl, "\"; ", kManifestPath, " lists ",
                       absl::StrJoin(known, ", ")));
    }
  }
  return absl::OkStatus();
}

}  // namespace loom::core::ops
