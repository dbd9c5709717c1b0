// Packed documents on a device, without a GPU: the model on the fake device
// (//core/ops:fake_device: device memory behind poisoned pointers, the CPU
// kernels on host aliases) must give the CPU run's loss and every gradient
// bit for bit. That proves the device plumbing of --reset-position-ids,
// --reset-attention-mask and the loss weights (--eod-mask-loss, --sft): the
// document starts copied to the device once per micro-batch, RoPE's rows
// gathered to [b, s] and rotated per document on the device, the loss
// weights on the loss's device (weighted sums, dlogits), with no host access
// to a device tensor. The GPU's own kernels are proven against the CPU's by
// //core/cuda:packed_attention_test and the device check's packed loss curve.

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/kernel_choice.h"
#include "core/ops/testing/fake_device.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "layers/packed_documents.h"
#include "layers/params.h"
#include "models/gpt/gpt_config.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/test_util.h"

namespace loom::layers {
namespace {

using core::Tensor;

constexpr int64_t kB = 2;
using Docs = std::vector<std::vector<int>>;  // each batch row's document lengths
// 16 positions: a 1-token document in row 0, documents of 9 and 7 in row 1.
const Docs kShort = {{5, 1, 10}, {9, 7}};
// 640 positions: 1280 loss rows, more than the device loss weighing's
// 1024-row chunk (models/gpt/gpt_model.cc), the last chunk partial.
const Docs kLong = {{37, 1, 100, 502}, {640}};

int64_t SeqLen(const Docs& docs) {
  int64_t s = 0;
  for (int n : docs[0]) s += n;
  return s;
}

GptConfig Gpt2(int64_t s = 16) {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = s;
  c.max_position_embeddings = s;
  c.seed = 5;
  return c;
}

GptConfig Llama() {
  GptConfig c = Gpt2();
  c.normalization = Normalization::kRMSNorm;
  c.position_embedding_type = PositionEmbedding::kRope;
  c.swiglu = true;
  c.ffn_hidden_size = 64;
  c.group_query_attention = true;
  c.num_query_groups = 2;
  c.add_bias_linear = false;
  return c;
}

// Position ids, document starts and (with `loss_mask`) the masked mean's
// weights: no loss at each document's last token.
std::shared_ptr<const PackedDocuments> Documents(const Docs& docs, bool loss_mask) {
  const int64_t s = SeqLen(docs);
  auto d = std::make_shared<PackedDocuments>();
  d->seq_len = s;
  d->batch = kB;
  int kept = 0;
  for (const std::vector<int>& row : docs) {
    int first = 0;
    for (int n : row) {
      for (int k = 0; k < n; ++k) {
        d->position.push_back(k);
        d->doc_start.push_back(first);
        const bool last = k == n - 1;
        if (loss_mask) d->loss_weight.push_back(last ? 0.0f : 1.0f);
        kept += last ? 0 : 1;
      }
      first += n;
    }
  }
  for (float& w : d->loss_weight) w *= static_cast<float>(s * kB) / kept;
  return d;
}

std::vector<float> Host(const Tensor& t) {
  if (!t.defined()) return {};
  absl::StatusOr<Tensor> h = t.device().is_cpu() ? t : t.To(core::Device::CPU());
  EXPECT_TRUE(h.ok()) << h.status();
  return testing::ToVector(*h);
}

// The loss (and its f32 rounding's remainder) and every gradient of one step.
absl::Status Step(GptConfig config, core::Device device, const Docs& docs, bool loss_mask,
                  std::vector<std::vector<float>>* out) {
  const int64_t s = SeqLen(docs);
  config.device = device;
  config.compute_dtype = core::DType::kF32;
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<GptModel> model, GptModel::Create(config, TpGroup{}));
  LOOM_RETURN_IF_ERROR(model->params().ZeroGrads());
  const Tensor ids = testing::RandomIds(s, kB, config.vocab_size, 100);
  const Tensor targets = testing::RandomIds(s, kB, config.vocab_size, 200);
  DropoutStream dropout = testing::StepDropout(0);
  dropout.documents = Documents(docs, loss_mask);
  GptModel::Saved saved;
  double loss = 0;
  LOOM_RETURN_IF_ERROR(model->Forward(0, ids, targets, dropout, &saved, &loss).status());
  LOOM_RETURN_IF_ERROR(model->Backward(0, Tensor(), 1.0f, dropout, saved).status());
  *out = {{static_cast<float>(loss), static_cast<float>(loss - static_cast<float>(loss))}};
  for (Param& p : model->params().params()) out->push_back(Host(p.grad));
  return absl::OkStatus();
}

class PackedDocumentsDeviceTest : public ::testing::Test {
 protected:
  // Both devices run the references (the CPU's attention default is flash,
  // the GPU's the s x s kernel): the same kernels, so the same bits.
  void SetUp() override {
    setenv("LOOM_REFERENCE_KERNELS", "1", 1);
    core::ops::ForgetKernelChoicesForTesting();
  }
  void TearDown() override {
    unsetenv("LOOM_REFERENCE_KERNELS");
    core::ops::ForgetKernelChoicesForTesting();
  }
};

// Both devices' loss, every gradient, bit for bit.
void ExpectFakeDeviceBitwise(const GptConfig& config, const Docs& docs, bool loss_mask) {
  const std::string what = absl::StrCat(config.swiglu ? "llama" : "gpt2", " s ", SeqLen(docs),
                                        loss_mask ? " with loss mask" : "");
  std::vector<std::vector<float>> want, got;
  absl::Status s = Step(config, core::Device::CPU(), docs, loss_mask, &want);
  ASSERT_TRUE(s.ok()) << what << ": " << s;
  {
    core::ops::testing::ScopedFakeDevice fake;
    const long calls = core::ops::testing::ScopedFakeDevice::kernel_calls();
    s = Step(config, core::Device::CUDA(0), docs, loss_mask, &got);
    ASSERT_TRUE(s.ok()) << what << ": " << s;
    EXPECT_GT(core::ops::testing::ScopedFakeDevice::kernel_calls(), calls + 20) << what;
  }
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size()) << what << " tensor " << i;
    for (size_t k = 0; k < got[i].size(); ++k) {
      ASSERT_EQ(got[i][k], want[i][k]) << what << " tensor " << i << " element " << k;
    }
  }
}

TEST_F(PackedDocumentsDeviceTest, FakeDeviceGivesTheCpuRunBitwise) {
  for (const GptConfig& config : {Gpt2(), Llama()}) {
    for (bool loss_mask : {false, true}) ExpectFakeDeviceBitwise(config, kShort, loss_mask);
  }
}

TEST_F(PackedDocumentsDeviceTest, LongRowsWeighTheLossInChunksBitwise) {
  ExpectFakeDeviceBitwise(Gpt2(SeqLen(kLong)), kLong, true);
}

// The loss mask and the documents change the run: without them the loss
// differs (so the comparison above sees them at work on both devices).
TEST_F(PackedDocumentsDeviceTest, TheDocumentsAndTheMaskChangeTheLoss) {
  std::vector<std::vector<float>> masked, unmasked;
  ASSERT_TRUE(Step(Llama(), core::Device::CPU(), kShort, true, &masked).ok());
  ASSERT_TRUE(Step(Llama(), core::Device::CPU(), kShort, false, &unmasked).ok());
  EXPECT_NE(masked[0][0], unmasked[0][0]);
}

}  // namespace
}  // namespace loom::layers
