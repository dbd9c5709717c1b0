// Every SDPA graph Loom builds, described for sm_90 and validate()d by
// cudnn-frontend: no GPU needed (the frontend asks the loaded libcudnn's
// version, so the cases skip, with the reason, where libcudnn is missing).
// Build() (heuristics, support check, plan) needs a GPU: its own case.
#include "core/cuda/cudnn/sdpa_graph.h"

#include <iostream>
#include <string>
#include <vector>

#include "core/cuda/cudnn/graph_desc.h"
#include "core/cuda/cudnn/loader.h"
#include "core/cuda/runtime.h"
#include "gtest/gtest.h"

namespace loom::core::cuda::cudnn {
namespace {

constexpr int kHopper = 90;

#define REQUIRE_CUDNN()                                                         \
  do {                                                                          \
    const absl::Status st_ = LoadCudnn();                                       \
    if (!st_.ok()) GTEST_SKIP() << "needs libcudnn.so.9 (no GPU needed): " << st_; \
  } while (0)

struct Case {
  std::string name;
  SdpaDesc desc;
};

// MHA through the interleaved qkv (GPT-2-medium: 16 heads) and GQA through
// separate q/k/v (Llama-3.2-1B: 32 heads, 8 groups); s 128 .. 8192; d 64 and
// 128; batch 2 and batch filling ~16k tokens; forward and backward; bf16.
std::vector<Case> LoomGraphs() {
  std::vector<Case> cases;
  for (int64_t s : {128, 1024, 2048, 8192}) {
    for (int64_t d : {64, 128}) {
      for (int64_t b : {int64_t{2}, 16384 / s}) {
        for (Direction dir : {Direction::kForward, Direction::kBackward}) {
          const char* dn = dir == Direction::kForward ? "fwd" : "bwd";
          const std::string tag = "s" + std::to_string(s) + "_d" + std::to_string(d) + "_b" +
                                  std::to_string(b) + "_" + dn;
          cases.push_back({"mha16_" + tag,
                           InterleavedDesc(dir, {b, s, 16, 16, d}, DType::kBF16)});
          cases.push_back({"gqa32x8_" + tag,
                           SeparateDesc(dir, {b, s, 32, 8, d}, DType::kBF16)});
          cases.push_back({"mha16_separate_" + tag,
                           SeparateDesc(dir, {b, s, 16, 16, d}, DType::kBF16)});
        }
      }
    }
  }
  return cases;
}

TEST(SdpaGraphTest, LoadedLibraryIsCudnn9) {
  REQUIRE_CUDNN();
  const absl::StatusOr<int64_t> v = LoadedCudnnVersion();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_GE(*v, 90000);
  std::cout << "libcudnn " << *v << " from " << LoadedCudnnPath().value_or("?") << "\n";
}

TEST(SdpaGraphTest, EveryLoomGraphValidatesForSm90) {
  REQUIRE_CUDNN();
  for (const Case& c : LoomGraphs()) {
    const auto graph = SdpaGraph::Describe(c.desc, kHopper);
    EXPECT_TRUE(graph.ok()) << c.name << ": " << graph.status();
  }
}

// validate() is not vacuous: cuDNN's own Hopper limits refuse these graphs
// (Supports() refuses them earlier in the API). The forward's validate()
// lets d 264 through (cuDNN 9.19; only the GPU's check_support decides it),
// the backward's refuses it.
TEST(SdpaGraphTest, ValidateRefusesWhatHopperCannotRun) {
  REQUIRE_CUDNN();
  const auto fwd = SdpaGraph::Describe(
      InterleavedDesc(Direction::kForward, {2, 128, 16, 16, 12}, DType::kBF16), kHopper);
  EXPECT_EQ(fwd.status().code(), absl::StatusCode::kInvalidArgument);
  for (int64_t d : {12, 264}) {
    const auto bwd = SdpaGraph::Describe(
        InterleavedDesc(Direction::kBackward, {2, 128, 16, 16, d}, DType::kBF16), kHopper);
    EXPECT_EQ(bwd.status().code(), absl::StatusCode::kInvalidArgument) << "d " << d;
    EXPECT_NE(bwd.status().message().find("hidden_dim"), std::string::npos) << bwd.status();
  }
}

// Heuristics, support check and plan for each graph on the device.
TEST(SdpaGraphTest, EveryLoomGraphBuildsOnTheGpu) {
  REQUIRE_CUDNN();
  const absl::StatusOr<int> n = VisibleDeviceCount();
  if (!n.ok()) GTEST_SKIP() << "needs a CUDA GPU: " << n.status();
  ASSERT_TRUE(SetCurrentDevice(0).ok());
  int major = 0, minor = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0), cudaSuccess);
  const absl::StatusOr<cudaStream_t> stream = CurrentStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  const auto handle = ThreadHandle(0, *stream);
  ASSERT_TRUE(handle.ok()) << handle.status();
  for (const Case& c : LoomGraphs()) {
    auto graph = SdpaGraph::Describe(c.desc, major * 10 + minor);
    ASSERT_TRUE(graph.ok()) << c.name << ": " << graph.status();
    const absl::Status built = (*graph)->Build(*handle);
    EXPECT_TRUE(built.ok()) << c.name << ": " << built;
    if (built.ok()) {
      std::cout << c.name << ": workspace " << (*graph)->WorkspaceBytes() << " B\n";
    }
  }
}

}  // namespace
}  // namespace loom::core::cuda::cudnn
