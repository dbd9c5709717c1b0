// The "residual_norm" kernel choice wired through TransformerBlock: with
// LOOM_KERNEL_IMPL=residual_norm=fused the block runs ResidualNormForward /
// ResidualNormBackward (dropout + residual add + ln2 in one op; ln2's and
// ln1's backward with the residual gradient and the attention branch's
// dropout), and through GptModel (losses, every gradient, activation bytes,
// with full recomputation too). Their CPU implementations are the unfused kernels composed, so
// the block's output, input gradient, every parameter gradient and the saved
// norm tensors (meaning and size: activation memory) must equal the unfused
// path bitwise: GPT-2 (LayerNorm, biases) and Llama (RMSNorm, SwiGLU, RoPE,
// GQA) blocks with hidden dropout 0.1, on the CPU, on the fake device, under
// TP 2 with sequence parallelism (ranks as threads; masks at global indices)
// and under CP 2 (two row runs per rank).

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/enum_names.h"
#include "core/ops/kernel_choice.h"
#include "core/ops/testing/fake_device.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "layers/params.h"
#include "models/gpt/gpt_config.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/test_util.h"
#include "models/gpt/transformer_block.h"

namespace loom::layers {
namespace {

using core::Shape;
using core::Tensor;
using testing::RandomTensor;
using testing::ToVector;

constexpr int64_t kS = 8, kB = 2;

GptConfig Gpt2() {
  GptConfig c;
  c.num_layers = 1;
  c.hidden_size = 40;  // not a multiple of 16: the kernels' tails
  c.num_attention_heads = 4;
  c.seq_length = kS;
  c.seed = 3;
  return c;
}

GptConfig Llama() {
  GptConfig c = Gpt2();
  c.hidden_size = 48;
  c.normalization = layers::Normalization::kRMSNorm;
  c.layernorm_epsilon = 1e-6f;
  c.position_embedding_type = layers::PositionEmbedding::kRope;
  c.swiglu = true;
  c.ffn_hidden_size = 96;
  c.group_query_attention = true;
  c.num_query_groups = 2;
  c.add_bias_linear = false;
  return c;
}

DropoutStream Dropout() {
  DropoutStream d;
  d.hidden_p = 0.1f;
  d.attention_p = 0.0f;
  d.seed = 11;
  d.stream = 77;
  return d;
}

using StepOut = std::vector<std::vector<float>>;

std::vector<float> Host(const Tensor& t) {
  if (!t.defined()) return {};
  if (t.device().is_cpu()) return ToVector(t);
  absl::StatusOr<Tensor> h = t.To(core::Device::CPU());
  EXPECT_TRUE(h.ok()) << h.status();
  return ToVector(*h);
}

// One block forward and backward on this rank's rows of a [kS, kB, h]
// activation (SP: its block of rows; CP: its two chunks).
absl::Status Step(const GptConfig& config, TpGroup tp, CpGroup cp, core::Device device,
                  StepOut* out) {
  LOOM_ASSIGN_OR_RETURN(ParamBuffer buf, ParamBuffer::Create(BlockParamSpecs(config, 0),
                                                             tp.rank(), tp.size(), 5, 1, device));
  TransformerBlock block(&buf, config, 0, tp, cp);
  const int64_t h = config.hidden_size;
  Tensor x_full = RandomTensor(Shape{kS, kB, h}, 1), dy_full = RandomTensor(Shape{kS, kB, h}, 2);
  std::vector<RowRun> runs;
  if (cp.parallel()) {
    runs = GlobalRowRuns(cp.Layout(kS), 0, kS / cp.size());
  } else if (tp.sequence_parallel && tp.size() > 1) {
    const int64_t n = kS / tp.size();
    runs = {RowRun{0, n, tp.rank() * n}};
  } else {
    runs = {RowRun{0, kS, 0}};
  }
  int64_t local = 0;
  for (const RowRun& r : runs) local += r.count;
  LOOM_ASSIGN_OR_RETURN(Tensor x, Tensor::Empty(Shape{local, kB, h}, core::DType::kF32));
  LOOM_ASSIGN_OR_RETURN(Tensor dy, Tensor::Empty(Shape{local, kB, h}, core::DType::kF32));
  for (const RowRun& r : runs) {
    for (int64_t i = 0; i < r.count * kB * h; ++i) {
      x.data<float>()[r.local_first * kB * h + i] = x_full.data<float>()[r.global_first * kB * h + i];
      dy.data<float>()[r.local_first * kB * h + i] = dy_full.data<float>()[r.global_first * kB * h + i];
    }
  }
  LOOM_ASSIGN_OR_RETURN(x, x.To(device));
  LOOM_ASSIGN_OR_RETURN(dy, dy.To(device));
  TransformerBlock::Saved saved;
  LOOM_ASSIGN_OR_RETURN(Tensor y, block.Forward(x, Dropout(), &saved));
  LOOM_ASSIGN_OR_RETURN(Tensor dx, block.Backward(dy, Dropout(), saved));
  *out = {Host(y), Host(dx), Host(saved.ln2.input), Host(saved.ln2.mean), Host(saved.ln2.rstd),
          Host(saved.ln1.input)};
  for (Param& p : buf.params()) out->push_back(Host(p.grad));
  return absl::OkStatus();
}


// A whole model's step (loss, every parameter gradient, the activation bytes
// it keeps) on this rank, 2 layers, hidden dropout 0.1; "full": full
// recomputation (the blocks rerun in the backward).
absl::Status ModelStep(GptConfig config, TpGroup tp, core::Device device, bool full,
                       StepOut* out) {
  config.num_layers = 2;
  config.device = device;
  if (full) {
    config.recompute_granularity = RecomputeGranularity::kFull;
    config.recompute_method = RecomputeMethod::kUniform;
    config.recompute_num_layers = 1;
  }
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<GptModel> model, GptModel::Create(config, tp));
  LOOM_RETURN_IF_ERROR(model->params().ZeroGrads());
  const Tensor ids = testing::RandomIds(config.seq_length, kB, config.vocab_size, 100);
  const Tensor targets = testing::RandomIds(config.seq_length, kB, config.vocab_size, 200);
  GptModel::Saved saved;
  double loss = 0;
  LOOM_RETURN_IF_ERROR(model->Forward(0, ids, targets, testing::StepDropout(0), &saved, &loss)
                           .status());
  LOOM_RETURN_IF_ERROR(
      model->Backward(0, Tensor(), 1.0f, testing::StepDropout(0), saved).status());
  *out = {{static_cast<float>(loss), static_cast<float>(loss - static_cast<float>(loss))},
          {static_cast<float>(saved.ActivationBytes())}};
  for (Param& p : model->params().params()) out->push_back(Host(p.grad));
  return absl::OkStatus();
}

class ResidualNormWiringTest : public ::testing::Test {
 protected:
  void TearDown() override { Force(nullptr); }
  static void Force(const char* impl) {
    if (impl == nullptr) {
      unsetenv("LOOM_KERNEL_IMPL");
    } else {
      setenv("LOOM_KERNEL_IMPL", impl, 1);
    }
    core::ops::ForgetKernelChoicesForTesting();
  }
  static std::string Chosen(core::DeviceType d) {
    absl::StatusOr<core::ops::KernelChoice> c = core::ops::ChooseKernel("residual_norm", d);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? c->implementation : "";
  }
};

void ExpectBitwise(const StepOut& got, const StepOut& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size()) << what << " output " << i;
    int bad = 0;
    for (size_t j = 0; j < got[i].size() && bad < 3; ++j) {
      if (got[i][j] != want[i][j]) {
        ++bad;
        ADD_FAILURE() << what << " output " << i << "[" << j << "]: " << got[i][j] << " vs "
                      << want[i][j];
      }
    }
  }
}

