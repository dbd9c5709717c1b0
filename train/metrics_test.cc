#include "train/metrics.h"

#include <fstream>
#include <cmath>
#include <sstream>

#include "gtest/gtest.h"

namespace loom::train {
namespace {

TEST(MetricsTest, FlopsFormula) {
  layers::GptConfig c;
  c.num_layers = 12;
  c.hidden_size = 768;
  c.num_attention_heads = 12;
  c.seq_length = 1024;
  c.vocab_size = 50257;
  c.max_position_embeddings = 1024;
  // GPT-2 small: 124.4M parameters.
  EXPECT_NEAR(layers::ParameterCount(c), 124.4e6, 0.1e6);
  EXPECT_DOUBLE_EQ(ModelFlopsPerToken(c),
                   6.0 * layers::ParameterCount(c) + 12.0 * 12 * 768 * 1024);
}

TEST(MetricsTest, JsonLines) {
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/m.jsonl";
  {
    auto f = MetricsFile::Open(path);
    ASSERT_TRUE(f.ok());
    StepMetrics m;
    m.iteration = 3;
    m.loss = 2.5;
    f->WriteStep(m);
    f->WriteEval(3, 2.75);
  }
  std::ifstream in(path);
  std::string a, b;
  std::getline(in, a);
  std::getline(in, b);
  EXPECT_NE(a.find("\"iteration\": 3, \"loss\": 2.500000"), std::string::npos) << a;
  EXPECT_EQ(b, "{\"iteration\": 3, \"valid_loss\": 2.750000}");
  EXPECT_FALSE(MetricsFile::Open("/nonexistent/dir/m.jsonl").ok());
}

TEST(MetricsTest, GemmRateIsMeasured) {
  const absl::StatusOr<double> flops = MeasureGemmFlops();
  ASSERT_TRUE(flops.ok()) << flops.status();
  EXPECT_GT(*flops, 0.0);
  EXPECT_TRUE(std::isfinite(*flops));
}

}  // namespace
}  // namespace loom::train
