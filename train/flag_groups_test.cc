#include "train/flag_groups.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "train/help.h"

namespace loom::train {
namespace {

TEST(FlagGroupsTest, TheTableAgreesWithTheFlagsItNames) {
  const std::vector<FlagGroup> groups = {{"A", {"x", "y"}}, {"B", {"z"}}};
  EXPECT_TRUE(CheckFlagGroups(groups, {"x", "y", "z"}).empty());
  EXPECT_EQ(CheckFlagGroups(groups, {"x", "y", "z"}).ToString(), "");
}

TEST(FlagGroupsTest, ListsUngroupedFlagsNamesThatAreNoFlagAndRepeats) {
  const std::vector<FlagGroup> groups = {{"A", {"num_layers", "gone"}}, {"B", {"num_layers"}}};
  const FlagGroupProblems p = CheckFlagGroups(groups, {"num_layers", "new_flag", "other_new"});
  EXPECT_EQ(p.ungrouped, (std::vector<std::string>{"new_flag", "other_new"}));
  EXPECT_EQ(p.not_flags, (std::vector<std::string>{"gone"}));
  EXPECT_EQ(p.repeated, (std::vector<std::string>{"num_layers"}));
  EXPECT_EQ(p.ToString(),
            "flags in no --help group (add them to train/flag_groups.cc): --new-flag --other-new\n"
            "train/flag_groups.cc names what is no flag of this binary: --gone\n"
            "train/flag_groups.cc names more than once: --num-layers");
}

TEST(FlagGroupsTest, GptGroupsAreMegatronsInOrderWithNoRepeats) {
  std::vector<std::string> titles;
  std::set<std::string> names;
  for (const FlagGroup& g : GptFlagGroups()) {
    titles.push_back(g.title);
    names.insert(g.flags.begin(), g.flags.end());
  }
  ASSERT_EQ(titles.size(), 7u);
  const char* starts[] = {"Model", "Parallelism", "Data", "Training", "Checkpointing", "Logging",
                          "Launch"};
  for (size_t k = 0; k < titles.size(); ++k) {
    EXPECT_EQ(titles[k].rfind(starts[k], 0), 0u) << titles[k];
  }
  EXPECT_TRUE(CheckFlagGroups(GptFlagGroups(), names).empty())
      << CheckFlagGroups(GptFlagGroups(), names).ToString();
}

TEST(FormatHelpTest, DashedNamesDefaultsAndAHelpColumn) {
  const std::vector<HelpSection> sections = {
      {"Model",
       {{"num_layers", "4", "Transformer layers"},
        {"data_path", "", "Dataset prefix"},
        {"untie_embeddings_and_output_weights", "false", "A separate output-layer weight"}}},
      {"Empty", {}},
      {"Logging", {{"log_interval", "10", "one two three four five six seven eight nine ten"}}},
  };
  EXPECT_EQ(FormatHelp("Usage.", sections, 70),
            "Usage.\n"
            "\n"
            "Model:\n"
            "  --num-layers=4                      Transformer layers\n"
            "  --data-path=\"\"                      Dataset prefix\n"
            "  --untie-embeddings-and-output-weights=false\n"
            "                                      A separate output-layer weight\n"
            "\n"
            "Logging:\n"
            "  --log-interval=10                   one two three four five six\n"
            "                                      seven eight nine ten\n");
}

}  // namespace
}  // namespace loom::train
