// The StageModel interface is enough for the pipeline: a toy model family
// that is not GPT (written here, a few dense layers over a tied embedding,
// a squared-error loss) runs through the real Executor over 2 pipeline
// stages as threads, its tied embedding summed by the real GradientSync, and
// reproduces the same model on one rank. Nothing here links //models/gpt:gpt_model.

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "comm/grid.h"
#include "comm/testing/ranks_as_threads.h"
#include "core/status_macros.h"
#include "distributed/gradient_sync.h"
#include "gtest/gtest.h"
#include "layers/stage_model.h"
#include "pipeline/executor.h"
#include "pipeline/schedule.h"

namespace loom::pipeline {
namespace {

using core::Shape;
using core::Tensor;
using layers::ChunkSpec;
using layers::ParamHandle;

constexpr int64_t kVocab = 6, kHidden = 4, kSeq = 3, kMicroBatchSize = 2, kLayers = 2;
constexpr int kMicroBatches = 4;
// Both runs do the same float operations per micro-batch; only the order in
// which the tied embedding's two gradient contributions are summed differs.
constexpr double kLossTolerance = 1e-12;  // |diff|
constexpr double kGradTolerance = 1e-6;   // |diff| per element (gradients are O(0.1))

// Toy family: x = E[ids]; per layer x = tanh(W_l x); loss = the mean over
// tokens of 0.5 |x - E[target]|^2 (E: the embedding, tied into the loss).
// Units: the embedding (layers::kEmbeddingUnit), each layer, the head
// (kLayers, reads E). All on the host, in f32 with f64 sums.
class ToyModel : public layers::StageModel {
 public:
  struct Saved : Activations {
    Tensor ids, targets;             // i32[s, b]
    std::vector<Tensor> layer_out;   // per layer of the chunk: f32[s, b, h] (its input: the previous)
    Tensor input;                    // f32[s, b, h]: the chunk's first layer's input
    Tensor loss;                     // f64[1]: the mean loss (post_process)
    // Split backward: what BackwardInput leaves for BackwardWeight.
    std::vector<Tensor> dz;          // per layer of the chunk: the pre-tanh gradient
    Tensor head_grad;                // post_process: d loss / d output
    Tensor embedding_grad;           // pre_process: d loss / d E[ids]
    int64_t ActivationBytes() const override {
      int64_t n = input.defined() ? static_cast<int64_t>(input.nbytes()) : 0;
      for (const Tensor& t : layer_out) n += static_cast<int64_t>(t.nbytes());
      return n;
    }
    Tensor DeviceLoss() const override { return loss; }
  };

  // `split`: run the split backward (SplitsBackward): BackwardInput computes only the input
  // gradient, BackwardWeight the parameter gradients, with Backward's float operations.
  static absl::StatusOr<std::unique_ptr<ToyModel>> Create(std::vector<ChunkSpec> chunks,
                                                          bool split = false) {
    auto m = std::unique_ptr<ToyModel>(new ToyModel(std::move(chunks)));
    m->split_ = split;
    LOOM_RETURN_IF_ERROR(m->Build());
    return m;
  }

  const std::vector<ChunkSpec>& chunks() const override { return chunks_; }
  std::unique_ptr<Activations> NewActivations() const override {
    return std::make_unique<Saved>();
  }

