#ifndef LOOM_LAYERS_TEST_UTIL_H_
#define LOOM_LAYERS_TEST_UTIL_H_

// Helpers for the layer tests: TP ranks as threads of one process (the
// `local` backend), random inputs, and full-size views of sharded tensors.

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/comm.h"
#include "core/tensor.h"
#include "layers/attention.h"
#include "layers/params.h"
#include "layers/tp_group.h"

namespace loom::layers::testing {

// Runs fn(rank, comm) on `size` threads sharing a local world; returns the
// first error (fn's or the backend's) as "rank r: ...". The same as
// comm::testing::RunRanksAsThreads (//comm/testing:ranks_as_threads).
absl::Status RunRanks(int size, const std::function<absl::Status(int, comm::Communicator*)>& fn);

// Uniform in [-scale, scale), deterministic in seed.
core::Tensor RandomTensor(const core::Shape& shape, uint64_t seed, float scale = 1.0f);
// Token ids i32[s, b] in [0, vocab).
core::Tensor RandomIds(int64_t s, int64_t b, int64_t vocab, uint64_t seed);

// The full-size value (or gradient) of a parameter, gathered over TP: the
// global tensor in row-major order. Collective: every TP rank must call it.
absl::StatusOr<std::vector<float>> GatherFull(const Param& p, const TpGroup& tp, bool grad);

// max |a - b| / max(|b|_max, floor): a relative error over a whole tensor.
double MaxRelativeError(const std::vector<float>& a, const std::vector<float>& b,
                        double floor = 1e-6);

std::vector<float> ToVector(const core::Tensor& t);

// Hidden and attention dropout 0.1 (seed 7) with a stream of its own per step.
DropoutStream StepDropout(int step);

}  // namespace loom::layers::testing

#endif  // LOOM_LAYERS_TEST_UTIL_H_
