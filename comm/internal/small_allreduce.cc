#include "comm/internal/small_allreduce.h"

#include <cstring>

#include "comm/internal/reduce.h"

namespace loom::comm::internal {

size_t SmallAllReduce::StageBytes(int size, size_t bytes) {
  return (size & (size - 1)) == 0 ? bytes : bytes * size;
}

SmallAllReduce::SmallAllReduce(int rank, int size, char* dst, char* stage, size_t bytes,
                               int64_t count, core::DType dtype, ReduceOp op)
    : rank_(rank),
      size_(size),
      dst_(dst),
      stage_(stage),
      bytes_(bytes),
      count_(count),
      dtype_(dtype),
      op_(op) {}

int SmallAllReduce::steps() const {
  return pow2() ? __builtin_ctz(static_cast<unsigned>(size_)) : 1;
}

SmallAllReduce::Legs SmallAllReduce::StepLegs(int i) const {
  if (pow2()) {
    const int partner = rank_ ^ (1 << i);
    return {{true, partner, i, dst_, bytes_}, {false, partner, i, stage_, bytes_}};
  }
  Legs legs;
  for (int j = 0; j < size_; ++j) {
    if (j == rank_) continue;
    legs.push_back({true, j, 0, dst_, bytes_});
    legs.push_back({false, j, 0, stage_ + j * bytes_, bytes_});
  }
  return legs;
}

void SmallAllReduce::Finish(int) const {
  if (pow2()) {
    // Both partners combine the same two operands, and a ⊕ b == b ⊕ a
    // bitwise for every op and dtype here: the results stay identical.
    ReduceInto(dst_, stage_, count_, dtype_, op_);
    return;
  }
  std::memcpy(stage_ + rank_ * bytes_, dst_, bytes_);
  std::memcpy(dst_, stage_, bytes_);
  for (int j = 1; j < size_; ++j) ReduceInto(dst_, stage_ + j * bytes_, count_, dtype_, op_);
}

}  // namespace loom::comm::internal
