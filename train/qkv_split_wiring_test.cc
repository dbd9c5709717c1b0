// The attention layer's "qkv_split" kernel choice (core/ops/kernel_manifest):
// forced to "fused" (LOOM_KERNEL_IMPL), the layer runs QkvSplitRopeForward /
// QkvSplitRopeBackward and gives the unfused path's output, input gradient
// and parameter gradients bit for bit, on the CPU and on the fake CUDA device
// (//core/ops:fake_device: the device path, CPU kernels doing the math),
// for GQA + RoPE, GQA alone, RoPE alone and a partial rotary dim. GPT-2's
// layout needs no rearrangement and never consults the choice. Through the
// trainer, TP 2 (+SP) and CP 2 (RoPE at each chunk's global positions) give
// the unfused runs' loss curves exactly.

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/ops/kernel_choice.h"
#include "core/ops/testing/fake_device.h"
#include "gtest/gtest.h"
#include "layers/attention.h"
#include "layers/test_util.h"
#include "models/gpt/gpt_config.h"
#include "models/gpt/transformer_block.h"
#include "train/test_util.h"

namespace loom::layers {
namespace {

using core::Shape;
using core::Tensor;

constexpr int64_t kSeq = 9, kBatch = 2;

struct Variant {
  std::string name;
  int64_t groups;  // 0: no GQA
  bool rope;
  float rotary_percent = 1.0f;
};

GptConfig ConfigOf(const Variant& v) {
  GptConfig c;
  c.num_layers = 1;
  c.hidden_size = 48;
  c.num_attention_heads = 6;  // d = 8
  c.group_query_attention = v.groups > 0;
  c.num_query_groups = v.groups > 0 ? v.groups : 6;
  c.position_embedding_type = v.rope ? layers::PositionEmbedding::kRope : layers::PositionEmbedding::kLearnedAbsolute;
  c.rotary_base = 100.0f;
  c.rotary_percent = v.rotary_percent;
  c.add_bias_linear = false;
  c.seq_length = kSeq;
  c.init_method_std = 0.3f;
  c.seed = 23;
  return c;
}

struct Result {
  bool fused = false;
  std::vector<float> out, dx, qkv, qkv_grad, dense_grad;
};

Result RunLayer(const GptConfig& c, const std::string& impl, core::Device device) {
  setenv("LOOM_KERNEL_IMPL", ("qkv_split=" + impl).c_str(), 1);
  core::ops::ForgetKernelChoicesForTesting();
  Result r;
  auto buf = ParamBuffer::Create(BlockParamSpecs(c, 0), 0, 1, c.seed, 1, device);
  EXPECT_TRUE(buf.ok()) << buf.status();
  if (!buf.ok()) return r;
  Param& qkv_w = buf->at("layers.0.attention.qkv.weight");
  Param& dense_w = buf->at("layers.0.attention.dense.weight");
  ParallelAttention attention(&qkv_w, nullptr, &dense_w, nullptr, AttentionOptionsOf(c),
                              TpGroup{}, CpGroup{}, 0);
  const Tensor x = *testing::RandomTensor(Shape{kSeq, kBatch, c.hidden_size}, 5).To(device);
  const Tensor dy = *testing::RandomTensor(Shape{kSeq, kBatch, c.hidden_size}, 6).To(device);
  DropoutStream dropout;  // attention dropout on: the masks must not care
  dropout.attention_p = 0.1f;
  dropout.seed = 3;
  ParallelAttention::Saved saved;
  auto out = attention.Forward(x, dropout, &saved);
  EXPECT_TRUE(out.ok()) << out.status();
  if (!out.ok()) return r;
  auto dx = attention.Backward(dy, dropout, saved);
  EXPECT_TRUE(dx.ok()) << dx.status();
  if (!dx.ok()) return r;
  auto host = [](const Tensor& t) { return testing::ToVector(*t.To(core::Device::CPU())); };
  r.fused = saved.fused_split;
  r.out = host(*out);
  r.dx = host(*dx);
  r.qkv = host(saved.qkv);
  r.qkv_grad = host(qkv_w.grad);
  r.dense_grad = host(dense_w.grad);
  return r;
}

bool Bitwise(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void ExpectFusedMatchesUnfused(core::Device device) {
  for (const Variant& v : {Variant{"gqa_rope", 2, true}, Variant{"gqa", 3, false},
                           Variant{"rope", 0, true}, Variant{"gqa_half_rotary", 2, true, 0.5f},
                           Variant{"gpt2", 0, false}}) {
    const GptConfig c = ConfigOf(v);
    const Result unfused = RunLayer(c, "unfused", device);
    const Result fused = RunLayer(c, "fused", device);
    const bool rearranged = v.groups > 0 || v.rope;
    EXPECT_FALSE(unfused.fused) << v.name;
    EXPECT_EQ(fused.fused, rearranged) << v.name;
    ASSERT_FALSE(unfused.out.empty()) << v.name;
    EXPECT_TRUE(Bitwise(fused.qkv, unfused.qkv)) << v.name;
    EXPECT_TRUE(Bitwise(fused.out, unfused.out)) << v.name;
    EXPECT_TRUE(Bitwise(fused.dx, unfused.dx)) << v.name;
    EXPECT_TRUE(Bitwise(fused.qkv_grad, unfused.qkv_grad)) << v.name;
    EXPECT_TRUE(Bitwise(fused.dense_grad, unfused.dense_grad)) << v.name;
  }
  unsetenv("LOOM_KERNEL_IMPL");
  core::ops::ForgetKernelChoicesForTesting();
}

TEST(QkvSplitWiringTest, FusedIsBitwiseTheUnfusedPathOnTheCpu) {
  ExpectFusedMatchesUnfused(core::Device::CPU());
}

TEST(QkvSplitWiringTest, FusedIsBitwiseTheUnfusedPathOnTheFakeDevice) {
  core::ops::testing::ScopedFakeDevice device;
  ExpectFusedMatchesUnfused(core::Device::CUDA(0));
}

// No proof yet on either device: the reference (unfused) is the default.
TEST(QkvSplitWiringTest, DefaultIsTheUnfusedReference) {
  unsetenv("LOOM_KERNEL_IMPL");
  core::ops::ForgetKernelChoicesForTesting();
  for (const core::DeviceType type : {core::DeviceType::kCPU, core::DeviceType::kCUDA}) {
    auto choice = core::ops::ChooseKernel("qkv_split", type);
    ASSERT_TRUE(choice.ok()) << choice.status();
    EXPECT_EQ(choice->implementation, "unfused");
    EXPECT_EQ(core::ops::KernelImplementations("qkv_split", type),
              (std::vector<std::string>{"unfused", "fused"}));
  }
}

}  // namespace
}  // namespace loom::layers

namespace loom::train {
namespace {

using testing::Layout;

std::vector<double> Losses(const TrainConfig& config, const Layout& l, const std::string& impl) {
  setenv("LOOM_KERNEL_IMPL", ("qkv_split=" + impl).c_str(), 1);
  core::ops::ForgetKernelChoicesForTesting();
  testing::RunResult r = testing::Run(config, l);
  EXPECT_TRUE(r.status.ok()) << l.Describe() << " " << impl << ": " << r.status;
  return r.losses;
}

TEST(QkvSplitWiringTest, TrainingLossesAreTheUnfusedOnesInEveryLayout) {
  constexpr int kIters = 4;
  Layout cp2{1, 1, 1};
  cp2.cp = 2;
  Layout tp2_sp{2, 1, 1};
  tp2_sp.sp = true;
  for (const Layout& l : {Layout{1, 1, 1}, Layout{2, 1, 1}, tp2_sp, cp2}) {
    for (const float rotary_percent : {1.0f, 0.5f}) {
      TrainConfig c = testing::TinyLlamaConfig(l, kIters);
      c.model.rotary_percent = rotary_percent;
      c.attention_dropout = 0.1f;
      const std::vector<double> unfused = Losses(c, l, "unfused");
      const std::vector<double> fused = Losses(c, l, "fused");
      ASSERT_EQ(unfused.size(), static_cast<size_t>(kIters)) << l.Describe();
      EXPECT_EQ(fused, unfused) << l.Describe() << " rotary_percent " << rotary_percent;
    }
  }
  unsetenv("LOOM_KERNEL_IMPL");
  core::ops::ForgetKernelChoicesForTesting();
}

TEST(QkvSplitWiringTest, DeviceTrainingLossesAreTheUnfusedOnes) {
  constexpr int kIters = 4;
  const Layout one{1, 1, 1};
  core::ops::testing::ScopedFakeDevice device;
  TrainConfig c = testing::TinyLlamaConfig(one, kIters);
  c.device = train::DeviceKind::kCuda;
  const std::vector<double> unfused = Losses(c, one, "unfused");
  const std::vector<double> fused = Losses(c, one, "fused");
  ASSERT_EQ(unfused.size(), static_cast<size_t>(kIters));
  EXPECT_EQ(fused, unfused);
  unsetenv("LOOM_KERNEL_IMPL");
  core::ops::ForgetKernelChoicesForTesting();
}

}  // namespace
}  // namespace loom::train
