// The executor's idle time per stage against the simulator's (#39), with the per-action costs
// set by the test: a StageModel whose every action advances its stage's virtual clock by the
// action's cost, starting no earlier than the virtual time its input carries (the boundary
// tensor holds the time its producer ended). The real Executor runs the real schedule over
// threads and real p2p messages, so each stage waits exactly as the executor's action order and
// data dependencies make it wait; nothing reads the wall clock, so the 2 cores (or a loaded
// machine) play no part. Idle = the stage's last end - its busy time. The simulator (eager
// sends, no communication cost) must give the same idle per stage, for 1F1B, ZB-H1, ZBV and
// DualPipeV with equal and unequal F / I / W.

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/grid.h"
#include "comm/testing/ranks_as_threads.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "layers/stage_model.h"
#include "pipeline/executor.h"
#include "pipeline/schedule.h"
#include "pipeline/simulator.h"

namespace loom::pipeline {
namespace {

using core::Shape;
using core::Tensor;
using layers::ChunkSpec;

struct Costs {
  double f = 1, i = 1, w = 1;
};

// Boundary tensors are f32[1, b, 1] holding the virtual time their producer ended.
class ClockModel : public layers::StageModel {
 public:
  struct Saved : Activations {
    Tensor loss;  // f64[1]
    int64_t ActivationBytes() const override { return 0; }
    Tensor DeviceLoss() const override { return loss; }
  };

  static absl::StatusOr<std::unique_ptr<ClockModel>> Create(std::vector<ChunkSpec> chunks,
                                                            Costs costs, bool split) {
    auto m = std::unique_ptr<ClockModel>(new ClockModel(std::move(chunks), costs, split));
    LOOM_ASSIGN_OR_RETURN(m->params_, layers::ParamBuffer::Create(
                                          {{"clock.weight", Shape{1}}}, 0, 1, /*seed=*/1));
    return m;
  }

  double now() const { return now_; }
  double busy() const { return busy_; }

  const std::vector<ChunkSpec>& chunks() const override { return chunks_; }
  std::unique_ptr<Activations> NewActivations() const override {
    return std::make_unique<Saved>();
  }
  absl::StatusOr<Tensor> Forward(int c, const Tensor& input, const Tensor&,
                                 const layers::DropoutStream&, Activations* activations,
                                 double* loss) override {
    const ChunkSpec& chunk = chunks_[c];
    Run(chunk.pre_process ? 0 : input.data<float>()[0], costs_.f);
    if (!chunk.post_process) return Stamp();
    Saved& saved = dynamic_cast<Saved&>(*activations);
    LOOM_ASSIGN_OR_RETURN(saved.loss, Tensor::Empty(Shape{1}, core::DType::kF64));
    saved.loss.data<double>()[0] = 0;
    if (loss != nullptr) *loss = 0;
    return Tensor();
  }
  absl::StatusOr<double> LossOf(const Tensor& device_loss) const override {
    return device_loss.data<double>()[0];
  }
  absl::StatusOr<Tensor> Backward(int c, const Tensor& dy, float, const layers::DropoutStream&,
                                  const Activations&) override {
    return Input(c, dy, costs_.i + costs_.w);
  }
  bool SplitsBackward() const override { return split_; }
  absl::StatusOr<Tensor> BackwardInput(int c, const Tensor& dy, float,
                                       const layers::DropoutStream&, Activations&) override {
    return Input(c, dy, costs_.i);
  }
  absl::Status BackwardWeight(int, const layers::DropoutStream&, Activations&) override {
    Run(0, costs_.w);
    return absl::OkStatus();
  }

  int64_t local_seq_length() const override { return 1; }
  Shape BoundaryShape(int64_t micro_batch_size) const override {
    return Shape{1, micro_batch_size, 1};
  }
  core::DType boundary_dtype() const override { return core::DType::kF32; }
  core::Device device() const override { return core::Device::CPU(); }
  layers::ParamBuffer& params() override { return params_; }
  const layers::ParamBuffer& params() const override { return params_; }
  const std::vector<layers::ParamUnit>& units() const override { return units_; }
  int64_t head_unit() const override { return 0; }
  layers::ParamHandle word_embedding() const override { return {}; }
  bool tied_word_embedding() const override { return false; }
  const layers::TpGroup& tp() const override { return tp_; }

 private:
  ClockModel(std::vector<ChunkSpec> chunks, Costs costs, bool split)
      : chunks_(std::move(chunks)), costs_(costs), split_(split) {}

  // An action of `cost` that may start once its input exists (virtual time `ready`).
  void Run(double ready, double cost) {
    now_ = std::max(now_, ready) + cost;
    busy_ += cost;
  }
  absl::StatusOr<Tensor> Stamp() const {
    LOOM_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(BoundaryShape(1), core::DType::kF32));
    t.data<float>()[0] = static_cast<float>(now_);
    return t;
  }
  // The input-gradient half (a last stage's starts from its own forward's loss).
  absl::StatusOr<Tensor> Input(int c, const Tensor& dy, double cost) {
    const ChunkSpec& chunk = chunks_[c];
    Run(chunk.post_process ? 0 : dy.data<float>()[0], cost);
    if (chunk.pre_process) return Tensor();
    return Stamp();
  }

