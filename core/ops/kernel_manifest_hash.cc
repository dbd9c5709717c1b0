// Prints the sources_sha256 of one implementation in the kernel manifest:
//   bazel run //core/ops:kernel_manifest_hash -- OP DEVICE IMPLEMENTATION
// (from the repository's working tree when run by `bazel run`).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/ops/kernel_choice.h"
#include "core/ops/kernel_manifest.pb.h"
#include "core/ops/kernel_manifest_check.h"
#include "google/protobuf/text_format.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: kernel_manifest_hash OP DEVICE IMPLEMENTATION (e.g. attention cuda cudnn)\n");
    return 2;
  }
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  const std::string root = workspace != nullptr ? workspace : ".";
  loom::core::ops::KernelManifest m;
  google::protobuf::TextFormat::ParseFromString(std::string(loom::core::ops::KernelManifestText()), &m);
  for (const auto& c : m.choice()) {
    if (c.op() != argv[1] || c.device() != argv[2]) continue;
    for (const auto& i : c.implementation()) {
      if (i.name() != argv[3]) continue;
      auto sha = loom::core::ops::SourcesSha256(i, root);
      if (!sha.ok()) {
        std::fprintf(stderr, "%s\n", std::string(sha.status().message()).c_str());
        return 1;
      }
      std::printf("%s\n", sha->c_str());
      return 0;
    }
  }
  std::fprintf(stderr, "core/ops/kernel_manifest.textproto lists no %s %s %s\n", argv[1], argv[2], argv[3]);
  return 1;
}
