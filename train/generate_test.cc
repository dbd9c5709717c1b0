// Text generation (Trainer::Generate, what //train:gpt prints after training)
// runs the model through the StageModel interface only: a post-process
// forward, then StageModel::GatherLogits. Every PP-1 layout samples the text
// one rank samples from the same trained model (the same seed, logits within
// the layouts' 1e-6), so a layout that fed the wrong rows, read another
// rank's logits or broadcast the wrong token under CP would differ.

#include <string>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "train/test_util.h"

namespace loom::train {
namespace {

using testing::Layout;

std::string Sample(const Layout& l, bool llama) {
  TrainConfig c = llama ? testing::TinyLlamaConfig(l, 6) : testing::TinyConfig(l, 6);
  absl::Mutex mu;
  std::string text;
  testing::RunResult r = testing::Run(c, l, nullptr, [&](int rank, Trainer& t) {
    absl::StatusOr<std::string> s = t.Generate("The ", 24);  // collective: every rank
    ASSERT_TRUE(s.ok()) << s.status();
    absl::MutexLock lock(&mu);
    if (rank == 0) text = *s;
  });
  EXPECT_TRUE(r.status.ok()) << l.Describe() << ": " << r.status;
  return text;
}

TEST(GenerateTest, EveryLayoutSamplesTheSingleRankText) {
  for (bool llama : {false, true}) {
    const std::string one = Sample(Layout{}, llama);
    EXPECT_GE(one.size(), 24u) << "byte tokenizer: a byte per token (an end of document: 2)";
    Layout tp_sp{2};
    tp_sp.sp = true;
    Layout cp;
    cp.cp = 2;
    Layout tp_cp{2};
    tp_cp.cp = 2;
    for (const Layout& l : {tp_sp, cp, Layout{1, 1, 2}, tp_cp}) {
      EXPECT_EQ(Sample(l, llama), one) << l.Describe() << (llama ? " llama" : " gpt2");
    }
  }
}

}  // namespace
}  // namespace loom::train
