// LOOM_CUDNN_LIBRARY pointing nowhere: the loader, the graph layer and every
// caller get one clean FailedPrecondition naming libcudnn.so.9 and the path
// tried (its own binary: the library is loaded once per process).
#include <cstdlib>
#include <string>

#include "core/cuda/cudnn/graph_desc.h"
#include "core/cuda/cudnn/loader.h"
#include "core/cuda/cudnn/sdpa_graph.h"
#include "gtest/gtest.h"

namespace loom::core::cuda::cudnn {
namespace {

constexpr char kMissing[] = "/nonexistent/loom/libcudnn.so.9";

TEST(LoaderMissingTest, FailedPreconditionNamesTheLibraryAndWhatWasTried) {
  ASSERT_EQ(setenv("LOOM_CUDNN_LIBRARY", kMissing, 1), 0);
  const absl::StatusOr<int64_t> version = LoadedCudnnVersion();
  ASSERT_FALSE(version.ok());
  EXPECT_EQ(version.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string msg(version.status().message());
  EXPECT_NE(msg.find("libcudnn.so.9"), std::string::npos) << msg;
  EXPECT_NE(msg.find(kMissing), std::string::npos) << msg;
  EXPECT_NE(msg.find("LOOM_CUDNN_LIBRARY"), std::string::npos) << msg;

  // The graph layer refuses before any frontend call.
  const SdpaDesc desc =
      InterleavedDesc(Direction::kForward, {1, 128, 16, 16, 64}, DType::kBF16);
  const auto graph = SdpaGraph::Describe(desc, 90);
  EXPECT_EQ(graph.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(LoadCudnn(), version.status());  // remembered, not retried
}

}  // namespace
}  // namespace loom::core::cuda::cudnn
