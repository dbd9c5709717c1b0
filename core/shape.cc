#include "core/shape.h"

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom::core {

Shape::Shape(std::initializer_list<int64_t> dims) {
  absl::StatusOr<Shape> s = Make(dims.begin(), static_cast<int>(dims.size()));
  if (!s.ok()) {
    std::fprintf(stderr, "loom: invalid Shape literal: %s\n", s.status().ToString().c_str());
    std::abort();
  }
  *this = *s;
}

absl::StatusOr<Shape> Shape::Make(const int64_t* dims, int rank) {
  if (rank < 0 || rank > kMaxRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape rank ", rank, " is out of range: expected 0..", kMaxRank));
  }
  Shape s;
  s.rank_ = rank;
  for (int i = 0; i < rank; ++i) {
    if (dims[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape dimension ", i, " is ", dims[i], ": expected >= 0"));
    }
    s.dims_[i] = dims[i];
  }
  return s;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[i];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i) {
    if (dims_[i] != o.dims_[i]) return false;
  }
  return true;
}

std::string Shape::ToString() const {
  return absl::StrCat("[", absl::StrJoin(dims_.begin(), dims_.begin() + rank_, ", "), "]");
}

}  // namespace loom::core
