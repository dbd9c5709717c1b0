#include "core/ops/kernel_manifest_check.h"

#include <openssl/evp.h>

#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace loom::core::ops {
namespace {

constexpr const char* kManifest = "core/ops/kernel_manifest.textproto";

const Implementation* Listed(const OpChoice& c, const std::string& name) {
  for (const Implementation& i : c.implementation()) {
    if (i.name() == name) return &i;
  }
  return nullptr;
}

std::string Where(const OpChoice& c) {
  return absl::StrCat(kManifest, ": ", c.op(), " on ", c.device());
}

}  // namespace

absl::StatusOr<std::string> SourcesSha256(const Implementation& impl, const std::string& root) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (ctx == nullptr || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    return absl::InternalError("SHA-256: OpenSSL could not start a digest");
  }
  for (const std::string& path : impl.sources()) {
    std::ifstream in(root + "/" + path, std::ios::binary);
    if (!in) {
      return absl::NotFoundError(absl::StrCat("implementation \"", impl.name(), "\" lists ",
                                              path, ", which does not exist"));
    }
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const char nul = '\0';
    EVP_DigestUpdate(ctx.get(), path.data(), path.size());
    EVP_DigestUpdate(ctx.get(), &nul, 1);
    EVP_DigestUpdate(ctx.get(), bytes.data(), bytes.size());
    EVP_DigestUpdate(ctx.get(), &nul, 1);
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &len);
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) absl::StrAppendFormat(&hex, "%02x", digest[i]);
  return hex;
}

absl::Status CheckManifest(const KernelManifest& manifest, const std::string& root) {
  std::set<std::pair<std::string, std::string>> seen;
  for (const OpChoice& c : manifest.choice()) {
    if (c.op().empty() || (c.device() != "cpu" && c.device() != "cuda")) {
      return absl::InvalidArgumentError(absl::StrCat(
          kManifest, ": a choice needs an op and a device \"cpu\" or \"cuda\" (got op \"", c.op(),
          "\", device \"", c.device(), "\")"));
    }
    if (!seen.insert({c.op(), c.device()}).second) {
      return absl::InvalidArgumentError(absl::StrCat(Where(c), " appears twice"));
    }
    if (Listed(c, c.reference()) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(Where(c), ": the reference \"",
                                                     c.reference(), "\" is not listed"));
    }
    for (const Implementation& i : c.implementation()) {
      absl::StatusOr<std::string> sha = SourcesSha256(i, root);
      if (!sha.ok()) return absl::NotFoundError(absl::StrCat(Where(c), ": ", sha.status().message()));
    }
    if (c.proven_default().empty() || c.device() == "cpu") {
      if (!c.proven_default().empty() && Listed(c, c.proven_default()) == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            Where(c), ": the proven default \"", c.proven_default(), "\" is not listed"));
      }
      continue;  // the CPU's proof is the test suite every CI run repeats
    }
    const Implementation* d = Listed(c, c.proven_default());
    if (d == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(c), ": the proven default \"", c.proven_default(), "\" is not listed"));
    }
    const Proof& p = d->proof();
    for (const auto& [field, value] :
         {std::pair<const char*, const std::string*>{"card", &p.card()},
          {"commit", &p.commit()},
          {"date", &p.date()},
          {"benchmarks", &p.benchmarks()},
          {"correctness", &p.correctness()},
          {"speed", &p.speed()}}) {
      if (value->empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            Where(c), ": \"", d->name(), "\" is the default without a device proof (proof.",
            field, " is empty): a kernel becomes a device default only after a device run "
            "proved it correct and faster in the same run"));
      }
    }
    const std::string now = *SourcesSha256(*d, root);
    if (d->sources_sha256() != now) {
      return absl::FailedPreconditionError(absl::StrCat(
          Where(c), ": the default \"", d->name(), "\" was proven on ", p.card(), " at ",
          p.commit(), " (", p.date(), "), but its sources changed since (sources_sha256 ",
          d->sources_sha256().empty() ? "missing" : d->sources_sha256(), ", now ", now,
          "): prove it again on a device (tools/device_check.sh) and record the new proof, "
          "or set proven_default to \"\" (the reference runs)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace loom::core::ops
