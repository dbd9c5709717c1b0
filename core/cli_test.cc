#include "core/cli.h"

#include <cstdio>
#include <cstdlib>
#include <optional>

#include "absl/flags/flag.h"
#include "gtest/gtest.h"

// Flags of every kind the parser's messages describe.
ABSL_FLAG(int, cli_test_layers, 4, "an int");
ABSL_FLAG(int64_t, cli_test_tokens, 0, "an int64");
ABSL_FLAG(double, cli_test_lr, 0.1, "a double");
ABSL_FLAG(bool, cli_test_swiglu, false, "a bool");
ABSL_FLAG(std::string, cli_test_path, "", "a string");
ABSL_FLAG(std::optional<int64_t>, cli_test_exit_interval, std::nullopt, "an optional");

namespace loom::core {
namespace {

std::vector<char*> Argv(std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  return argv;
}

// CheckFlagArgs's message for `args` as typed ("" when they parse).
std::string Problems(std::vector<std::string> args) {
  args.insert(args.begin(), "prog");
  std::vector<char*> argv = Argv(args);
  const absl::Status s =
      CheckFlagArgs(NormalizeFlagNames(static_cast<int>(args.size()), argv.data()));
  return std::string(s.message());
}

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

TEST(CliTest, NoDashFormOfBooleanFlagsIsAbseilsNegation) {
  EXPECT_EQ(NormalizeFlagName("--no-cli-test-swiglu"), "--nocli_test_swiglu");
  EXPECT_EQ(FlagName("--no-cli-test-swiglu"), "nocli_test_swiglu");
  EXPECT_EQ(NormalizeFlagName("--no-cli-test-layers"), "--no_cli_test_layers");  // not a bool
  EXPECT_EQ(NormalizeFlagName("--no-such-flag"), "--no_such_flag");
}

TEST(CliTest, GoodArgumentsPass) {
  EXPECT_EQ(Problems({"--cli-test-layers=3", "--cli_test_tokens", "70", "-cli-test-lr=1e-3",
                      "--cli-test-swiglu", "--no-cli-test-swiglu", "--nocli_test_swiglu",
                      "--cli-test-swiglu=false", "--cli-test-path=", "--cli-test-exit-interval=",
                      "--cli-test-exit-interval=5", "positional", "-", "--helpfull",
                      "--", "--anything=goes"}),
            "");
  EXPECT_EQ(Problems({"--undefok=mystery", "--mystery=1", "--nomystery"}), "");
}

TEST(CliTest, IllegalValuesNameTheFlagWithDashes) {
  EXPECT_EQ(Problems({"--cli_test_layers=abc"}),
            "--cli-test-layers=abc: Illegal value 'abc': expected an integer");
  EXPECT_EQ(Problems({"--cli-test-layers", "abc"}),
            "--cli-test-layers=abc: Illegal value 'abc': expected an integer");
  EXPECT_EQ(Problems({"--cli-test-layers=99999999999"}),
            "--cli-test-layers=99999999999: Illegal value '99999999999': expected an integer "
            "from -2147483648 to 2147483647");
  EXPECT_EQ(Problems({"--cli-test-tokens=1.5"}),
            "--cli-test-tokens=1.5: Illegal value '1.5': expected an integer");
  EXPECT_EQ(Problems({"--cli-test-lr=fast"}),
            "--cli-test-lr=fast: Illegal value 'fast': expected a number");
  EXPECT_EQ(Problems({"--cli-test-swiglu=maybe"}),
            "--cli-test-swiglu=maybe: Illegal value 'maybe': expected true or false");
  EXPECT_EQ(Problems({"--cli-test-exit-interval=soon"}),
            "--cli-test-exit-interval=soon: Illegal value 'soon': expected an integer (or "
            "nothing: unset)");
  EXPECT_EQ(Problems({"--cli-test-layers"}),
            "--cli-test-layers: missing its value (--cli-test-layers=VALUE)");
  EXPECT_EQ(Problems({"--no-cli-test-swiglu=1"}),
            "--no-cli-test-swiglu=1: --no-X takes no value (--cli-test-swiglu=1 does)");
  EXPECT_EQ(Problems({"--nocli_test_layers"}),
            "--no-cli-test-layers: --cli-test-layers is not a boolean flag: it has no --no- form");
}

TEST(CliTest, UnknownFlagsNameTheClosestOneWithDashes) {
  EXPECT_EQ(Problems({"--cli-test-layyers=2"}),
            "--cli-test-layyers=2: unknown flag (did you mean --cli-test-layers?)");
  EXPECT_EQ(Problems({"--cli-test-lyaers"}),
            "--cli-test-lyaers: unknown flag (did you mean --cli-test-layers?)");
  EXPECT_EQ(Problems({"--no-cli-test-swigl"}),
            "--no-cli-test-swigl: unknown flag (did you mean --no-cli-test-swiglu?)");
  // Megatron users' shorthand: a flag with all the words typed, the shortest.
  EXPECT_EQ(Problems({"--test-cli-exit=1"}),
            "--test-cli-exit=1: unknown flag (did you mean --cli-test-exit-interval?)");
  EXPECT_EQ(Problems({"--zzzzzz=1"}), "--zzzzzz=1: unknown flag");
  // Every problem, one line each.
  EXPECT_EQ(Problems({"--zzzzzz", "--cli-test-lr=x"}),
            "--zzzzzz: unknown flag\n--cli-test-lr=x: Illegal value 'x': expected a number");
}

TEST(CliDeathTest, ParseCommandLineExits2WithTheProgramAndTheProblem) {
  std::vector<std::string> args = {"/some/dir/prog", "--cli-test-layers=abc"};
  std::vector<char*> argv = Argv(args);
  EXPECT_EXIT(ParseCommandLine(2, argv.data()), testing::ExitedWithCode(2),
              "^prog: --cli-test-layers=abc: Illegal value 'abc': expected an integer\n$");
}

TEST(CliDeathTest, HelpPrintsTheBinarysTextAndExits0) {
  std::vector<std::string> args = {"prog", "--cli-test-layers=3", "--help"};
  std::vector<char*> argv = Argv(args);
  auto help = [] {
    std::fprintf(stderr, "help asked\n");  // the death test reads stderr
    return std::string("usage\n");
  };
  EXPECT_EXIT(ParseCommandLine(3, argv.data(), help), testing::ExitedWithCode(0), "help asked");
}

TEST(CliTest, ParseCommandLineRewritesArgvAndSetsTheFlags) {
  std::vector<std::string> args = {"prog", "--cli-test-layers=7", "--no-cli-test-swiglu",
                                   "--cli-test-path", "a-b", "pos", "--", "--x-y"};
  std::vector<char*> argv = Argv(args);
  const std::vector<char*> rest = ParseCommandLine(static_cast<int>(args.size()), argv.data());
  EXPECT_STREQ(argv[1], "--cli_test_layers=7");
  EXPECT_STREQ(argv[2], "--nocli_test_swiglu");
  EXPECT_STREQ(argv[7], "--x-y");
  EXPECT_EQ(absl::GetFlag(FLAGS_cli_test_layers), 7);
  EXPECT_FALSE(absl::GetFlag(FLAGS_cli_test_swiglu));
  EXPECT_EQ(absl::GetFlag(FLAGS_cli_test_path), "a-b");
  ASSERT_EQ(rest.size(), 3u);
  EXPECT_STREQ(rest[1], "pos");
  EXPECT_STREQ(rest[2], "--x-y");
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
