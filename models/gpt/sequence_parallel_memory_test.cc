// A measurement, not a timing: with sequence parallelism, the activations a
// rank keeps for LayerNorm (inputs, means, rstds) and dropout regions are
// 1/TP of the TP-only layout. Prints the bytes.
#include <cstdio>

#include "gtest/gtest.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/test_util.h"

namespace loom::layers {
namespace {

int64_t Bytes(const core::Tensor& t) { return t.defined() ? t.nbytes() : 0; }

int64_t LayerNormBytes(const GptModel::Saved& s) {
  int64_t n = Bytes(s.final_norm.input) + Bytes(s.final_norm.mean) + Bytes(s.final_norm.rstd);
  for (const auto& b : s.blocks) {
    n += Bytes(b.ln1.input) + Bytes(b.ln1.mean) + Bytes(b.ln1.rstd) + Bytes(b.ln2.input) +
         Bytes(b.ln2.mean) + Bytes(b.ln2.rstd);
  }
  return n;
}

TEST(SequenceParallelMemoryTest, LayerNormActivationsShrinkByTp) {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.seq_length = 32;
  c.vocab_size = 64;
  for (int tp : {2, 4}) {
    int64_t bytes[2] = {0, 0};
    for (bool sp : {false, true}) {
      absl::Status s = testing::RunRanks(tp, [&](int r, comm::Communicator* comm) -> absl::Status {
        auto model = GptModel::Create(c, TpGroup{comm, sp});
        if (!model.ok()) return model.status();
        GptModel::Saved saved;
        double loss;
        core::Tensor ids = testing::RandomIds(c.seq_length, 2, c.vocab_size, 1);
        absl::Status f = (*model)->Forward(0, ids, ids, DropoutStream{}, &saved, &loss).status();
        if (r == 0) bytes[sp] = LayerNormBytes(saved);
        return f;
      });
      ASSERT_TRUE(s.ok()) << s;
    }
    std::printf("TP=%d: LayerNorm activations per rank: %lld bytes without SP, %lld with SP\n", tp,
                static_cast<long long>(bytes[0]), static_cast<long long>(bytes[1]));
    EXPECT_EQ(bytes[0], tp * bytes[1]);
  }
}

}  // namespace
}  // namespace loom::layers
