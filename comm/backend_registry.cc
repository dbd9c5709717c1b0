#include "comm/backend_registry.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"

namespace loom::comm {
namespace {

// Filled by static registrars before main; read afterwards. Entries are never
// removed, so the pointers handed out stay valid.
struct Registry {
  absl::Mutex mu;
  std::map<std::string, std::unique_ptr<BackendInfo>> infos ABSL_GUARDED_BY(mu);
  std::map<std::string, std::unique_ptr<BackendFactory>> factories ABSL_GUARDED_BY(mu);
};

Registry& Get() {
  static Registry* registry = new Registry;  // never destroyed: read until exit
  return *registry;
}

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "backend registry: %s\n", why.c_str());
  std::abort();
}

std::string NotBuiltNote() {
  std::vector<std::string> missing;
  for (const std::string& name : KnownBackends()) {
    if (FindFactory(name) == nullptr) missing.push_back(name);
  }
  if (missing.empty()) return "";
  return absl::StrCat(" (not built here, its library is missing: ", absl::StrJoin(missing, ", "),
                      "; see @loom_deps//:MISSING.txt)");
}

}  // namespace

BackendRegistrar::BackendRegistrar(BackendInfo info) {
  Registry& r = Get();
  absl::MutexLock l(&r.mu);
  const std::string name = info.name;
  if (name.empty() || !r.infos.emplace(name, std::make_unique<BackendInfo>(std::move(info))).second) {
    Die(absl::StrCat("backend '", name, "' registered twice (or without a name)"));
  }
}

FactoryRegistrar::FactoryRegistrar(const std::string& name, BackendFactory factory) {
  Registry& r = Get();
  absl::MutexLock l(&r.mu);
  // Info and factory registrars run in any order (static initialization across
  // files): a factory without info is caught at its first lookup instead.
  if (!r.factories.emplace(name, std::make_unique<BackendFactory>(std::move(factory))).second) {
    Die(absl::StrCat("backend '", name, "': factory registered twice"));
  }
}

const BackendInfo* FindBackend(const std::string& name) {
  Registry& r = Get();
  absl::MutexLock l(&r.mu);
  auto it = r.infos.find(name);
  return it == r.infos.end() ? nullptr : it->second.get();
}

const BackendFactory* FindFactory(const std::string& name) {
  Registry& r = Get();
  absl::MutexLock l(&r.mu);
  auto it = r.factories.find(name);
  if (it == r.factories.end()) return nullptr;
  if (r.infos.count(name) == 0) {
    Die(absl::StrCat("backend '", name, "' has a factory but no info: link its :info target"));
  }
  return it->second.get();
}

std::vector<std::string> KnownBackends() {
  Registry& r = Get();
  absl::MutexLock l(&r.mu);
  std::vector<std::string> out;
  for (const auto& [name, info] : r.infos) out.push_back(name);
  return out;  // std::map: sorted
}

std::vector<std::string> BuiltBackends() {
  std::vector<std::string> out;
  for (const std::string& name : KnownBackends()) {
    if (FindFactory(name) != nullptr) out.push_back(name);
  }
  return out;
}

std::vector<std::string> BackendsOn(BackendDevice device) {
  std::vector<std::string> out;
  for (const std::string& name : KnownBackends()) {
    if (FindBackend(name)->device == device) out.push_back(name);
  }
  return out;
}

absl::StatusOr<const BackendInfo*> LookupBackend(const std::string& name,
                                                 const std::string& flag) {
  if (const BackendInfo* info = FindBackend(name)) return info;
  return absl::InvalidArgumentError(absl::StrCat(flag, "='", name, "' is not one of the built backends: ",
                                                 absl::StrJoin(BuiltBackends(), ", "),
                                                 NotBuiltNote()));
}

absl::StatusOr<const BackendInfo*> LookupBuiltBackend(const std::string& name,
                                                      const std::string& flag) {
  absl::StatusOr<const BackendInfo*> info = LookupBackend(name, flag);
  if (!info.ok() || FindFactory(name) != nullptr) return info;
  return absl::UnimplementedError(absl::StrCat(
      flag, "=", name, " was not built (its library is missing; see "
      "@loom_deps//:MISSING.txt); built backends: ", absl::StrJoin(BuiltBackends(), ", ")));
}

}  // namespace loom::comm
