#include "core/cli.h"

#include <cstdlib>

#include "gtest/gtest.h"

namespace loom::core {
namespace {

TEST(CliTest, DashesInFlagNamesBecomeUnderscores) {
  const char* in[] = {"prog", "--tensor-model-parallel-size=2", "--lr-decay-style", "cosine",
                      "--data-path=/a-b/c-d", "-x-y", "plain-arg", "--", "--keep-me"};
  std::vector<char*> argv;
  for (const char* s : in) argv.push_back(const_cast<char*>(s));
  std::vector<std::string> out = NormalizeFlagNames(static_cast<int>(argv.size()), argv.data());
  EXPECT_EQ(out, (std::vector<std::string>{"prog", "--tensor_model_parallel_size=2",
                                           "--lr_decay_style", "cosine", "--data_path=/a-b/c-d",
                                           "-x_y", "plain-arg", "--", "--keep-me"}));
  NormalizedArgv n(static_cast<int>(argv.size()), argv.data());
  EXPECT_EQ(n.argc(), 9);
  EXPECT_STREQ(n.argv()[1], "--tensor_model_parallel_size=2");
  EXPECT_EQ(n.argv()[9], nullptr);
}

TEST(CliTest, FlagNames) {
  EXPECT_EQ(FlagName("--nproc-per-node=2"), "nproc_per_node");
  EXPECT_EQ(FlagName("-nproc_per_node"), "nproc_per_node");
  EXPECT_EQ(FlagName("--data-path=/a-b"), "data_path");
  EXPECT_EQ(FlagName("value-x"), "");
  EXPECT_EQ(FlagName("--"), "");
  EXPECT_EQ(NormalizeFlagName("--a-b=c-d"), "--a_b=c-d");
  EXPECT_EQ(NormalizeFlagName("plain-arg"), "plain-arg");
  EXPECT_EQ(FlagNamesIn({"prog", "--backend=ucx", "--lr", "0.1", "--", "--rank=1"}),
            (std::vector<std::string>{"backend", "lr"}));
}

TEST(CliTest, UserPathsResolveAgainstTheBazelRunDirectory) {
  unsetenv("BUILD_WORKING_DIRECTORY");
  EXPECT_EQ(ResolveUserPath("data/x"), "data/x");
  setenv("BUILD_WORKING_DIRECTORY", "/home/me", 1);
  EXPECT_EQ(ResolveUserPath("data/x"), "/home/me/data/x");
  EXPECT_EQ(ResolveUserPath("/abs/x"), "/abs/x");
  EXPECT_EQ(ResolveUserPath(""), "");
  unsetenv("BUILD_WORKING_DIRECTORY");
}

}  // namespace
}  // namespace loom::core
