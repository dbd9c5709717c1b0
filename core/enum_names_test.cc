#include "core/enum_names.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/marshalling.h"
#include "gtest/gtest.h"

namespace loom::test_enum {

enum class Fruit { kApple, kPear, kQuince };
LOOM_ENUM_NAMES(Fruit, {Fruit::kApple, "apple"}, {Fruit::kPear, "Pear"},
                {Fruit::kQuince, "quince"}, {Fruit::kQuince, "cydonia", /*alias=*/true})

// A flag whose unset value is the empty string (Megatron's None).
enum class Mode { kUnset, kFast };
LOOM_ENUM_NAMES(Mode, {Mode::kUnset, ""}, {Mode::kFast, "fast"})

}  // namespace loom::test_enum

ABSL_FLAG(loom::test_enum::Fruit, fruit, loom::test_enum::Fruit::kPear, "a fruit");

namespace loom::core {
namespace {

using test_enum::Fruit;

TEST(EnumNamesTest, NamesAndChoicesInDeclarationOrder) {
  EXPECT_EQ(EnumName(Fruit::kApple), "apple");
  EXPECT_EQ(EnumName(Fruit::kQuince), "quince");
  EXPECT_EQ(EnumName(static_cast<Fruit>(7)), "?");
  EXPECT_EQ(EnumChoices<Fruit>(), "apple | Pear | quince");
}

TEST(EnumNamesTest, ParseIsExactAndItsErrorNamesWhatAndTheChoices) {
  EXPECT_EQ(FindEnum<Fruit>("Pear"), Fruit::kPear);
  EXPECT_EQ(FindEnum<Fruit>("cydonia"), Fruit::kQuince);  // an alias reads, is never written
  EXPECT_EQ(EnumName(Fruit::kQuince), "quince");
  EXPECT_EQ(FindEnum<Fruit>("pear"), std::nullopt);  // case-sensitive, like Megatron's choices
  absl::StatusOr<Fruit> bad = ParseEnum<Fruit>("fig", "--fruit");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "--fruit is 'fig'; expected one of apple | Pear | quince");
}

TEST(EnumNamesTest, AnEmptySpellingIsAChoiceShownQuoted) {
  EXPECT_EQ(FindEnum<test_enum::Mode>(""), test_enum::Mode::kUnset);
  EXPECT_EQ(EnumName(test_enum::Mode::kUnset), "");
  EXPECT_EQ(EnumChoices<test_enum::Mode>(), "\"\" | fast");
}

TEST(EnumNamesTest, AbslFlagParsesAndUnparsesTheSpellings) {
  EXPECT_EQ(absl::GetFlag(FLAGS_fruit), Fruit::kPear);
  Fruit f = Fruit::kApple;
  std::string error;
  EXPECT_TRUE(absl::ParseFlag("quince", &f, &error));
  EXPECT_EQ(f, Fruit::kQuince);
  EXPECT_FALSE(absl::ParseFlag("fig", &f, &error));
  EXPECT_EQ(error, "expected one of apple | Pear | quince");
  EXPECT_EQ(f, Fruit::kQuince);  // unchanged by a failed parse
  EXPECT_EQ(absl::UnparseFlag(Fruit::kApple), "apple");
}

}  // namespace
}  // namespace loom::core