  std::vector<ChunkSpec> chunks_;
  Costs costs_;
  bool split_;
  layers::ParamBuffer params_;
  std::vector<layers::ParamUnit> units_;
  layers::TpGroup tp_;
  double now_ = 0, busy_ = 0;
};

absl::StatusOr<MicroBatch> OneToken(int) {
  MicroBatch mb;
  LOOM_ASSIGN_OR_RETURN(mb.ids, Tensor::Zeros(Shape{1, 1}, core::DType::kI32));
  LOOM_ASSIGN_OR_RETURN(mb.targets, Tensor::Zeros(Shape{1, 1}, core::DType::kI32));
  return mb;
}

// Per stage: the executor's idle time on the virtual clock.
absl::StatusOr<std::vector<double>> ExecutorIdle(const ScheduleOptions& so, Costs costs) {
  std::vector<double> idle(so.pp);
  absl::Status s = comm::testing::RunRanksAsThreads(
      so.pp, [&](int rank, comm::Communicator* world) -> absl::Status {
        LOOM_ASSIGN_OR_RETURN(comm::Grid grid, comm::Grid::Make(so.pp, 1, so.pp));
        LOOM_ASSIGN_OR_RETURN(comm::ParallelGroups groups, comm::MakeParallelGroups(*world, grid));
        // One layer a chunk, where the schedule places its virtual stage (the V's stage 0
        // holds the first and the last).
        std::vector<ChunkSpec> chunks;
        for (int c = 0; c < so.vp; ++c) {
          const int vs = VirtualStageOf(so, rank, c);
          chunks.push_back({vs, 1, vs == 0, vs == so.pp * so.vp - 1});
        }
        LOOM_ASSIGN_OR_RETURN(std::unique_ptr<ClockModel> model,
                              ClockModel::Create(chunks, costs, SplitsBackward(so.kind)));
        LOOM_ASSIGN_OR_RETURN(Schedule schedule, BuildSchedule(so));
        ExecutorOptions options;
        options.micro_batch_size = 1;
        LOOM_ASSIGN_OR_RETURN(Executor exec,
                              Executor::Create(schedule, model.get(), groups.pp.get(), options));
        LOOM_RETURN_IF_ERROR(exec.RunStep(OneToken).status());
        idle[rank] = model->now() - model->busy();
        return absl::OkStatus();
      });
  if (!s.ok()) return s;
  return idle;
}

TEST(ExecutorTimingTest, IdleTimePerStageMatchesTheSimulator) {
  for (ScheduleKind kind : {ScheduleKind::k1F1B, ScheduleKind::kZBH1, ScheduleKind::kZBV,
                            ScheduleKind::kDualPipeV}) {
    for (const Costs costs : {Costs{1, 1, 1}, Costs{1, 1.5, 0.5}, Costs{2, 1, 1.5}}) {
      for (int pp : {2, 4}) {
        // The V: two chunks a stage over buffered links (the simulator's eager, tagged sends);
        // dualpipev needs M >= 2P.
        const bool v = IsVShape(kind);
        for (int m : {v ? 2 * pp : pp, 2 * pp + 1}) {
          const ScheduleOptions so{kind, pp, v ? 2 : 1, m, 0};
          const std::string what =
              absl::StrCat(ScheduleKindName(kind), " P=", pp, " M=", m, " F/I/W=", costs.f, "/",
                           costs.i, "/", costs.w);
          absl::StatusOr<std::vector<double>> executor = ExecutorIdle(so, costs);
          ASSERT_TRUE(executor.ok()) << what << ": " << executor.status();
          absl::StatusOr<Schedule> schedule = BuildSchedule(so);
          ASSERT_TRUE(schedule.ok()) << schedule.status();
          SimOptions sim;
          sim.forward_cost = costs.f;
          sim.backward_cost = costs.i + costs.w;
          sim.backward_input_cost = costs.i;
          sim.backward_weight_cost = costs.w;
          sim.tagged_channels = v;
          absl::StatusOr<SimResult> r = Simulate(*schedule, sim);
          ASSERT_TRUE(r.ok()) << r.status();
          double total = 0;
          for (int s = 0; s < pp; ++s) {
            const double want = r->stages[s].finish - r->stages[s].busy;
            const double got = (*executor)[s];
            total += got;
            // The issue asks for 10 %; on the virtual clock the two agree exactly.
            EXPECT_NEAR(got, want, 0.10 * std::max(want, 1.0)) << what << " stage " << s;
            EXPECT_DOUBLE_EQ(got, want) << what << " stage " << s;
          }
          EXPECT_GT(total, 0) << what << ": a pipeline has a bubble";
        }
      }
    }
  }
}

// The zero-bubble point, measured on the executor: at F = I = W the first stage of ZB-H1 idles
// a third of 1F1B's (Qi et al.: (P - 1)(F + I - W) against (P - 1)(F + I + W)).
TEST(ExecutorTimingTest, ZBH1IdlesAThirdOf1F1B) {
  const Costs equal{1, 1, 1};
  absl::StatusOr<std::vector<double>> one = ExecutorIdle({ScheduleKind::k1F1B, 4, 1, 8, 0}, equal);
  absl::StatusOr<std::vector<double>> zb = ExecutorIdle({ScheduleKind::kZBH1, 4, 1, 8, 0}, equal);
  ASSERT_TRUE(one.ok() && zb.ok());
  EXPECT_DOUBLE_EQ((*one)[0], 3 * 3.0);  // (P - 1)(F + B), B = I + W
  EXPECT_DOUBLE_EQ((*zb)[0], 3 * 1.0);   // (P - 1)(F + I - W)
}

}  // namespace
}  // namespace loom::pipeline