  absl::StatusOr<Tensor> Forward(int c, const Tensor& input, const Tensor& targets,
                                 const layers::DropoutStream&, Activations* activations,
                                 double* loss) override {
    Saved& saved = dynamic_cast<Saved&>(*activations);
    const ChunkSpec& chunk = chunks_[c];
    Tensor x;
    if (chunk.pre_process) {
      LOOM_RETURN_IF_ERROR(Hook(true, layers::kEmbeddingUnit));
      saved.ids = input;
      LOOM_ASSIGN_OR_RETURN(x, Rows(input));
    } else {
      x = input;
    }
    saved.input = x;
    for (int64_t l = chunk.first_layer; l < chunk.first_layer + chunk.num_layers; ++l) {
      LOOM_RETURN_IF_ERROR(Hook(true, l));
      const float* w = W(l).value.data<float>();
      LOOM_ASSIGN_OR_RETURN(Tensor y, Tensor::Empty(BoundaryShape(kMicroBatchSize), core::DType::kF32));
      for (int64_t t = 0; t < kSeq * kMicroBatchSize; ++t) {
        for (int64_t i = 0; i < kHidden; ++i) {
          float z = 0;
          for (int64_t j = 0; j < kHidden; ++j) z += w[i * kHidden + j] * x.data<float>()[t * kHidden + j];
          y.data<float>()[t * kHidden + i] = std::tanh(z);
        }
      }
      saved.layer_out.push_back(y);
      x = y;
    }
    if (!chunk.post_process) return x;
    LOOM_RETURN_IF_ERROR(Hook(true, head_unit()));
    saved.targets = targets;
    LOOM_ASSIGN_OR_RETURN(Tensor want, Rows(targets));
    double sum = 0;
    for (int64_t k = 0; k < x.numel(); ++k) {
      const double d = x.data<float>()[k] - want.data<float>()[k];
      sum += 0.5 * d * d;
    }
    LOOM_ASSIGN_OR_RETURN(saved.loss, Tensor::Empty(Shape{1}, core::DType::kF64));
    saved.loss.data<double>()[0] = sum / (kSeq * kMicroBatchSize);
    if (loss != nullptr) *loss = saved.loss.data<double>()[0];
    return Tensor();
  }

  absl::StatusOr<double> LossOf(const Tensor& device_loss) const override {
    return device_loss.data<double>()[0];
  }

  absl::StatusOr<Tensor> Backward(int c, const Tensor& dy, float dloss,
                                  const layers::DropoutStream& dropout,
                                  const Activations& activations) override {
    Saved saved = dynamic_cast<const Saved&>(activations);  // shares the tensors
    LOOM_ASSIGN_OR_RETURN(Tensor dx, BackwardInputOf(c, dy, dloss, saved));
    LOOM_RETURN_IF_ERROR(BackwardWeightOf(c, saved));
    (void)dropout;
    return dx;
  }

  bool SplitsBackward() const override { return split_; }
  absl::StatusOr<Tensor> BackwardInput(int c, const Tensor& dy, float dloss,
                                       const layers::DropoutStream&,
                                       Activations& activations) override {
    if (!split_) return absl::FailedPreconditionError("BackwardInput of a model that does not split");
    ++split_calls_;
    return BackwardInputOf(c, dy, dloss, dynamic_cast<Saved&>(activations));
  }
  absl::Status BackwardWeight(int c, const layers::DropoutStream&,
                              Activations& activations) override {
    if (!split_) return absl::FailedPreconditionError("BackwardWeight of a model that does not split");
    ++split_calls_;
    return BackwardWeightOf(c, dynamic_cast<Saved&>(activations));
  }
  int split_calls() const { return split_calls_; }