TEST_F(ResidualNormWiringTest, ReferenceByDefaultOnBothDevices) {
  Force(nullptr);
  EXPECT_EQ(Chosen(core::DeviceType::kCPU), "unfused");
  EXPECT_EQ(Chosen(core::DeviceType::kCUDA), "unfused");
  Force("residual_norm=fused");
  EXPECT_EQ(Chosen(core::DeviceType::kCPU), "fused");
  EXPECT_EQ(Chosen(core::DeviceType::kCUDA), "fused");
}

TEST_F(ResidualNormWiringTest, CpuFusedEqualsUnfusedBitwise) {
  for (const GptConfig& config : {Gpt2(), Llama()}) {
    StepOut want, got;
    Force(nullptr);
    absl::Status s = Step(config, TpGroup{}, CpGroup{}, core::Device::CPU(), &want);
    ASSERT_TRUE(s.ok()) << s;
    Force("residual_norm=fused");
    s = Step(config, TpGroup{}, CpGroup{}, core::Device::CPU(), &got);
    ASSERT_TRUE(s.ok()) << s;
    ExpectBitwise(got, want, "cpu " + std::string(core::EnumName(config.normalization)));
  }
}

// On the fake device against its own unfused path (the device's attention
// default differs from the CPU's: sxs, not flash).
TEST_F(ResidualNormWiringTest, FakeDeviceFusedEqualsUnfusedBitwise) {
  for (const GptConfig& config : {Gpt2(), Llama()}) {
    StepOut want, got;
    core::ops::testing::ScopedFakeDevice device;
    Force(nullptr);
    absl::Status s = Step(config, TpGroup{}, CpGroup{}, core::Device::CUDA(0), &want);
    ASSERT_TRUE(s.ok()) << s;
    Force("residual_norm=fused");
    const long calls = core::ops::testing::ScopedFakeDevice::kernel_calls();
    s = Step(config, TpGroup{}, CpGroup{}, core::Device::CUDA(0), &got);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_GT(core::ops::testing::ScopedFakeDevice::kernel_calls(), calls);
    ExpectBitwise(got, want, "fake cuda " + std::string(core::EnumName(config.normalization)));
  }
}

