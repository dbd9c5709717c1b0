#include "core/tensor.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace loom::core {

absl::StatusOr<Tensor> Tensor::Empty(const Shape& shape, DType dtype, Device device) {
  size_t bytes = static_cast<size_t>(shape.numel()) * DTypeSize(dtype);
  absl::StatusOr<std::shared_ptr<Storage>> storage = Storage::Allocate(bytes, device);
  if (!storage.ok()) return storage.status();
  return Tensor(*std::move(storage), 0, shape, dtype);
}

absl::StatusOr<Tensor> Tensor::Zeros(const Shape& shape, DType dtype, Device device) {
  if (!device.is_cpu()) {
    return absl::UnimplementedError("Tensor::Zeros on " + device.ToString() +
                                    ": use the device library's fill");
  }
  absl::StatusOr<Tensor> t = Empty(shape, dtype, device);
  if (t.ok()) std::memset(t->raw_data(), 0, t->nbytes());
  return t;
}

absl::StatusOr<Tensor> Tensor::Narrow(int64_t start, int64_t length) const {
  if (rank() < 1) {
    return absl::InvalidArgumentError("Narrow: a rank-0 tensor has no dim 0 to narrow");
  }
  if (start < 0 || length < 0 || start + length > dim(0)) {
    return absl::OutOfRangeError(absl::StrCat("Narrow(start=", start, ", length=", length,
                                              ") is outside dim 0 of ", DebugString()));
  }
  int64_t dims[Shape::kMaxRank];
  for (int i = 0; i < rank(); ++i) dims[i] = dim(i);
  dims[0] = length;
  absl::StatusOr<Shape> shape = Shape::Make(dims, rank());
  if (!shape.ok()) return shape.status();
  int64_t row = dim(0) == 0 ? 0 : numel() / dim(0);
  return Tensor(storage_, offset_ + static_cast<size_t>(start * row) * DTypeSize(dtype_), *shape,
                dtype_);
}

absl::StatusOr<Tensor> Tensor::Reshape(const Shape& shape) const {
  if (shape.numel() != numel()) {
    return absl::InvalidArgumentError(absl::StrCat("Reshape of ", DebugString(), " to ",
                                                   shape.ToString(), ": element counts differ (",
                                                   numel(), " vs ", shape.numel(), ")"));
  }
  return Tensor(storage_, offset_, shape, dtype_);
}

absl::StatusOr<Tensor> Tensor::View(int64_t offset, const Shape& shape) const {
  if (offset < 0 || offset + shape.numel() > numel()) {
    return absl::OutOfRangeError(absl::StrCat("View(offset=", offset, ", shape=",
                                              shape.ToString(), ") is outside ", DebugString()));
  }
  return Tensor(storage_, offset_ + static_cast<size_t>(offset) * DTypeSize(dtype_), shape,
                dtype_);
}

absl::StatusOr<Tensor> Tensor::FromStorage(std::shared_ptr<Storage> storage, size_t offset,
                                           const Shape& shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * DTypeSize(dtype);
  if (storage == nullptr || offset > storage->bytes() || bytes > storage->bytes() - offset) {
    return absl::OutOfRangeError(absl::StrCat(
        "FromStorage: ", DTypeName(dtype), shape.ToString(), " at byte ", offset,
        " does not fit storage of ", storage ? storage->bytes() : 0, " bytes"));
  }
  return Tensor(std::move(storage), offset, shape, dtype);
}

absl::StatusOr<Tensor> Tensor::Clone() const { return To(device()); }

absl::StatusOr<Tensor> Tensor::To(Device target) const {
  if (!defined()) return absl::FailedPreconditionError("copy of an undefined tensor");
  absl::StatusOr<Tensor> copy = Empty(shape_, dtype_, target);
  if (!copy.ok()) return copy.status();
  if (device().is_cpu() && target.is_cpu()) {
    std::memcpy(copy->raw_data(), raw_data(), nbytes());
    return copy;
  }
  // The non-CPU side's allocator knows how to move the bytes.
  Allocator* allocator = GetAllocator(device().is_cpu() ? target.type : device().type);
  if (allocator == nullptr) {
    return absl::FailedPreconditionError("copy of " + DebugString() + " to " + target.ToString() +
                                         ": no allocator is registered for the device");
  }
  absl::Status s = allocator->CopyBytes(copy->raw_data(), target, raw_data(), device(), nbytes());
  if (!s.ok()) return s;
  return copy;
}

std::string Tensor::DebugString() const {
  return absl::StrCat(DTypeName(dtype_), shape_.ToString(), " ", device().ToString());
}

void Tensor::CheckDType(DType expected) const {
  if (dtype_ != expected) {
    std::fprintf(stderr, "loom: typed access as %s to a tensor of %s\n", DTypeName(expected),
                 DebugString().c_str());
    std::abort();
  }
}

absl::Status CheckDTypeIs(const char* op, const char* arg, const Tensor& t, DType dtype) {
  if (!t.defined()) return absl::InvalidArgumentError(absl::StrCat(op, ": ", arg, " is undefined"));
  if (t.dtype() != dtype) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", arg, " is ", t.DebugString(),
                                                   ", expected dtype ", DTypeName(dtype)));
  }
  return absl::OkStatus();
}

absl::Status CheckRank(const char* op, const char* arg, const Tensor& t, int rank) {
  if (t.rank() != rank) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", arg, " is ", t.DebugString(), ", expected rank ", rank));
  }
  return absl::OkStatus();
}

absl::Status CheckSameShape(const char* op, const char* a_name, const Tensor& a,
                            const char* b_name, const Tensor& b) {
  if (a.shape() != b.shape()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", a_name, " ", a.shape().ToString(),
                                                   " and ", b_name, " ", b.shape().ToString(),
                                                   " must have the same shape"));
  }
  return absl::OkStatus();
}

absl::Status CheckCpu(const char* op, const char* arg, const Tensor& t) {
  if (!t.device().is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", arg, " is on ", t.device().ToString(), ", expected cpu"));
  }
  return absl::OkStatus();
}

}  // namespace loom::core
