#include "plan/auto_layout.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "plan/report.h"

namespace loom::plan {
namespace {

train::TrainConfig Tiny() {
  train::TrainConfig c;
  c.model.num_layers = 2;
  c.model.hidden_size = 32;
  c.model.num_attention_heads = 4;
  c.model.seq_length = 16;
  c.global_batch_size = 8;
  return c;
}

Hardware Cpu() {
  std::string what;
  absl::StatusOr<Hardware> hw = AutoLayoutHardware("", "cpu", &what);
  EXPECT_TRUE(hw.ok()) << hw.status();
  EXPECT_EQ(what, "built-in plan/testdata/cpu.textproto");
  return *hw;
}

TEST(AutoLayout, BuiltinHardwareParses) {
  std::string what;
  absl::StatusOr<Hardware> cuda = AutoLayoutHardware("", "cuda", &what);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_EQ(cuda->devices_per_node(), 8);
  EXPECT_TRUE(Cpu().ranks_share_compute());
}

TEST(AutoLayout, BadFileIsNamed) {
  std::string what;
  absl::StatusOr<Hardware> hw = AutoLayoutHardware("/nonexistent/hw.textproto", "cpu", &what);
  ASSERT_FALSE(hw.ok());
  EXPECT_TRUE(absl::StrContains(hw.status().message(), "--hardware=/nonexistent/hw.textproto"))
      << hw.status();
}

// The choice is //train:plan's row 1, and the same every time it is computed.
TEST(AutoLayout, FastestThatFitsDeterministic) {
  const Hardware hw = Cpu();
  absl::StatusOr<AutoLayout> a = ChooseLayout(Tiny(), 4, hw, "cpu");
  ASSERT_TRUE(a.ok()) << a.status();
  SearchOptions search;
  search.gpus = 4;
  search.devices_per_node = hw.devices_per_node();
  absl::StatusOr<std::vector<Planned>> plans = PlanAll(Tiny(), hw, search, {});
  ASSERT_TRUE(plans.ok());
  const train::TrainConfig& row1 = plans->front().config;
  EXPECT_EQ(a->config.tensor_model_parallel_size, row1.tensor_model_parallel_size);
  EXPECT_EQ(a->config.pipeline_model_parallel_size, row1.pipeline_model_parallel_size);
  EXPECT_EQ(a->config.micro_batch_size, row1.micro_batch_size);
  EXPECT_EQ(a->config.optimizer.distributed, row1.optimizer.distributed);
  EXPECT_EQ(a->best.time.step, plans->front().time.step);
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<AutoLayout> again = ChooseLayout(Tiny(), 4, hw, "cpu");
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->log_line, a->log_line);
    EXPECT_EQ(again->flags, a->flags);
  }
  EXPECT_TRUE(absl::StartsWith(a->log_line, "loom: --auto-layout chose TP ")) << a->log_line;
  EXPECT_TRUE(absl::StrContains(a->log_line, "second best: ")) << a->log_line;
  // Not finalized, every other field kept.
  EXPECT_EQ(a->config.global_batch_size, 8);
  EXPECT_EQ(a->config.model.hidden_size, 32);
  train::TrainConfig done = a->config;
  EXPECT_TRUE(train::Finalize(&done, 4).ok());
}

TEST(AutoLayout, NothingFits) {
  Hardware hw = Cpu();
  hw.set_device_memory_bytes(1024);
  absl::StatusOr<AutoLayout> a = ChooseLayout(Tiny(), 2, hw, "tiny.textproto");
  ASSERT_FALSE(a.ok());
  EXPECT_TRUE(absl::StrContains(a.status().message(), "fits in")) << a.status();
  EXPECT_TRUE(absl::StrContains(a.status().message(), "tiny.textproto")) << a.status();
}

TEST(AutoLayout, ExplicitLayoutFlagsAreNamed) {
  EXPECT_TRUE(CheckNoLayoutFlags({"seq_length", "auto_layout"}).ok());
  absl::Status s = CheckNoLayoutFlags({"tensor_model_parallel_size", "nouse_distributed_optimizer"});
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(
      s.message(), "--auto-layout with --tensor-model-parallel-size, --use-distributed-optimizer: "
                   "choose one"))
      << s;
}

}  // namespace
}  // namespace loom::plan
