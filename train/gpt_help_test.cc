// `gpt --help` and gpt's flag errors, from the built binary as users run it.
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "config/config.h"
#include "gtest/gtest.h"

namespace loom::train {
namespace {

struct GptRun {
  int code;
  std::string out, err;
};

std::string Read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

GptRun Gpt(const std::string& args) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  const std::string gpt =
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"), "/train/gpt");
  const std::string cmd = absl::StrCat(gpt, " ", args, " > ", dir, "/out 2> ", dir, "/err");
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, Read(dir + "/out"), Read(dir + "/err")};
}

TEST(GptHelpTest, EveryFlagOfTheBinaryIsInAGroup) {
  const GptRun r = Gpt("--help");
  EXPECT_EQ(r.code, 0);
  // gpt --help names the flags train/flag_groups.cc misses, and its names
  // that are no flag, on stderr.
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.out.find("Other ("), std::string::npos);
}

TEST(GptHelpTest, GroupsInMegatronsOrderDashedNamesAndTheJobsDefaults) {
  const GptRun r = Gpt("--help");
  ASSERT_EQ(r.code, 0) << r.err;
  size_t at = 0;
  for (const char* heading : {"\nModel:\n", "\nParallelism", "\nData:\n", "\nTraining",
                              "\nCheckpointing:\n", "\nLogging", "\nLaunch"}) {
    const size_t next = r.out.find(heading, at);
    ASSERT_NE(next, std::string::npos) << heading << " missing or out of order:\n" << r.out;
    at = next;
  }
  const TrainConfig d;
  EXPECT_NE(r.out.find(absl::StrCat("\n  --num-layers=", d.model.num_layers, " ")),
            std::string::npos);
  // The default job: BackendOf's backend, 2 ranks (gpt_main.cc's kDefaultNprocPerNode).
  EXPECT_NE(r.out.find(absl::StrCat("\n  --distributed-backend=", BackendOf(d), " ")),
            std::string::npos);
  EXPECT_NE(r.out.find(absl::StrCat("\n  --backend=", BackendOf(d), " ")), std::string::npos);
  EXPECT_NE(r.out.find("\n  --nproc-per-node=2 "), std::string::npos);
  for (absl::string_view line : absl::StrSplit(r.out, '\n')) {
    if (line.substr(0, 4) != "  --") continue;
    const absl::string_view name = line.substr(0, line.find('='));
    EXPECT_EQ(name.find('_'), absl::string_view::npos) << line;
  }
}

TEST(GptHelpTest, BadValuesAndUnknownFlagsAreNamedWithDashesBeforeAnyWork) {
  GptRun r = Gpt("--num-layers=abc");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "gpt: --num-layers=abc: Illegal value 'abc': expected an integer\n");
  EXPECT_EQ(r.out, "");
  r = Gpt("--num_layers abc");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "gpt: --num-layers=abc: Illegal value 'abc': expected an integer\n");
  r = Gpt("--num-layyers=2 --use-distributed-optimizer=maybe");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "gpt: --num-layyers=2: unknown flag (did you mean --num-layers?)\n"
            "gpt: --use-distributed-optimizer=maybe: Illegal value 'maybe': expected true or "
            "false\n");
  EXPECT_EQ(r.out, "");
}

}  // namespace
}  // namespace loom::train