  // The input-gradient half: records the gradients the weight half needs in `saved`.
  absl::StatusOr<Tensor> BackwardInputOf(int c, const Tensor& dy, float dloss, Saved& saved) {
    const ChunkSpec& chunk = chunks_[c];
    const int64_t tokens = kSeq * kMicroBatchSize;
    Tensor d;  // gradient of the chunk's output
    if (chunk.post_process) {
      const Tensor& x = saved.layer_out.empty() ? saved.input : saved.layer_out.back();
      LOOM_ASSIGN_OR_RETURN(Tensor want, Rows(saved.targets));
      LOOM_ASSIGN_OR_RETURN(d, Tensor::Empty(x.shape(), core::DType::kF32));
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t i = 0; i < kHidden; ++i) {
          d.data<float>()[t * kHidden + i] =
              (x.data<float>()[t * kHidden + i] - want.data<float>()[t * kHidden + i]) * dloss /
              static_cast<float>(tokens);
        }
      }
      saved.head_grad = d;
    } else {
      LOOM_ASSIGN_OR_RETURN(d, Tensor::Empty(dy.shape(), core::DType::kF32));
      for (int64_t k = 0; k < dy.numel(); ++k) d.data<float>()[k] = dy.data<float>()[k];
    }
    saved.dz.assign(chunk.num_layers, Tensor());
    for (int64_t k = chunk.num_layers; k-- > 0;) {
      const int64_t l = chunk.first_layer + k;
      const Tensor& y = saved.layer_out[k];
      const Tensor& x = k == 0 ? saved.input : saved.layer_out[k - 1];
      const float* w = W(l).value.data<float>();
      LOOM_ASSIGN_OR_RETURN(Tensor dx, Tensor::Zeros(x.shape(), core::DType::kF32));
      LOOM_ASSIGN_OR_RETURN(Tensor dz, Tensor::Empty(y.shape(), core::DType::kF32));
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t i = 0; i < kHidden; ++i) {
          const float yi = y.data<float>()[t * kHidden + i];
          const float g = d.data<float>()[t * kHidden + i] * (1 - yi * yi);
          dz.data<float>()[t * kHidden + i] = g;
          for (int64_t j = 0; j < kHidden; ++j) {
            dx.data<float>()[t * kHidden + j] += g * w[i * kHidden + j];
          }
        }
      }
      saved.dz[k] = dz;
      d = dx;
    }
    if (!chunk.pre_process) return d;
    saved.embedding_grad = d;
    return Tensor();
  }

  // The weight half, in Backward's order of units (head, layers from the last, embedding).
  absl::Status BackwardWeightOf(int c, const Saved& saved) {
    const ChunkSpec& chunk = chunks_[c];
    const int64_t tokens = kSeq * kMicroBatchSize;
    if (chunk.post_process) {
      float* de = params_.at(embedding_).grad.data<float>();
      for (int64_t t = 0; t < tokens; ++t) {
        const int32_t target = saved.targets.data<int32_t>()[t];
        for (int64_t i = 0; i < kHidden; ++i) {
          de[target * kHidden + i] -= saved.head_grad.data<float>()[t * kHidden + i];
        }
      }
      LOOM_RETURN_IF_ERROR(Hook(false, head_unit()));
    }
    for (int64_t k = chunk.num_layers; k-- > 0;) {
      const int64_t l = chunk.first_layer + k;
      const Tensor& x = k == 0 ? saved.input : saved.layer_out[k - 1];
      float* dw = W(l).grad.data<float>();
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t i = 0; i < kHidden; ++i) {
          const float g = saved.dz[k].data<float>()[t * kHidden + i];
          for (int64_t j = 0; j < kHidden; ++j) {
            dw[i * kHidden + j] += g * x.data<float>()[t * kHidden + j];
          }
        }
      }
      LOOM_RETURN_IF_ERROR(Hook(false, l));
    }
    if (!chunk.pre_process) return absl::OkStatus();
    float* de = params_.at(embedding_).grad.data<float>();
    for (int64_t t = 0; t < tokens; ++t) {
      const int32_t id = saved.ids.data<int32_t>()[t];
      for (int64_t i = 0; i < kHidden; ++i) {
        de[id * kHidden + i] += saved.embedding_grad.data<float>()[t * kHidden + i];
      }
    }
    return Hook(false, layers::kEmbeddingUnit);
  }

  int64_t local_seq_length() const override { return kSeq; }
  Shape BoundaryShape(int64_t micro_batch_size) const override {
    return Shape{kSeq, micro_batch_size, kHidden};
  }
  core::DType boundary_dtype() const override { return core::DType::kF32; }
  core::Device device() const override { return core::Device::CPU(); }
  layers::ParamBuffer& params() override { return params_; }
  const layers::ParamBuffer& params() const override { return params_; }
  const std::vector<layers::ParamUnit>& units() const override { return units_; }
  int64_t head_unit() const override { return kLayers; }
  ParamHandle word_embedding() const override { return embedding_; }
  bool tied_word_embedding() const override { return true; }
  const layers::TpGroup& tp() const override { return tp_; }

 private:
  explicit ToyModel(std::vector<ChunkSpec> chunks) : chunks_(std::move(chunks)) {}

  absl::Status Build() {
    const bool pre = chunks_.front().pre_process, post = chunks_.back().post_process;
    std::vector<layers::ParamSpec> specs;
    if (pre || post) specs.push_back({"embedding", Shape{kVocab, kHidden}});
    for (const ChunkSpec& c : chunks_) {
      for (int64_t l = c.first_layer; l < c.first_layer + c.num_layers; ++l) {
        specs.push_back({absl::StrCat("layers.", l, ".weight"), Shape{kHidden, kHidden}});
      }
    }
    LOOM_ASSIGN_OR_RETURN(params_, layers::ParamBuffer::Create(specs, 0, 1, /*seed=*/1));
    for (layers::Param& p : params_.params()) {  // the same values on every layout
      const float salt = static_cast<float>(p.spec->name.size());
      for (int64_t k = 0; k < p.value.numel(); ++k) {
        p.value.data<float>()[k] = 0.6f * std::sin(1.0f + 0.7f * k + salt);
      }
    }
    embedding_ = params_.Find("embedding");
    if (post && !pre) params_.at(embedding_).tied_copy = true;
    if (pre) units_.push_back({layers::kEmbeddingUnit, {embedding_}});
    for (const ChunkSpec& c : chunks_) {
      for (int64_t l = c.first_layer; l < c.first_layer + c.num_layers; ++l) {
        layer_[l] = params_.Find(absl::StrCat("layers.", l, ".weight"));
        units_.push_back({l, {layer_[l]}});
      }
    }
    if (post) units_.push_back({head_unit(), {embedding_}});
    return absl::OkStatus();
  }

  layers::Param& W(int64_t l) { return params_.at(layer_.at(l)); }

  // E[ids]: f32[s, b, h].
  absl::StatusOr<Tensor> Rows(const Tensor& ids) const {
    LOOM_ASSIGN_OR_RETURN(Tensor x, Tensor::Empty(BoundaryShape(ids.dim(1)), core::DType::kF32));
    const float* e = params_.at(embedding_).value.data<float>();
    for (int64_t t = 0; t < ids.numel(); ++t) {
      for (int64_t i = 0; i < kHidden; ++i) {
        x.data<float>()[t * kHidden + i] = e[ids.data<int32_t>()[t] * kHidden + i];
      }
    }
    return x;
  }

  // The events GradientSync needs (a family may send all four).
  absl::Status Hook(bool forward, int64_t unit) const {
    return Notify(forward ? layers::UnitEvent::kBeforeForward : layers::UnitEvent::kAfterBackward,
                  unit);
  }

  std::vector<ChunkSpec> chunks_;
  layers::ParamBuffer params_;
  ParamHandle embedding_;
  std::map<int64_t, ParamHandle> layer_;
  std::vector<layers::ParamUnit> units_;
  layers::TpGroup tp_;
  bool split_ = false;
  int split_calls_ = 0;
};

