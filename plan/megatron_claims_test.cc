// The planner against what Megatron-LM's README states in text
// (plan/testdata/megatron_readme.md: the per-row table is an image, not
// copied). For each row of megatron_claims.txt the planner runs with
// Megatron's settings (bf16, distributed optimizer, overlapped DP and TP
// communication) on the H100 description and its fastest fitting layout's MFU
// is printed next to the published one. Checked: the strong-scaling loss of
// MFU from 96 to 4608 GPUs (published 47% -> 42%) within ±15% relative. Not
// checked: the absolute MFU, which the assumed GEMM-efficiency curve of
// h100_dgx.textproto overestimates (docs/PLANNER.md, "Calibration").
// Attention memory: Megatron runs fused attention (Transformer Engine over
// cuDNN), which keeps one log-sum-exp per row; so does Loom's cuDNN
// implementation, which this comparison therefore assumes
// (LOOM_KERNEL_IMPL=attention=cudnn below). Without it the planner counts
// what Loom runs on CUDA until a device run proves cuDNN there: the s x s
// kernel's probabilities (core/ops/kernel_manifest.textproto).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "plan/hardware.h"
#include "plan/report.h"

namespace loom::plan {
namespace {

const bool kFusedAttentionAsMegatron = [] {
  setenv("LOOM_KERNEL_IMPL", "attention=cudnn", 1);
  return true;
}();

struct Claim {
  std::string name, hardware;
  int64_t layers, hidden, heads, seq, vocab, batch;
  int gpus;
  double mfu;
};

std::vector<Claim> ReadClaims() {
  std::ifstream in("plan/testdata/megatron_claims.txt");
  EXPECT_TRUE(in.good());
  std::vector<Claim> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream row(line);
    Claim c;
    row >> c.name >> c.layers >> c.hidden >> c.heads >> c.seq >> c.vocab >> c.batch >> c.gpus >>
        c.mfu >> c.hardware;
    EXPECT_FALSE(row.fail()) << line;
    out.push_back(c);
  }
  return out;
}

double BestMfu(const Claim& claim, std::string* layout) {
  absl::StatusOr<Hardware> hw = LoadHardware("plan/testdata/" + claim.hardware + ".textproto");
  EXPECT_TRUE(hw.ok()) << hw.status();
  train::TrainConfig c;
  c.model.num_layers = claim.layers;
  c.model.hidden_size = claim.hidden;
  c.model.num_attention_heads = claim.heads;
  c.model.seq_length = claim.seq;
  c.model.vocab_size = claim.vocab;
  c.global_batch_size = claim.batch;
  c.device = train::DeviceKind::kCuda;
  c.bf16 = true;
  c.optimizer.distributed = true;
  c.overlap_grad_reduce = true;
  c.overlap_param_gather = true;
  SearchOptions search;
  search.gpus = claim.gpus;
  search.devices_per_node = hw->devices_per_node();
  search.max_micro_batch = 1;
  search.try_recompute = false;
  TimeOptions time;
  time.tp_comm_overlap = true;
  absl::StatusOr<std::vector<Planned>> plans = PlanAll(c, *hw, search, time);
  EXPECT_TRUE(plans.ok()) << plans.status();
  EXPECT_FALSE(plans->empty());
  EXPECT_TRUE(plans->front().fits);
  *layout = DescribeLayout(plans->front().config);
  return plans->front().time.mfu;
}

TEST(MegatronClaimsTest, StrongScalingOfGpt3OnH100) {
  ASSERT_TRUE(kFusedAttentionAsMegatron);
  std::map<std::string, double> predicted, published;
  std::printf("| claim | GPUs | published MFU | predicted MFU (best layout) | relative |\n"
              "|---|---|---|---|---|\n");
  for (const Claim& c : ReadClaims()) {
    std::string layout;
    const double mfu = BestMfu(c, &layout);
    predicted[c.name] = mfu;
    published[c.name] = c.mfu;
    std::printf("| %s | %d | %.1f%% | %.1f%% (%s) | %+.0f%% |\n", c.name.c_str(), c.gpus,
                100 * c.mfu, 100 * mfu, layout.c_str(), 100 * (mfu / c.mfu - 1));
  }
  ASSERT_EQ(predicted.size(), 2u);
  const double published_ratio = published["gpt3-175b-4608"] / published["gpt3-175b-96"];
  const double predicted_ratio = predicted["gpt3-175b-4608"] / predicted["gpt3-175b-96"];
  std::printf("MFU at 4608 / at 96 GPUs: published %.3f, predicted %.3f (%+.0f%%)\n",
              published_ratio, predicted_ratio, 100 * (predicted_ratio / published_ratio - 1));
  EXPECT_LT(predicted["gpt3-175b-4608"], predicted["gpt3-175b-96"]);
  EXPECT_NEAR(predicted_ratio / published_ratio, 1.0, 0.15);
}

}  // namespace
}  // namespace loom::plan
