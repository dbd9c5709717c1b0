// A checkpoint saved in one layout loads into any other and continues with
// the loss the original layout gets (within 1e-5 relative): TP2xPP2 ->
// TP1xPP4 -> TP4xPP1, moments moving between the distributed optimizer's
// flat shards and whole tensors, across sharding strategies (no_shard,
// optim, optim_grads), and the offline converter.
#include <cmath>

#include "checkpoint/convert.h"
#include "checkpoint/file_util.h"
#include "checkpoint/reader.h"
#include "train/test_util.h"
#include "gtest/gtest.h"

namespace loom::checkpoint {
namespace testing = ::loom::train::testing;
namespace {

using testing::Layout;

constexpr double kTolerance = 1e-5;

std::string Dir(const std::string& name) {
  const std::string d = std::string(getenv("TEST_TMPDIR")) + "/" + name;
  EXPECT_TRUE(RemoveTree(d).ok());
  return d;
}

// Trains `l` from `load_dir`@`from` to 40, saving every 10 to `save_dir`;
// checks the losses against ref[from..40).
void Continue(const std::vector<double>& ref, const Layout& l, const std::string& load_dir,
              int from, const std::string& save_dir) {
  train::TrainConfig c = testing::TinyConfig(l, 40);
  c.load = load_dir;
  c.save = save_dir;
  c.save_interval = 10;
  c.checkpoint.load_iteration = from;
  testing::RunResult r = testing::Run(c, l);
  ASSERT_TRUE(r.status.ok()) << l.Describe() << ": " << r.status;
  ASSERT_EQ(r.losses.size(), static_cast<size_t>(40 - from));
  for (int i = 0; i < 40 - from; ++i) {
    EXPECT_NEAR(r.losses[i], ref[from + i], kTolerance * ref[from + i])
        << l.Describe() << " resumed at " << from << ", iteration " << from + i + 1;
  }
}

TEST(ReshardTest, LoadsIntoEveryLayoutAndKeepsTheLossCurve) {
  const Layout a{2, 2, 1};
  const std::string dir_a = Dir("a"), dir_b = Dir("b"), dir_c = Dir("c"), dir_d = Dir("d"),
                    dir_e = Dir("e");
  train::TrainConfig c = testing::TinyConfig(a, 40);
  c.save = dir_a;
  c.save_interval = 10;
  testing::RunResult ref = testing::Run(c, a);
  ASSERT_TRUE(ref.status.ok()) << ref.status;
  ASSERT_EQ(ref.losses.size(), 40u);

  // TP2xPP2 -> TP1xPP4 -> TP4xPP1.
  Continue(ref.losses, Layout{1, 4, 1}, dir_a, 10, dir_b);
  Continue(ref.losses, Layout{4, 1, 1}, dir_b, 20, dir_c);
  // Whole-tensor moments -> distributed optimizer's flat DP shards (DP 4) ->
  // back into TP2 x PP2 interleaved.
  Continue(ref.losses, Layout{1, 1, 4, 0, false, true}, dir_a, 20, dir_d);
  Continue(ref.losses, Layout{2, 2, 1, 1, false, false, "interleaved"}, dir_d, 30, dir_e);
}

// What a checkpoint holds does not depend on the sharding strategy (the
// moments are saved whole or as flat DP shards, gradients never): no_shard
// -> optim_grads (ZeRO-2) -> optim (ZeRO-1, DP 4) -> optim_grads (TP 2 + SP),
// and optim_grads -> no_shard, each continuing the no_shard curve.
TEST(ReshardTest, CheckpointsCrossShardingStrategies) {
  const Layout a{1, 1, 2};
  const std::string dir_f = Dir("f"), dir_g = Dir("g"), dir_h = Dir("h"), dir_i = Dir("i"),
                    dir_j = Dir("j");
  train::TrainConfig c = testing::TinyConfig(a, 40);
  c.save = dir_f;
  c.save_interval = 10;
  testing::RunResult ref = testing::Run(c, a);
  ASSERT_TRUE(ref.status.ok()) << ref.status;
  ASSERT_EQ(ref.losses.size(), 40u);
  Continue(ref.losses, testing::OptimGrads({1, 1, 2}), dir_f, 10, dir_g);
  Continue(ref.losses, Layout{1, 1, 4, 0, false, true}, dir_g, 20, dir_h);
  Continue(ref.losses, testing::OptimGrads({2, 1, 2, 0, true}), dir_h, 30, dir_i);
  Continue(ref.losses, Layout{1, 1, 2}, dir_g, 20, dir_j);
}

TEST(ReshardTest, OfflineConverterWritesTheTargetLayout) {
  const Layout a{2, 1, 2, 0, false, true};
  const std::string src = Dir("conv_src"), dst = Dir("conv_dst");
  train::TrainConfig c = testing::TinyConfig(a, 30);
  c.save = src;
  c.save_interval = 10;
  testing::RunResult ref = testing::Run(c, a);
  ASSERT_TRUE(ref.status.ok()) << ref.status;

  ASSERT_TRUE(ConvertCheckpoint(src + "/iter_0000010", dst, 1, 2).ok());
  auto reader = CheckpointReader::Open(dst + "/iter_0000010");
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE((*reader)->VerifyAll().ok());
  EXPECT_EQ((*reader)->manifest().files_size(), 2);
  EXPECT_EQ((*reader)->manifest().layout().pipeline_parallel(), 2);
  EXPECT_EQ(*ReadFile(dst + "/latest"), "iter_0000010\n");
  // Every parameter and moment is carried over exactly.
  auto original = CheckpointReader::Open(src + "/iter_0000010");
  ASSERT_TRUE(original.ok());
  for (const TensorInfo& t : (*original)->manifest().tensors()) {
    auto x = (*original)->ReadGlobal(t.name(), t.state());
    auto y = (*reader)->ReadGlobal(t.name(), t.state());
    ASSERT_TRUE(x.ok() && y.ok()) << t.name();
    EXPECT_EQ(*x, *y) << t.name() << " " << StateName(t.state());
  }
  // And training continues from it on TP1 x PP2 with the original curve.
  train::TrainConfig r = testing::TinyConfig(Layout{1, 2, 1}, 30);
  r.load = dst;
  testing::RunResult cont = testing::Run(r, Layout{1, 2, 1});
  ASSERT_TRUE(cont.status.ok()) << cont.status;
  ASSERT_EQ(cont.losses.size(), 20u);
  for (int i = 0; i < 20; ++i) {
    EXPECT_NEAR(cont.losses[i], ref.losses[10 + i], kTolerance * ref.losses[10 + i]) << i;
  }
  // Layouts that do not fit the model are refused, naming the flag.
  absl::Status bad = ConvertCheckpoint(src + "/iter_0000010", Dir("conv_bad"), 3, 1);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("--target-tensor-parallel-size=3"), std::string::npos) << bad;
}

// The Llama-style model (RMSNorm, RoPE, SwiGLU, GQA, untied output layer, no
// biases): the manifest records the architecture, and the offline converter
// reshards it (output_layer.weight included) with the loss curve kept.
TEST(ReshardTest, OfflineConverterReshardsLlama) {
  const Layout a{2, 1, 1};
  const std::string src = Dir("llama_src"), dst = Dir("llama_dst");
  train::TrainConfig c = testing::TinyLlamaConfig(a, 20);
  c.save = src;
  c.save_interval = 10;
  testing::RunResult ref = testing::Run(c, a);
  ASSERT_TRUE(ref.status.ok()) << ref.status;

  ASSERT_TRUE(ConvertCheckpoint(src + "/iter_0000010", dst, 1, 2).ok());
  auto reader = CheckpointReader::Open(dst + "/iter_0000010");
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE((*reader)->VerifyAll().ok());
  const ModelConfig& m = (*reader)->manifest().model();
  EXPECT_EQ(m.normalization(), "RMSNorm");
  EXPECT_EQ(m.position_embedding_type(), "rope");
  EXPECT_TRUE(m.swiglu());
  EXPECT_TRUE(m.group_query_attention());
  EXPECT_EQ(m.num_query_groups(), 2);
  EXPECT_TRUE(m.untie_embeddings_and_output_weights());
  EXPECT_TRUE(m.disable_bias_linear());
  auto original = CheckpointReader::Open(src + "/iter_0000010");
  ASSERT_TRUE(original.ok());
  EXPECT_NE((*original)->Find("output_layer.weight", PARAM), nullptr);
  EXPECT_EQ((*original)->manifest().tensors_size(), (*reader)->manifest().tensors_size());
  for (const TensorInfo& t : (*original)->manifest().tensors()) {
    auto x = (*original)->ReadGlobal(t.name(), t.state());
    auto y = (*reader)->ReadGlobal(t.name(), t.state());
    ASSERT_TRUE(x.ok() && y.ok()) << t.name();
    EXPECT_EQ(*x, *y) << t.name() << " " << StateName(t.state());
  }
  const Layout b{1, 2, 1};
  train::TrainConfig r = testing::TinyLlamaConfig(b, 20);
  r.load = dst;
  testing::RunResult cont = testing::Run(r, b);
  ASSERT_TRUE(cont.status.ok()) << cont.status;
  ASSERT_EQ(cont.losses.size(), 10u);
  for (int i = 0; i < 10; ++i) {
    EXPECT_NEAR(cont.losses[i], ref.losses[10 + i], kTolerance * ref.losses[10 + i]) << i;
  }
}

}  // namespace
}  // namespace loom::checkpoint
