// Activation recomputation (--recompute-granularity, --recompute-method,
// --recompute-num-layers) leaves training bit-identical: the same model and
// data trained for 10 iterations with hidden and attention dropout on give
// the same loss curve and the same final parameters, to the bit, as without
// recomputation, for selective, full uniform and full block, in the layouts
// TP 1/2 (with SP) x PP 1/2 (1F1B and interleaved) x DP 1/2, through the
// trainer and the pipeline executor (several micro-batches in flight, each
// with its own dropout stream). Also: the flags parse, and Finalize rejects
// inconsistent ones naming the flags.
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/reflection.h"
#include "absl/synchronization/mutex.h"
#include "comm/launch/flags.h"
#include "config/config.h"
#include "core/enum_names.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt_model.h"
#include "train/gpt_flags.h"
#include "train/test_util.h"

namespace loom::train {
namespace {

constexpr int kIters = 10;

using testing::Layout;

struct Recompute {
  std::string granularity, method;
  int64_t n = 0;
  std::string Name() const {
    if (granularity.empty()) return "none";
    if (method.empty()) return granularity;
    return granularity + " " + method + " " + std::to_string(n);
  }
  void Apply(layers::GptConfig* c) const {
    c->recompute_granularity = core::FindEnum<layers::RecomputeGranularity>(granularity).value();
    c->recompute_method = core::FindEnum<layers::RecomputeMethod>(method).value();
    c->recompute_num_layers = n;
  }
};

struct Curve {
  std::vector<double> losses;
  std::vector<std::vector<float>> params;  // per global rank: its flat f32 parameters at the end
};

Curve Train(const Layout& l, const Recompute& r) {
  TrainConfig c = testing::TinyConfig(l, kIters);
  c.attention_dropout = 0.1f;  // hidden dropout is on already
  r.Apply(&c.model);
  Curve curve;
  curve.params.resize(l.world());
  absl::Mutex mu;
  testing::RunResult result = testing::Run(
      c, l,
      [&](int, Trainer& t) {  // the model runs the setting (what it does: //models/gpt:recompute_test)
        const layers::GptConfig& m = dynamic_cast<layers::GptModel&>(t.model()).config();
        EXPECT_EQ(core::EnumName(m.recompute_granularity), r.granularity);
        EXPECT_EQ(core::EnumName(m.recompute_method), r.method);
        EXPECT_EQ(m.recompute_num_layers, r.n);
      },
      [&](int rank, Trainer& t) {
        const core::Tensor& flat = t.model().params().flat_values();
        std::vector<float> v(flat.numel());
        std::memcpy(v.data(), flat.data<float>(), v.size() * sizeof(float));
        absl::MutexLock lock(&mu);
        curve.params[rank] = std::move(v);
      });
  EXPECT_TRUE(result.status.ok()) << l.Describe() << " " << r.Name() << ": " << result.status;
  curve.losses = result.losses;
  return curve;
}

TEST(RecomputeTrainingTest, LossCurvesAreBitIdenticalInEveryLayout) {
  const std::vector<Layout> layouts = {
      {1, 1, 1},
      {2, 1, 1, 0, true},                          // TP 2 + SP
      {1, 2, 1},                                   // PP 2, 1F1B
      {1, 2, 1, 1, false, false, "interleaved"},  // PP 2 x 2 chunks of one layer
      {2, 2, 1, 0, true},                          // TP 2 + SP x PP 2
      {1, 2, 2, 0, false, true, "gpipe", true, true},  // GPipe, DP 2, ZeRO-1, both overlaps
      // ZeRO-2: a recomputed unit's bucket is bound before its recomputation
      testing::OptimGrads({1, 2, 2, 0, false, false, "1f1b", true}),
  };
  for (const Layout& l : layouts) {
    const int64_t per_chunk = 4 / (l.pp * (l.vp_layers ? 2 : 1));  // TinyConfig: 4 layers
    const Curve ref = Train(l, {});
    ASSERT_EQ(ref.losses.size(), static_cast<size_t>(kIters)) << l.Describe();
    std::vector<Recompute> settings = {{"selective", "", 0}, {"full", "uniform", 1}};
    if (per_chunk > 1) {
      settings.push_back({"full", "uniform", per_chunk});
      settings.push_back({"full", "block", 1});
    }
    for (const Recompute& r : settings) {
      const Curve got = Train(l, r);
      ASSERT_EQ(got.losses.size(), ref.losses.size()) << l.Describe() << " " << r.Name();
      for (int i = 0; i < kIters; ++i) {
        EXPECT_EQ(std::memcmp(&got.losses[i], &ref.losses[i], sizeof(double)), 0)
            << l.Describe() << ", " << r.Name() << ", iteration " << i + 1 << ": "
            << got.losses[i] << " vs " << ref.losses[i];
      }
      for (size_t rank = 0; rank < ref.params.size(); ++rank) {
        ASSERT_EQ(got.params[rank].size(), ref.params[rank].size());
        EXPECT_EQ(std::memcmp(got.params[rank].data(), ref.params[rank].data(),
                              ref.params[rank].size() * sizeof(float)),
                  0)
            << l.Describe() << ", " << r.Name() << ": final parameters of rank " << rank;
      }
    }
  }
}

TEST(RecomputeFlagsTest, FlagsParse) {
  absl::FlagSaver saver;
  std::vector<std::string> args = {"gpt", "--recompute-granularity=full",
                                   "--recompute-method", "block", "--recompute_num_layers=3"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  comm::launch::ParseFlags(static_cast<int>(argv.size()), argv.data(), "recompute_test");
  const TrainConfig c = ConfigFromFlags();
  EXPECT_EQ(c.model.recompute_granularity, layers::RecomputeGranularity::kFull);
  EXPECT_EQ(c.model.recompute_method, layers::RecomputeMethod::kBlock);
  EXPECT_EQ(c.model.recompute_num_layers, 3);
  const TrainConfig d;  // the default: no recomputation
  EXPECT_EQ(d.model.recompute_granularity, layers::RecomputeGranularity::kNone);
  EXPECT_EQ(d.model.recompute_method, layers::RecomputeMethod::kNone);
  EXPECT_EQ(d.model.recompute_num_layers, 0);
}

void ExpectError(const Recompute& r, int pp, int vp_layers, const std::vector<std::string>& parts) {
  TrainConfig c;
  c.model.num_layers = 8;
  c.pipeline_model_parallel_size = pp;
  c.num_layers_per_virtual_pipeline_stage = vp_layers;
  r.Apply(&c.model);
  c.global_batch_size = 16;
  c.micro_batch_size = 1;
  absl::Status s = Finalize(&c, pp);
  ASSERT_FALSE(s.ok()) << r.Name();
  for (const std::string& p : parts) {
    EXPECT_NE(s.message().find(p), std::string::npos) << s.message();
  }
}

TEST(RecomputeFlagsTest, FinalizeRejectsInconsistentFlags) {
  ExpectError({"", "uniform", 0}, 1, 0,
              {"--recompute-method=uniform", "needs --recompute-granularity=full"});
  ExpectError({"selective", "uniform", 1}, 1, 0, {"needs --recompute-granularity=full"});
  ExpectError({"selective", "", 2}, 1, 0, {"--recompute-num-layers (2)", "selective"});
  ExpectError({"full", "", 2}, 1, 0, {"--recompute-granularity=full needs --recompute-method"});
  ExpectError({"full", "uniform", 0}, 1, 0, {"--recompute-num-layers (0)", "[1, 8]"});
  // 8 layers, PP 2: 4 a stage; interleaved with 1 layer per virtual stage: 1 a chunk.
  ExpectError({"full", "uniform", 5}, 2, 0, {"--recompute-num-layers (5)", "[1, 4]"});
  ExpectError({"full", "block", 2}, 2, 1, {"--recompute-num-layers (2)", "[1, 1]"});
  TrainConfig ok;
  ok.model.num_layers = 8;
  ok.pipeline_model_parallel_size = 2;
  ok.model.recompute_granularity = layers::RecomputeGranularity::kFull;
  ok.model.recompute_method = layers::RecomputeMethod::kBlock;
  ok.model.recompute_num_layers = 4;
  EXPECT_TRUE(Finalize(&ok, 2).ok());
}

}  // namespace
}  // namespace loom::train
