// The split backward of the zero-bubble schedules (#39): BackwardInput then,
// later, BackwardWeight gives the fused Backward's input gradients, losses and
// parameter gradients bit for bit (the same GEMMs on the same operands, in
// the same order per gradient), for GPT-2, Llama-style linears and MoE
// (experts and router deferred too), with full and selective
// recomputation, in the layouts TP 1 / TP 2 / TP 2 + SP x one stage / two
// stages / two stages of two interleaved chunks. Every step runs two
// micro-batches with both BackwardInputs before any BackwardWeight, as ZB-H1
// defers W; a pipeline here is the stages' models held by one thread (the
// executor's schedules are //pipeline:executor_test's); TP ranks are threads.
// Also: the weight gradients really wait for BackwardWeight, and the units'
// AfterBackward (GradientSync's cue) comes only there.
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/test_util.h"

namespace loom::layers {
namespace {

using core::Tensor;
using testing::RandomIds;
using testing::Recompute;
using testing::StepDropout;

constexpr int kSteps = 2;
constexpr int kMicroBatches = 2;
constexpr int64_t kBatch = 2;
constexpr float kLr = 0.5f;

enum class Arch { kGpt2, kLlama, kMoe };

GptConfig Config(Arch arch) {
  GptConfig c;
  c.num_layers = 4;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = 8;
  c.vocab_size = 60;
  c.make_vocab_size_divisible_by = 8;
  c.seed = 42;
  if (arch == Arch::kGpt2) return c;
  // Llama's linears (SwiGLU, grouped K/V, no biases, untied output layer);
  // the norms and position embedding stay GPT-2's (their gradients are not
  // deferred: LayerNorm's and the position table's run at BackwardInput).
  c.swiglu = true;
  c.ffn_hidden_size = 64;
  c.group_query_attention = true;
  c.num_query_groups = 2;
  c.untie_embeddings_and_output_weights = true;
  c.add_bias_linear = false;
  if (arch == Arch::kLlama) return c;
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_layer_freq = 2;  // layers 0 and 2 MoE
  c.moe_aux_loss_coeff = 0.01f;
  c.moe_z_loss_coeff = 0.001f;
  return c;
}

struct Layout {
  int tp = 1;
  bool sp = false;
  int pp = 1;
  int vp = 1;
  std::string Name() const {
    return absl::StrCat("tp", tp, sp ? "_sp" : "", "_pp", pp, vp > 1 ? absl::StrCat("_vp", vp) : "");
  }
};

// Counts the unit events of one model, by the phase they came in.
class EventCounter : public UnitObserver {
 public:
  absl::Status BeforeBackward(int64_t) override {
    ++before[phase];
    return absl::OkStatus();
  }
  absl::Status AfterBackward(int64_t) override {
    ++after[phase];
    return absl::OkStatus();
  }
  int phase = 0;  // 0: BackwardInput (or fused Backward), 1: BackwardWeight
  int before[2] = {0, 0}, after[2] = {0, 0};
};

// Per TP rank: every step's micro-batch losses and every parameter's gradient
// of every stage as raw floats, in order; and what the split checks saw.
struct Trace {
  std::vector<double> losses;
  std::vector<std::vector<float>> grads;
  std::vector<std::vector<float>> input_grads;  // each BackwardInput's (or Backward's) result
  int64_t units = 0;                            // units of all stages
  int before_input = 0, after_input = 0, before_weight = 0, after_weight = 0;
  bool weights_waited = true;  // every GEMM weight's gradient still zero after the inputs
};

// A weight whose gradient is a deferred GEMM (or the word table's scatter-add).
bool IsDeferredWeight(const std::string& name) {
  for (const char* part : {"attention.qkv.weight", "attention.dense.weight", "h_to_4h.weight",
                           "4h_to_h.weight", "router.weight", "word_embeddings.weight",
                           "output_layer.weight"}) {
    if (name.find(part) != std::string::npos) return true;
  }
  return false;
}

bool AllZero(const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (t.data<float>()[i] != 0.0f) return false;
  }
  return true;
}

absl::StatusOr<std::vector<Trace>> Train(const GptConfig& config, const Layout& l, bool split) {
  std::vector<Trace> traces(l.tp);
  const int64_t per_chunk = config.num_layers / (l.pp * l.vp);
  absl::Status s = testing::RunRanks(l.tp, [&](int rank, comm::Communicator* comm) -> absl::Status {
    TpGroup tp{comm, l.sp};
    Trace& trace = traces[rank];
    std::vector<std::unique_ptr<GptModel>> stages;
    std::vector<EventCounter> counters(l.pp);
    for (int stage = 0; stage < l.pp; ++stage) {
      std::vector<ChunkSpec> chunks;
      for (int c = 0; c < l.vp; ++c) {
        const int vs = c * l.pp + stage;
        chunks.push_back({vs * per_chunk, per_chunk, vs == 0, vs == l.pp * l.vp - 1});
      }
      auto m = GptModel::Create(config, tp, chunks);
      if (!m.ok()) return m.status();
      (*m)->AddObserver(&counters[stage]);
      trace.units += static_cast<int64_t>((*m)->units().size());
      stages.push_back(std::move(*m));
    }
    const int virtual_stages = l.pp * l.vp;
    auto model = [&](int vs) -> GptModel& { return *stages[vs % l.pp]; };
    for (int step = 0; step < kSteps; ++step) {
      for (auto& m : stages) {
        if (absl::Status z = m->params().ZeroGrads(); !z.ok()) return z;
      }
      for (EventCounter& e : counters) e.phase = 0;
      // saved[mb][vs]
      std::vector<std::vector<GptModel::Saved>> saved(kMicroBatches,
                                                      std::vector<GptModel::Saved>(virtual_stages));
      for (int mb = 0; mb < kMicroBatches; ++mb) {
        const uint64_t seed = 100 * step + mb;
        Tensor x = RandomIds(config.seq_length, kBatch, config.vocab_size, 1000 + seed);
        Tensor targets = RandomIds(config.seq_length, kBatch, config.vocab_size, 2000 + seed);
        double loss = 0;
        for (int vs = 0; vs < virtual_stages; ++vs) {
          auto y = model(vs).Forward(vs / l.pp, x, targets, StepDropout(step), &saved[mb][vs],
                                     &loss);
          if (!y.ok()) return y.status();
          x = *y;
        }
        trace.losses.push_back(loss);
      }
      const float dloss = 1.0f / kMicroBatches;
      // Every micro-batch's input-gradient pass (fused: its whole backward).
      for (int mb = 0; mb < kMicroBatches; ++mb) {
        Tensor d;
        for (int vs = virtual_stages; vs-- > 0;) {
          absl::StatusOr<Tensor> dx =
              split ? model(vs).BackwardInput(vs / l.pp, d, dloss, StepDropout(step), saved[mb][vs])
                    : model(vs).Backward(vs / l.pp, d, dloss, StepDropout(step), saved[mb][vs]);
          if (!dx.ok()) return dx.status();
          d = *dx;
          if (d.defined()) trace.input_grads.push_back(testing::ToVector(d));
        }
      }
      if (split) {
        for (auto& m : stages) {
          for (const Param& p : m->params().params()) {
            if (IsDeferredWeight(p.spec->name) && !AllZero(p.grad)) trace.weights_waited = false;
          }
        }
        for (EventCounter& e : counters) e.phase = 1;
        // Then the weight halves, in micro-batch order (ZB-H1's), stages first to last.
        for (int mb = 0; mb < kMicroBatches; ++mb) {
          for (int vs = 0; vs < virtual_stages; ++vs) {
            if (absl::Status w = model(vs).BackwardWeight(vs / l.pp, StepDropout(step), saved[mb][vs]);
                !w.ok()) {
              return w;
            }
          }
        }
      }
      for (auto& m : stages) {
        for (Param& p : m->params().params()) {
          trace.grads.push_back(testing::ToVector(p.grad));
          for (int64_t i = 0; i < p.value.numel(); ++i) {
            p.value.data<float>()[i] -= kLr * p.grad.data<float>()[i];
          }
        }
      }
    }
    for (EventCounter& e : counters) {
      trace.before_input += e.before[0];
      trace.after_input += e.after[0];
      trace.before_weight += e.before[1];
      trace.after_weight += e.after[1];
    }
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return traces;
}

// Bit-for-bit: memcmp, not a tolerance.
bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

int Differing(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  int n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += !SameBits(a[i], b[i]);
  return n;
}

std::string ArchName(Arch a) {
  return a == Arch::kGpt2 ? "gpt2" : a == Arch::kLlama ? "swiglu_gqa" : "moe";
}

class SplitBackwardTest
    : public ::testing::TestWithParam<std::tuple<Layout, Arch, std::string>> {};

TEST_P(SplitBackwardTest, BitIdenticalToTheFusedBackward) {
  const auto [layout, arch, recompute] = GetParam();
  GptConfig config = Config(arch);
  if (recompute == "selective") config = Recompute{"selective", "", 0}.Apply(config);
  if (recompute == "full") config = Recompute{"full", "uniform", 2}.Apply(config);
  if (recompute == "full" && layout.pp * layout.vp > 2) {
    config = Recompute{"full", "uniform", 1}.Apply(config);
  }
  auto fused = Train(config, layout, false);
  ASSERT_TRUE(fused.ok()) << fused.status();
  auto split = Train(config, layout, true);
  ASSERT_TRUE(split.ok()) << split.status();
  for (int rank = 0; rank < layout.tp; ++rank) {
    const Trace& want = (*fused)[rank];
    const Trace& have = (*split)[rank];
    ASSERT_EQ(have.losses.size(), static_cast<size_t>(kSteps * kMicroBatches));
    EXPECT_EQ(std::memcmp(have.losses.data(), want.losses.data(),
                          want.losses.size() * sizeof(double)),
              0)
        << "tp_rank " << rank;
    ASSERT_EQ(have.input_grads.size(), want.input_grads.size());
    EXPECT_EQ(Differing(have.input_grads, want.input_grads), 0) << "tp_rank " << rank;
    ASSERT_EQ(have.grads.size(), want.grads.size());
    EXPECT_EQ(Differing(have.grads, want.grads), 0)
        << "tp_rank " << rank << ": of " << want.grads.size() << " gradients";
    // The GEMM weights' gradients wait for BackwardWeight ...
    EXPECT_TRUE(have.weights_waited) << "tp_rank " << rank;
    // ... and so does every unit's AfterBackward: once per (micro-batch, unit).
    const int per_step = static_cast<int>(have.units) * kMicroBatches;
    EXPECT_EQ(want.before_input, kSteps * per_step);
    EXPECT_EQ(want.after_input, kSteps * per_step);
    EXPECT_EQ(have.before_input, kSteps * per_step);
    EXPECT_EQ(have.after_input, 0);
    EXPECT_EQ(have.before_weight, 0);
    EXPECT_EQ(have.after_weight, kSteps * per_step);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, SplitBackwardTest,
    ::testing::Combine(::testing::Values(Layout{1, false, 1, 1}, Layout{2, false, 1, 1},
                                         Layout{2, true, 1, 1}, Layout{1, false, 2, 1},
                                         Layout{2, true, 2, 2}),
                       ::testing::Values(Arch::kGpt2, Arch::kLlama, Arch::kMoe),
                       ::testing::Values(std::string("none"), std::string("selective"),
                                         std::string("full"))),
    [](const auto& info) {
      return std::get<0>(info.param).Name() + "_" + ArchName(std::get<1>(info.param)) + "_" +
             std::get<2>(info.param);
    });

// The comparison can fail: a BackwardWeight that skipped one micro-batch's
// weight gradients leaves different gradients; and the order is enforced.
TEST(SplitBackwardSanityTest, AMissingWeightHalfIsDetectedAndMisuseRefused) {
  const GptConfig config = Config(Arch::kGpt2);
  auto model = GptModel::Create(config, TpGroup{});
  ASSERT_TRUE(model.ok()) << model.status();
  GptModel& m = **model;
  EXPECT_TRUE(m.SplitsBackward());
  Tensor ids = RandomIds(config.seq_length, kBatch, config.vocab_size, 1);
  Tensor targets = RandomIds(config.seq_length, kBatch, config.vocab_size, 2);
  GptModel::Saved saved;
  double loss = 0;
  ASSERT_TRUE(m.Forward(0, ids, targets, StepDropout(0), &saved, &loss).ok());
  const absl::Status early = m.BackwardWeight(0, StepDropout(0), saved);
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition) << early;
  ASSERT_TRUE(m.params().ZeroGrads().ok());
  ASSERT_TRUE(m.BackwardInput(0, Tensor(), 1.0f, StepDropout(0), saved).ok());
  EXPECT_GT(saved.ActivationBytes(), 0);
  const int64_t with_stash = saved.ActivationBytes();
  const absl::Status twice = m.BackwardInput(0, Tensor(), 1.0f, StepDropout(0), saved).status();
  EXPECT_EQ(twice.code(), absl::StatusCode::kFailedPrecondition) << twice;
  std::vector<std::vector<float>> input_only;
  for (const Param& p : m.params().params()) input_only.push_back(testing::ToVector(p.grad));
  ASSERT_TRUE(m.BackwardWeight(0, StepDropout(0), saved).ok());
  EXPECT_LT(saved.ActivationBytes(), with_stash);  // the stash went with W
  std::vector<std::vector<float>> full;
  for (const Param& p : m.params().params()) full.push_back(testing::ToVector(p.grad));
  EXPECT_GT(Differing(input_only, full), 0);
}

}  // namespace
}  // namespace loom::layers
