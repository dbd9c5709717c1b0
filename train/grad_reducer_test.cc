// --overlap-grad-reduce gives the same averaged gradients as reducing the
// whole buffer after the backward, and starts the layer buckets early.
#include "train/grad_reducer.h"

#include "gtest/gtest.h"
#include "layers/test_util.h"
#include "train/optimizer.h"

namespace loom::train {
namespace {

using core::Tensor;

TEST(OverlappedGradReducerTest, MatchesReducingAfterTheBackward) {
  layers::GptConfig c;
  c.num_layers = 3;
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.seq_length = 8;
  c.vocab_size = 30;
  c.make_vocab_size_divisible_by = 2;
  const int micro_batches = 3;
  absl::Status s = layers::testing::RunRanks(2, [&](int r, comm::Communicator* dp) -> absl::Status {
    std::vector<float> grads[2];
    for (int overlap = 0; overlap < 2; ++overlap) {
      auto model = layers::GptModel::Create(c, layers::TpGroup{});
      if (!model.ok()) return model.status();
      auto opt = Optimizer::Create(&(*model)->params(), {}, OptimizerGroups{nullptr, nullptr, dp});
      if (!opt.ok()) return opt.status();
      std::unique_ptr<OverlappedGradReducer> reducer;
      if (overlap) reducer = std::make_unique<OverlappedGradReducer>(model->get(), dp, micro_batches);
      for (int m = 0; m < micro_batches; ++m) {
        Tensor ids = layers::testing::RandomIds(c.seq_length, 2, c.vocab_size, 10 * r + m);
        layers::GptModel::Saved saved;
        double loss;
        absl::Status f = (*model)->Forward(0, ids, ids, {}, &saved, &loss).status();
        if (!f.ok()) return f;
        absl::Status b = (*model)->Backward(0, Tensor(), 1.0f / micro_batches, {}, saved).status();
        if (!b.ok()) return b;
      }
      if (overlap) {
        EXPECT_EQ(reducer->buckets_started_early(), c.num_layers);
        absl::Status fin = reducer->Finish();
        if (!fin.ok()) return fin;
      }
      auto norm = (*opt)->ReduceGradients(/*already_averaged=*/overlap == 1);
      if (!norm.ok()) return norm.status();
      grads[overlap] = layers::testing::ToVector((*model)->params().flat_grads());
    }
    EXPECT_LT(layers::testing::MaxRelativeError(grads[1], grads[0]), 1e-6) << "rank " << r;
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace loom::train