TEST_F(ResidualNormWiringTest, TensorSequenceAndContextParallelFusedEqualsUnfusedBitwise) {
  for (const GptConfig& config : {Gpt2(), Llama()}) {
    for (const char* layout : {"tp2", "tp2_sp", "cp2"}) {
      const bool cp = std::string(layout) == "cp2", sp = std::string(layout) == "tp2_sp";
      std::vector<StepOut> want(2), got(2);
      for (int pass = 0; pass < 2; ++pass) {
        Force(pass == 0 ? nullptr : "residual_norm=fused");
        std::vector<StepOut>& runs = pass == 0 ? want : got;
        absl::Status s = testing::RunRanks(2, [&](int r, comm::Communicator* c) -> absl::Status {
          return cp ? Step(config, TpGroup{}, CpGroup{c}, core::Device::CPU(), &runs[r])
                    : Step(config, TpGroup{c, sp}, CpGroup{}, core::Device::CPU(), &runs[r]);
        });
        ASSERT_TRUE(s.ok()) << s;
      }
      for (int r = 0; r < 2; ++r) {
        ExpectBitwise(got[r], want[r],
                      absl::StrCat(config.normalization, " ", layout, " rank ", r));
      }
    }
  }
}

TEST_F(ResidualNormWiringTest, ModelLossesAndGradientsEqualUnfusedBitwise) {
  for (const GptConfig& config : {Gpt2(), Llama()}) {
    for (bool full : {false, true}) {
      for (bool fake : {false, true}) {
        StepOut want, got;
        std::optional<core::ops::testing::ScopedFakeDevice> device;
        if (fake) device.emplace();
        const core::Device where = fake ? core::Device::CUDA(0) : core::Device::CPU();
        Force(nullptr);
        absl::Status s = ModelStep(config, TpGroup{}, where, full, &want);
        ASSERT_TRUE(s.ok()) << s;
        Force("residual_norm=fused");
        s = ModelStep(config, TpGroup{}, where, full, &got);
        ASSERT_TRUE(s.ok()) << s;
        ExpectBitwise(got, want, absl::StrCat("model ", config.normalization, full ? " full" : "",
                                              fake ? " fake cuda" : " cpu"));
      }
    }
    // TP 2 with sequence parallelism, ranks as threads.
    std::vector<StepOut> want(2), got(2);
    for (int pass = 0; pass < 2; ++pass) {
      Force(pass == 0 ? nullptr : "residual_norm=fused");
      std::vector<StepOut>& runs = pass == 0 ? want : got;
      absl::Status s = testing::RunRanks(2, [&](int r, comm::Communicator* c) -> absl::Status {
        return ModelStep(config, TpGroup{c, true}, core::Device::CPU(), false, &runs[r]);
      });
      ASSERT_TRUE(s.ok()) << s;
    }
    for (int r = 0; r < 2; ++r) {
      ExpectBitwise(got[r], want[r], absl::StrCat("model ", config.normalization, " tp2 sp rank ", r));
    }
  }
}

}  // namespace
}  // namespace loom::layers
