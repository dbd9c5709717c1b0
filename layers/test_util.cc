#include "layers/test_util.h"

#include <cmath>
#include <random>

#include "comm/testing/ranks_as_threads.h"
#include "layers/mappings.h"

namespace loom::layers::testing {

using core::Shape;
using core::Tensor;

absl::Status RunRanks(int size, const std::function<absl::Status(int, comm::Communicator*)>& fn) {
  return comm::testing::RunRanksAsThreads(size, fn);
}

Tensor RandomTensor(const Shape& shape, uint64_t seed, float scale) {
  Tensor t = *Tensor::Empty(shape, core::DType::kF32);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

Tensor RandomIds(int64_t s, int64_t b, int64_t vocab, uint64_t seed) {
  Tensor t = *Tensor::Empty(Shape{s, b}, core::DType::kI32);
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>(rng() % vocab);
  return t;
}

std::vector<float> ToVector(const Tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

absl::StatusOr<std::vector<float>> GatherFull(const Param& p, const TpGroup& tp, bool grad) {
  const Tensor& local = grad ? p.grad : p.value;
  Tensor full = local;
  if (p.spec->split == TpSplit::kRows) {
    auto g = AllGatherSeq(tp, local);  // dim-0 blocks concatenate: the global layout
    if (!g.ok()) return g.status();
    full = *g;
  } else if (p.spec->split == TpSplit::kCols) {
    auto g = GatherLastDim(tp, local);
    if (!g.ok()) return g.status();
    full = *g;
  }
  return ToVector(full);
}

double MaxRelativeError(const std::vector<float>& a, const std::vector<float>& b, double floor) {
  double max_ref = floor, max_diff = 0;
  for (size_t i = 0; i < b.size(); ++i) max_ref = std::max(max_ref, std::fabs(double(b[i])));
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    max_diff = std::max(max_diff, std::fabs(double(a[i]) - double(b[i])));
  }
  if (a.size() != b.size()) return INFINITY;
  return max_diff / max_ref;
}

DropoutStream StepDropout(int step) {
  DropoutStream d;
  d.hidden_p = 0.1f;
  d.attention_p = 0.1f;
  d.seed = 7;
  d.stream = 1000 + step;
  return d;
}

}  // namespace loom::layers::testing