absl::StatusOr<MicroBatch> MakeMicroBatch(int m) {
  MicroBatch mb;
  LOOM_ASSIGN_OR_RETURN(mb.ids, Tensor::Empty(Shape{kSeq, kMicroBatchSize}, core::DType::kI32));
  LOOM_ASSIGN_OR_RETURN(mb.targets, Tensor::Empty(Shape{kSeq, kMicroBatchSize}, core::DType::kI32));
  for (int64_t t = 0; t < kSeq * kMicroBatchSize; ++t) {
    mb.ids.data<int32_t>()[t] = static_cast<int32_t>((3 * m + 5 * t + 1) % kVocab);
    mb.targets.data<int32_t>()[t] = static_cast<int32_t>((7 * m + 2 * t + 4) % kVocab);
  }
  return mb;
}

struct StageRun {
  int peak_live = 0;       // summed over chunks
  int split_calls = 0;     // BackwardInput + BackwardWeight calls the model got
  double mean_loss = 0;
  std::vector<double> losses;                         // last stage
  std::map<std::string, std::vector<float>> grads;    // by parameter name
};

// One step of `kind` over `pp` stages (threads), gradients through GradientSync.
absl::StatusOr<std::vector<StageRun>> Step(ScheduleKind kind, int pp, bool split = false) {
  const int vp = IsVShape(kind) ? 2 : 1;
  std::vector<StageRun> runs(pp);
  absl::Status s = comm::testing::RunRanksAsThreads(pp, [&](int rank, comm::Communicator* world) -> absl::Status {
    LOOM_ASSIGN_OR_RETURN(comm::Grid grid, comm::Grid::Make(pp, 1, pp));
    LOOM_ASSIGN_OR_RETURN(comm::ParallelGroups groups, comm::MakeParallelGroups(*world, grid));
    // Virtual stage vs holds layers [vs L / (pp v), (vs + 1) L / (pp v)); stage r with v = 1
    // holds [r L / pp, (r + 1) L / pp).
    const int64_t per = kLayers / (pp * vp);
    ScheduleOptions placement;
    placement.kind = kind;
    placement.pp = pp;
    placement.vp = vp;
    std::vector<ChunkSpec> chunks;
    for (int c = 0; c < vp; ++c) {
      const int vs = VirtualStageOf(placement, rank, c);
      chunks.push_back({vs * per, per, vs == 0, vs == pp * vp - 1});
    }
    LOOM_ASSIGN_OR_RETURN(std::unique_ptr<ToyModel> model, ToyModel::Create(chunks, split));
    distributed::GradientSyncOptions sync_options;
    sync_options.micro_batches = kMicroBatches;
    LOOM_ASSIGN_OR_RETURN(std::unique_ptr<distributed::GradientSync> sync,
                          distributed::GradientSync::Create(
                              model.get(), {nullptr, groups.embedding.get()}, sync_options));
    LOOM_RETURN_IF_ERROR(sync->StartStep());
    LOOM_ASSIGN_OR_RETURN(Schedule schedule, BuildSchedule({kind, pp, vp, kMicroBatches, 0}));
    ExecutorOptions options;
    options.micro_batch_size = kMicroBatchSize;
    options.loss_scale = 1.0f / kMicroBatches;
    LOOM_ASSIGN_OR_RETURN(Executor exec,
                          Executor::Create(schedule, model.get(), groups.pp.get(), options));
    LOOM_ASSIGN_OR_RETURN(StepResult result, exec.RunStep(MakeMicroBatch));
    LOOM_RETURN_IF_ERROR(sync->FinishGradients());
    StageRun& run = runs[rank];
    for (int n : result.peak_live_saved) run.peak_live += n;
    run.split_calls = model->split_calls();
    run.mean_loss = result.mean_loss;
    run.losses = result.losses;
    for (const layers::Param& p : model->params().params()) {
      const float* g = p.grad.data<float>();
      run.grads[p.spec->name].assign(g, g + p.grad.numel());
    }
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return runs;
}

TEST(StageModelTest, ToyFamilyOverTwoStagesMatchesOneRank) {
  absl::StatusOr<std::vector<StageRun>> one = Step(ScheduleKind::kGPipe, 1);
  ASSERT_TRUE(one.ok()) << one.status();
  const StageRun& ref = (*one)[0];
  ASSERT_EQ(ref.losses.size(), static_cast<size_t>(kMicroBatches));
  ASSERT_EQ(ref.grads.size(), 3u);  // embedding, layers.0.weight, layers.1.weight
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    absl::StatusOr<std::vector<StageRun>> two = Step(kind, 2);
    ASSERT_TRUE(two.ok()) << two.status();
    std::map<std::string, int> seen;
    double max_diff = 0, max_loss_diff = 0;
    for (int rank = 0; rank < 2; ++rank) {
      const StageRun& run = (*two)[rank];
      const std::string where =
          absl::StrCat(kind == ScheduleKind::kGPipe ? "GPipe" : "1F1B", ", stage ", rank);
      EXPECT_NEAR(run.mean_loss, ref.mean_loss, kLossTolerance) << where;
      max_loss_diff = std::max(max_loss_diff, std::abs(run.mean_loss - ref.mean_loss));
      if (rank == 1) {
        ASSERT_EQ(run.losses.size(), ref.losses.size()) << where;
        for (int m = 0; m < kMicroBatches; ++m) {
          EXPECT_NEAR(run.losses[m], ref.losses[m], kLossTolerance) << where << " micro-batch " << m;
        }
      }
      for (const auto& [name, got] : run.grads) {
        ++seen[name];
        const std::vector<float>& want = ref.grads.at(name);
        ASSERT_EQ(got.size(), want.size()) << name;
        double max_grad = 0;
        for (size_t k = 0; k < got.size(); ++k) {
          EXPECT_NEAR(got[k], want[k], kGradTolerance) << where << " " << name << "[" << k << "]";
          max_grad = std::max(max_grad, std::abs(static_cast<double>(want[k])));
        }
        EXPECT_GT(max_grad, 1e-3) << name << ": the toy model must have gradients to compare";
        for (size_t k = 0; k < got.size(); ++k) {
          max_diff = std::max(max_diff, std::abs(static_cast<double>(got[k]) - want[k]));
        }
      }
    }
    std::cout << (kind == ScheduleKind::kGPipe ? "GPipe" : "1F1B") << " over 2 stages: mean loss "
              << ref.mean_loss << ", max |loss diff| " << max_loss_diff << ", max |grad diff| "
              << max_diff << "\n";
    // Each stage holds its layer; both hold the tied embedding (summed by GradientSync).
    EXPECT_EQ(seen, (std::map<std::string, int>{
                        {"embedding", 2}, {"layers.0.weight", 1}, {"layers.1.weight", 1}}));
  }
}

// A model that splits its backward (#39): the executor calls BackwardInput at I and
// BackwardWeight at W, keeps the record until W, and the step reproduces one rank. ZB-H1 over
// two stages (stage 1 defers W(m) past I(m + 1), so it holds two records, not 1F1B's one) and
// ZBV on one stage (two chunks, chunk 0's output handed to chunk 1 locally).
TEST(StageModelTest, SplitBackwardThroughTheExecutorMatchesOneRank) {
  absl::StatusOr<std::vector<StageRun>> one = Step(ScheduleKind::kGPipe, 1);
  ASSERT_TRUE(one.ok()) << one.status();
  const StageRun& ref = (*one)[0];
  for (auto [kind, pp] : std::vector<std::pair<ScheduleKind, int>>{{ScheduleKind::kZBH1, 2},
                                                                   {ScheduleKind::kZBV, 1},
                                                                   {ScheduleKind::kDualPipeV, 1}}) {
    for (bool split : {false, true}) {
      absl::StatusOr<std::vector<StageRun>> runs = Step(kind, pp, split);
      ASSERT_TRUE(runs.ok()) << runs.status();
      const ScheduleOptions o{kind, pp, IsVShape(kind) ? 2 : 1, kMicroBatches, 0};
      std::map<std::string, int> seen;
      for (int rank = 0; rank < pp; ++rank) {
        const StageRun& run = (*runs)[rank];
        const std::string where = absl::StrCat(ScheduleKindName(kind), split ? " split" : "",
                                               ", stage ", rank);
        EXPECT_NEAR(run.mean_loss, ref.mean_loss, kLossTolerance) << where;
        for (const auto& [name, got] : run.grads) {
          ++seen[name];
          const std::vector<float>& want = ref.grads.at(name);
          ASSERT_EQ(got.size(), want.size()) << name;
          for (size_t k = 0; k < got.size(); ++k) {
            EXPECT_NEAR(got[k], want[k], kGradTolerance) << where << " " << name << "[" << k << "]";
          }
        }
        // Split: one BackwardInput and one BackwardWeight per (micro-batch, chunk), records
        // held until W (the schedule's peak); not split: the full Backward at I frees them.
        // (dualpipev splits only the backwards of its first and last phases.)
        int inputs = 0;
        for (const Action& a : ComputeOrder(o, rank)) inputs += a.kind == ActionKind::kBackwardInput;
        if (kind != ScheduleKind::kDualPipeV) {
          EXPECT_EQ(inputs, kMicroBatches * o.vp);
        }
        EXPECT_EQ(run.split_calls, split ? 2 * inputs : 0) << where;
        // (peak_live sums per-chunk peaks, the simultaneous peak only when v = 1.)
        if (split && o.vp == 1) {
          EXPECT_EQ(run.peak_live, PeakInFlightActivations(o, rank)) << where;
        }
      }
      if (kind == ScheduleKind::kZBH1) {
        EXPECT_EQ((*runs)[1].peak_live, split ? 2 : 1);  // 1F1B's last stage holds one
      }
      EXPECT_EQ(seen.size(), 3u);
    }
  }
}

}  // namespace
}  // namespace loom::pipeline
