// A two-corpus blend (--data-path="0.3 A 0.7 B") resumes where it stopped:
// (train 12, save, stop, resume, train 12 more) gives the uninterrupted run's
// losses, bit for bit in the layout that saved and within 1e-5 relative in
// others, because the blend is a function of the consumed-sample position.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/file_util.h"
#include "train/data/indexed_dataset.h"
#include "train/test_util.h"
#include "gtest/gtest.h"

namespace loom::train {
namespace {

using testing::Layout;

std::string Tmp(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

// Unlike testing::Dataset()'s lower-case runs: upper-case runs of period 3.
std::string SecondCorpus() {
  static std::once_flag once;
  static const std::string prefix = Tmp("corpus_b");
  std::call_once(once, [] {
    auto w = IndexedDatasetWriter::Create(prefix, TokenType::kU16);
    ASSERT_TRUE(w.ok()) << w.status();
    std::mt19937 rng(11);
    for (int doc = 0; doc < 150; ++doc) {
      std::vector<int32_t> t(15 + rng() % 30);
      const int base = 'A' + rng() % 20;
      for (size_t i = 0; i < t.size(); ++i) t[i] = (rng() % 6 == 0) ? '.' : base + (i % 3);
      ASSERT_TRUE((*w)->AddSequence(t.data(), t.size()).ok());
      ASSERT_TRUE((*w)->EndDocument().ok());
    }
    ASSERT_TRUE((*w)->Finalize().ok());
  });
  return prefix;
}

TrainConfig BlendConfig(const Layout& l, const std::string& dir) {
  TrainConfig c = testing::TinyConfig(l, 24);
  c.data_path = absl::StrCat("0.3 ", testing::Dataset(), " 0.7 ", SecondCorpus());
  c.data_cache_dir = dir + "/cache";
  return c;
}

TEST(BlendResumeTest, ResumedRunContinuesTheBlend) {
  const std::string dir = Tmp("blend_resume");
  ASSERT_TRUE(checkpoint::RemoveTree(dir).ok());
  const Layout saved{1, 1, 2};  // DP 2
  TrainConfig c = BlendConfig(saved, dir);
  c.save = dir + "/ckpt";
  c.save_interval = 12;
  testing::RunResult full = testing::Run(c, saved);
  ASSERT_TRUE(full.status.ok()) << full.status;
  ASSERT_EQ(full.losses.size(), 24u);

  // The blend's indices were built and cached.
  int blend_files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/cache")) {
    const std::string name = e.path().filename().string();
    if (absl::StartsWith(name, "blend_train_") && absl::EndsWith(name, ".blendidx")) ++blend_files;
    EXPECT_EQ(name.find(".tmp"), std::string::npos) << name;
  }
  EXPECT_EQ(blend_files, 1);

  // The blend is what was read: corpus A alone gives other losses.
  TrainConfig only_a = testing::TinyConfig(saved, 2);
  only_a.data_cache_dir = dir + "/cache";
  testing::RunResult a = testing::Run(only_a, saved);
  ASSERT_TRUE(a.status.ok()) << a.status;
  EXPECT_NE(a.losses[1], full.losses[1]);

  // Resumed in the layout that saved: bit for bit.
  TrainConfig r = BlendConfig(saved, dir);
  r.load = dir + "/ckpt";
  r.checkpoint.load_iteration = 12;
  testing::RunResult resumed = testing::Run(r, saved);
  ASSERT_TRUE(resumed.status.ok()) << resumed.status;
  ASSERT_EQ(resumed.losses.size(), 12u);
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(std::memcmp(&resumed.losses[i], &full.losses[12 + i], sizeof(double)), 0)
        << "iteration " << 13 + i << ": " << resumed.losses[i] << " vs " << full.losses[12 + i];
  }
  std::printf("blend resume (DP2 -> DP2): iteration 13 loss %.9f (uninterrupted %.9f), "
              "iteration 24 %.9f (%.9f)\n",
              resumed.losses[0], full.losses[12], resumed.losses[11], full.losses[23]);

  // Resumed in other layouts: TP 2, PP 2.
  for (const Layout& other : {Layout{2, 1, 1}, Layout{1, 2, 1}}) {
    TrainConfig o = BlendConfig(other, dir);
    o.load = dir + "/ckpt";
    o.checkpoint.load_iteration = 12;
    testing::RunResult moved = testing::Run(o, other);
    ASSERT_TRUE(moved.status.ok()) << other.Describe() << ": " << moved.status;
    testing::ExpectSameCurve(moved.losses, full.losses, 12, 1e-5,
                             absl::StrCat("blend resumed in ", other.Describe()));
    double worst = 0;
    for (int i = 0; i < 12; ++i) {
      worst = std::max(worst, std::abs(moved.losses[i] - full.losses[12 + i]) / full.losses[12 + i]);
    }
    std::printf("blend resume (DP2 -> %s): largest relative difference %.3g\n",
                other.Describe().c_str(), worst);
  }
}

// The flag errors come from Finalize, before any rank starts.
TEST(BlendResumeTest, BadBlendsAreRefusedByFinalize) {
  const std::string a = testing::Dataset();
  struct Case {
    std::string data_path, expected;
  } cases[] = {
      {absl::StrCat("0.3 ", a, " 0.7"), "odd"},
      {absl::StrCat("0.3 ", a, " -1 ", SecondCorpus()), "positive"},
      {absl::StrCat("0.3 ", a, " 0.7 ", Tmp("nowhere")), Tmp("nowhere") + ".idx"},
  };
  for (const Case& k : cases) {
    TrainConfig c = testing::TinyConfig(Layout{}, 2);
    c.data_path = k.data_path;
    absl::Status s = Finalize(&c, 1);
    ASSERT_FALSE(s.ok()) << k.data_path;
    EXPECT_TRUE(absl::StrContains(s.message(), "--data-path")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), k.expected)) << s;
  }
  TrainConfig both = testing::TinyConfig(Layout{}, 2);
  both.train_data_path = a;
  absl::Status s = Finalize(&both, 1);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), "not both")) << s;
}

}  // namespace
}  // namespace loom::train
