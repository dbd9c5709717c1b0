#ifndef LOOM_CORE_SHAPE_H_
#define LOOM_CORE_SHAPE_H_

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/status/statusor.h"

namespace loom::core {

// A tensor shape of rank 0 to 4 (a GPT needs no more: [s, b, heads, d]).
class Shape {
 public:
  static constexpr int kMaxRank = 4;

  Shape() = default;  // rank 0: a scalar of one element
  // Crashes on rank > 4 or a negative dimension: use Make() for untrusted input.
  Shape(std::initializer_list<int64_t> dims);
  static absl::StatusOr<Shape> Make(const int64_t* dims, int rank);

  int rank() const { return rank_; }
  int64_t dim(int i) const { return dims_[i]; }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t numel() const;
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string ToString() const;  // "[2, 3]"

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

}  // namespace loom::core

#endif  // LOOM_CORE_SHAPE_H_
