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

core::MemoryStats SomeMemory() {
  core::MemoryStats s;
  s.peak = {int64_t{25} << 19, int64_t{25} << 19, int64_t{25} << 20, 3 << 20, 4 << 20, 1 << 20};
  s.current = {int64_t{25} << 19, int64_t{25} << 19, int64_t{25} << 20, 0, 4 << 20, 1 << 20};
  s.total_peak = int64_t{142} << 20;
  s.total_current = int64_t{55} << 20;
  return s;
}

TEST(MetricsTest, MemoryInTheLogLineAndTheJsonLine) {
  StepMetrics m;
  m.iteration = 3;
  EXPECT_EQ(FormatStep(m, 10).find("mem"), std::string::npos);  // no figures: not shown
  m.memory = SomeMemory();
  EXPECT_NE(FormatStep(m, 10).find(" | mem 142 MiB peak"), std::string::npos) << FormatStep(m, 10);
  m.memory_peak_max = int64_t{150} << 20;
  EXPECT_NE(FormatStep(m, 10).find(" | mem 142 MiB peak (max over ranks 150 MiB)"),
            std::string::npos)
      << FormatStep(m, 10);

  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/mem.jsonl";
  {
    auto f = MetricsFile::Open(path);
    ASSERT_TRUE(f.ok());
    f->WriteStep(m);
  }
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  EXPECT_NE(line.find("\"mem_peak_bytes\": 148897792, \"mem_peak_max_bytes\": 157286400"),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("\"mem_peak_by_category\": {\"parameters\": 13107200, \"gradients\": "
                      "13107200, \"optimizer\": 26214400, \"activations\": 3145728, "
                      "\"communication\": 4194304, \"other\": 1048576}}"),
            std::string::npos)
      << line;
}

TEST(MetricsTest, MemoryReportLine) {
  EXPECT_EQ(FormatMemory(" memory (rank 0, peak)", SomeMemory()),
            " memory (rank 0, peak): parameters 12.5 MiB, gradients 12.5 MiB, optimizer 25.0 MiB, "
            "activations 3.00 MiB (now 0 B), communication 4.00 MiB, other 1.00 MiB, total 142 MiB "
            "(now 55.0 MiB)");
  core::MemoryStats d = SomeMemory();
  d.reserved = int64_t{3} << 30;
  EXPECT_NE(FormatMemory("x", d).find(", reserved 3.00 GiB"), std::string::npos);
}

TEST(MetricsTest, GemmRateIsMeasured) {
  const absl::StatusOr<double> flops = MeasureGemmFlops();
  ASSERT_TRUE(flops.ok()) << flops.status();
  EXPECT_GT(*flops, 0.0);
  EXPECT_TRUE(std::isfinite(*flops));
}

}  // namespace
}  // namespace loom::train
