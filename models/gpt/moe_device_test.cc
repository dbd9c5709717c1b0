// The MoE layer on the fake device (//core/ops:fake_device: device memory
// behind poisoned pointers, so host code touching a device tensor crashes;
// the CPU kernels run on host aliases) gives the host path's output, input
// gradient, parameter gradients and losses bit for bit: routing, dispatch,
// combine and the router's backward all run through core/ops on the tensors'
// device, and only the counts come to the host.

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/ops/testing/fake_device.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "models/gpt/moe_block.h"
#include "models/gpt/test_util.h"

namespace loom::layers {
namespace {

using core::Shape;
using core::Tensor;

constexpr int64_t kSeq = 7, kBatch = 3, kHidden = 16;  // 21 tokens: ragged

GptConfig Config() {
  GptConfig c;
  c.num_layers = 1;
  c.hidden_size = kHidden;
  c.num_attention_heads = 2;
  c.seq_length = kSeq;
  c.ffn_hidden_size = 24;
  c.add_bias_linear = false;
  c.num_experts = 6;
  c.moe_router_topk = 3;
  c.moe_aux_loss_coeff = 0.01f;
  c.moe_z_loss_coeff = 0.001f;
  c.init_method_std = 0.2f;
  c.seed = 9;
  return c;
}

std::vector<float> HostVector(const Tensor& t) {
  if (t.device().is_cpu()) return testing::ToVector(t);
  absl::StatusOr<Tensor> h = t.To(core::Device::CPU());
  EXPECT_TRUE(h.ok()) << h.status();
  return h.ok() ? testing::ToVector(*h) : std::vector<float>{};
}

struct Result {
  std::vector<float> y, dx;
  std::map<std::string, std::vector<float>> grads;
  std::vector<int64_t> tokens_per_expert, expert_rows;
  int64_t dropped = 0;
  double aux_loss = 0, z_loss = 0;
};

// One forward and backward of the layer with its parameters and tensors on
// `device`; `zero_router`: every logit ties, so experts 0..K-1 get every
// token and the others none.
absl::StatusOr<Result> Run(const GptConfig& c, core::Device device, bool zero_router) {
  LOOM_ASSIGN_OR_RETURN(ParamBuffer params,
                        ParamBuffer::Create(BlockParamSpecs(c, 0, {}), 0, 1, c.seed, 1, device));
  Param& router = params.at("layers.0.mlp.router.weight");
  if (zero_router) LOOM_RETURN_IF_ERROR(core::ops::Zero(&router.value));
  LOOM_RETURN_IF_ERROR(params.ZeroGrads());
  MoeMlp moe = MoeMlpForLayer(&params, c, 0, TpGroup{}, EpGroup{});
  LOOM_ASSIGN_OR_RETURN(Tensor x,
                        testing::RandomTensor(Shape{kSeq, kBatch, kHidden}, 3).To(device));
  LOOM_ASSIGN_OR_RETURN(Tensor dy,
                        testing::RandomTensor(Shape{kSeq, kBatch, kHidden}, 4).To(device));
  MoeMlp::Saved saved;
  LOOM_ASSIGN_OR_RETURN(Tensor y, moe.Forward(x, &saved));
  LOOM_ASSIGN_OR_RETURN(Tensor dx, moe.Backward(dy, 0.75f, saved));
  Result r;
  r.y = HostVector(y);
  r.dx = HostVector(dx);
  for (const Param& p : params.params()) r.grads[p.spec->name] = HostVector(p.grad);
  r.tokens_per_expert = saved.routing.tokens_per_expert;
  r.expert_rows = saved.routing.expert_rows;
  r.dropped = saved.routing.dropped;
  r.aux_loss = saved.routing.aux_loss;
  r.z_loss = saved.routing.z_loss;
  if (!device.is_cpu()) {
    EXPECT_FALSE(y.device().is_cpu());
    EXPECT_FALSE(saved.routing.row_token_t.device().is_cpu());
    EXPECT_TRUE(saved.routing.expert.empty()) << "the per-token decisions stay on the device";
  }
  return r;
}

void ExpectDeviceEqualsHost(const GptConfig& c, bool zero_router) {
  absl::StatusOr<Result> want = Run(c, core::Device::CPU(), zero_router);
  ASSERT_TRUE(want.ok()) << want.status();
  core::ops::testing::ScopedFakeDevice fake;
  const long calls = core::ops::testing::ScopedFakeDevice::kernel_calls();
  absl::StatusOr<Result> got = Run(c, core::Device::CUDA(0), zero_router);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_GT(core::ops::testing::ScopedFakeDevice::kernel_calls(), calls + 10);
  EXPECT_EQ(got->y, want->y);
  EXPECT_EQ(got->dx, want->dx);
  EXPECT_EQ(got->grads, want->grads);
  EXPECT_EQ(got->tokens_per_expert, want->tokens_per_expert);
  EXPECT_EQ(got->expert_rows, want->expert_rows);
  EXPECT_EQ(got->dropped, want->dropped);
  EXPECT_EQ(got->aux_loss, want->aux_loss);
  EXPECT_EQ(got->z_loss, want->z_loss);
}

TEST(MoeDeviceTest, GeluExpertsMatchTheHostBitwise) { ExpectDeviceEqualsHost(Config(), false); }

TEST(MoeDeviceTest, SwigluExpertsMatchTheHostBitwise) {
  GptConfig c = Config();
  c.swiglu = true;
  c.moe_router_topk = 2;
  ExpectDeviceEqualsHost(c, false);
}

TEST(MoeDeviceTest, CapacityWithPaddingMatchesTheHostBitwise) {
  GptConfig c = Config();
  c.moe_expert_capacity_factor = 0.5f;
  c.moe_pad_expert_input_to_capacity = true;
  ExpectDeviceEqualsHost(c, false);
  c.moe_pad_expert_input_to_capacity = false;
  ExpectDeviceEqualsHost(c, false);
}

// Experts K..E-1 get no token (all logits tie: the lower experts win).
TEST(MoeDeviceTest, ExpertsWithoutTokensMatchTheHostBitwise) {
  ExpectDeviceEqualsHost(Config(), true);
}

// What cannot run is refused with the reason: the CPU's kernels compute in
// f32 only, and the input must match the weights' device and dtype.
TEST(MoeDeviceTest, RefusesWhatCannotRun) {
  const GptConfig c = Config();
  auto params = ParamBuffer::Create(BlockParamSpecs(c, 0, {}), 0, 1, c.seed);
  ASSERT_TRUE(params.ok());
  MoeMlp moe = MoeMlpForLayer(&*params, c, 0, TpGroup{}, EpGroup{});
  MoeMlp::Saved saved;
  auto bf16 = Tensor::Zeros(Shape{kSeq, kBatch, kHidden}, core::DType::kBF16);
  ASSERT_TRUE(bf16.ok());
  absl::StatusOr<Tensor> y = moe.Forward(*bf16, &saved);
  ASSERT_FALSE(y.ok());
  EXPECT_NE(y.status().message().find("expected [s, b, h] in f32"), std::string::npos)
      << y.status();
  core::ops::testing::ScopedFakeDevice fake;
  auto on_device = testing::RandomTensor(Shape{kSeq, kBatch, kHidden}, 1).To(core::Device::CUDA(0));
  ASSERT_TRUE(on_device.ok());
  y = moe.Forward(*on_device, &saved);
  ASSERT_FALSE(y.ok());
  EXPECT_NE(y.status().message().find("does not match the router weight"), std::string::npos)
      << y.status();
}

}  // namespace
}  // namespace loom::layers
