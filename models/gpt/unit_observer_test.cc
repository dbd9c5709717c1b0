// The model's unit events (layers/stage_model.h's UnitObserver): every unit's
// forward is BeforeForward .. AfterForward and its backward BeforeBackward ..
// AfterBackward, in forward and reverse order; a recomputed run's units all
// begin their backward before its recomputed forward (which sends no forward
// events); before-events reach observers in the order they were added,
// after-events in reverse; a removed observer hears nothing; an observer's
// error is the model's.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/test_util.h"

namespace loom::layers {
namespace {

using core::Tensor;

GptConfig Config() {
  GptConfig c;
  c.num_layers = 3;
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.seq_length = 4;
  c.vocab_size = 20;
  return c;
}

// Writes "<name>:<event><unit>" per event: F/f before/after forward, B/b
// before/after backward; unit -1 is the embedding, 3 the head.
class Recorder : public UnitObserver {
 public:
  Recorder(std::string name, std::vector<std::string>* log) : name_(name), log_(log) {}
  absl::Status BeforeForward(int64_t u) override { return Add("F", u); }
  absl::Status AfterForward(int64_t u) override { return Add("f", u); }
  absl::Status BeforeBackward(int64_t u) override { return Add("B", u); }
  absl::Status AfterBackward(int64_t u) override { return Add("b", u); }
  int64_t fail_on_before_backward = -100;

 private:
  absl::Status Add(const char* e, int64_t u) {
    log_->push_back(absl::StrCat(name_, ":", e, u));
    if (e[0] == 'B' && u == fail_on_before_backward) {
      return absl::AbortedError(absl::StrCat(name_, " refuses unit ", u));
    }
    return absl::OkStatus();
  }
  std::string name_;
  std::vector<std::string>* log_;
};

absl::Status Step(GptModel& m) {
  const GptConfig& c = m.config();
  Tensor ids = testing::RandomIds(c.seq_length, 2, c.vocab_size, 7);
  auto saved = m.NewActivations();
  double loss = 0;
  LOOM_RETURN_IF_ERROR(m.Forward(0, ids, ids, testing::StepDropout(0), saved.get(), &loss).status());
  return m.Backward(0, Tensor(), 1.0f, testing::StepDropout(0), *saved).status();
}

std::vector<std::string> Only(const std::vector<std::string>& log, const std::string& name) {
  std::vector<std::string> out;
  for (const std::string& e : log) {
    if (e.rfind(name + ":", 0) == 0) out.push_back(e.substr(name.size() + 1));
  }
  return out;
}

// The events one observer hears in a training step of `config`'s model.
std::vector<std::string> EventsOf(const GptConfig& config) {
  auto m = GptModel::Create(config, TpGroup{});
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return {};
  std::vector<std::string> log;
  Recorder a("a", &log);
  (*m)->AddObserver(&a);
  const absl::Status s = Step(**m);
  EXPECT_TRUE(s.ok()) << s;
  return Only(log, "a");
}

TEST(UnitObserverTest, EveryUnitForwardThenBackwardInReverse) {
  const std::vector<std::string> want = {"F-1", "f-1", "F0", "f0", "F1", "f1", "F2", "f2",
                                         "F3",  "f3",  "B3", "b3", "B2", "b2", "B1", "b1",
                                         "B0",  "b0",  "B-1", "b-1"};
  EXPECT_EQ(EventsOf(Config()), want);
}

TEST(UnitObserverTest, ARecomputedRunBeginsEveryBackwardBeforeItsForwardRunsAgain) {
  GptConfig c = testing::Recompute{"full", "uniform", 2}.Apply(Config());  // runs {0, 1}, {2}
  const std::vector<std::string> want = {"F-1", "f-1", "F0", "f0", "F1", "f1", "F2", "f2",
                                         "F3",  "f3",  "B3", "b3", "B2", "b2", "B1", "B0",
                                         "b1",  "b0",  "B-1", "b-1"};
  EXPECT_EQ(EventsOf(c), want);
}

TEST(UnitObserverTest, LaterObserversNestInsideEarlierOnesAndRemovedOnesHearNothing) {
  auto m = GptModel::Create(Config(), TpGroup{});
  ASSERT_TRUE(m.ok()) << m.status();
  std::vector<std::string> log;
  Recorder outer("outer", &log), inner("inner", &log), gone("gone", &log);
  (*m)->AddObserver(&outer);
  (*m)->AddObserver(&gone);
  (*m)->AddObserver(&inner);
  (*m)->RemoveObserver(&gone);
  ASSERT_TRUE(Step(**m).ok());
  ASSERT_GE(log.size(), 4u);
  EXPECT_EQ(log[0], "outer:F-1");
  EXPECT_EQ(log[1], "inner:F-1");
  EXPECT_EQ(log[2], "inner:f-1");
  EXPECT_EQ(log[3], "outer:f-1");
  EXPECT_TRUE(Only(log, "gone").empty());
  EXPECT_EQ(Only(log, "inner"), Only(log, "outer"));
}

TEST(UnitObserverTest, AnObserversErrorIsTheModels) {
  auto m = GptModel::Create(Config(), TpGroup{});
  ASSERT_TRUE(m.ok()) << m.status();
  std::vector<std::string> log;
  Recorder a("a", &log);
  a.fail_on_before_backward = 1;
  (*m)->AddObserver(&a);
  const absl::Status s = Step(**m);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_EQ(Only(log, "a").back(), "B1");  // nothing after the refusal
}

}  // namespace
}  // namespace loom::layers
