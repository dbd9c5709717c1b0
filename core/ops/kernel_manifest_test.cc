#include <cstdlib>
#include <fstream>
#include <string>

#include "core/ops/kernel_choice.h"
#include "core/ops/kernel_manifest.pb.h"
#include "core/ops/kernel_manifest_check.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace loom::core::ops {
namespace {

KernelManifest Parse(const std::string& text) {
  KernelManifest m;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &m)) << text;
  return m;
}

// The repository's manifest against the sources as they are: fails once a
// proven device default's sources change (see the message for what to do).
TEST(KernelManifestTest, CommittedManifestHoldsForTheSourcesAsTheyAre) {
  const KernelManifest m = Parse(std::string(KernelManifestText()));
  ASSERT_GT(m.choice_size(), 0);
  EXPECT_TRUE(CheckManifest(m, ".").ok()) << CheckManifest(m, ".");
}

TEST(KernelManifestTest, CompiledInManifestIsTheCommittedFile) {
  std::ifstream in("core/ops/kernel_manifest.textproto");
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(file, std::string(KernelManifestText()));
}

// Until a device proves another, CUDA attention runs the s x s kernel and
// the CPU its flash kernel.
TEST(KernelManifestTest, AttentionDefaultsAreTheProvenOnes) {
  unsetenv("LOOM_KERNEL_IMPL");
  unsetenv("LOOM_REFERENCE_KERNELS");
  auto cpu = ChooseKernel("attention", DeviceType::kCPU);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->implementation, "flash");
  auto cuda = ChooseKernel("attention", DeviceType::kCUDA);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_EQ(cuda->implementation, "sxs");
  EXPECT_NE(cuda->reason.find("reference"), std::string::npos) << cuda->reason;
}

// A scratch repository: one source file and a manifest naming it.
class ScratchRepo : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = ::testing::TempDir() + "/manifest_repo";
    std::system(("mkdir -p " + root_ + "/k").c_str());
    Write("k/fast.cu", "__global__ void Fast() {}\n");
    Write("k/ref.cu", "__global__ void Ref() {}\n");
  }
  void Write(const std::string& path, const std::string& text) {
    std::ofstream(root_ + "/" + path, std::ios::trunc) << text;
  }
  // A CUDA choice whose default "fast" carries `sha` and a whole proof.
  KernelManifest WithDefault(const std::string& sha) {
    return Parse(R"pb(choice {
      op: "attention" device: "cuda" reference: "ref" proven_default: "fast"
      implementation { name: "ref" sources: "k/ref.cu" }
      implementation {
        name: "fast" sources: "k/fast.cu" sources_sha256: ")pb" + sha + R"pb("
        proof { card: "NVIDIA H100 80GB HBM3" commit: "0123456789ab" date: "2026-12-06"
                benchmarks: "BENCHMARKS.md: x" correctness: "t" speed: "2x ref" }
      }
    })pb");
  }
  std::string root_;
};

TEST_F(ScratchRepo, ProvenDefaultWithMatchingHashPasses) {
  Implementation fast;
  fast.set_name("fast");
  fast.add_sources("k/fast.cu");
  const auto sha = SourcesSha256(fast, root_);
  ASSERT_TRUE(sha.ok()) << sha.status();
  EXPECT_EQ(sha->size(), 64u);
  EXPECT_TRUE(CheckManifest(WithDefault(*sha), root_).ok()) << CheckManifest(WithDefault(*sha), root_);
}

TEST_F(ScratchRepo, ChangedSourcesVoidTheProof) {
  Implementation fast;
  fast.set_name("fast");
  fast.add_sources("k/fast.cu");
  const std::string before = *SourcesSha256(fast, root_);
  Write("k/fast.cu", "__global__ void Fast() { /* tuned */ }\n");
  const absl::Status s = CheckManifest(WithDefault(before), root_);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("sources changed since"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("attention on cuda"), absl::string_view::npos) << s;
}

TEST_F(ScratchRepo, DefaultWithoutAWholeProofIsRefused) {
  KernelManifest m = WithDefault("x");
  m.mutable_choice(0)->mutable_implementation(1)->mutable_proof()->clear_speed();
  const absl::Status s = CheckManifest(m, root_);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("proof.speed is empty"), absl::string_view::npos) << s;
}

TEST_F(ScratchRepo, UnlistedReferenceAndMissingSourceAreRefused) {
  KernelManifest m = WithDefault("x");
  m.mutable_choice(0)->set_reference("nope");
  EXPECT_NE(CheckManifest(m, root_).message().find("reference \"nope\" is not listed"),
            absl::string_view::npos);
  m = WithDefault("x");
  m.mutable_choice(0)->mutable_implementation(0)->set_sources(0, "k/gone.cu");
  EXPECT_NE(CheckManifest(m, root_).message().find("k/gone.cu, which does not exist"),
            absl::string_view::npos);
}

}  // namespace
}  // namespace loom::core::ops
