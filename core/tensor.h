#ifndef LOOM_CORE_TENSOR_H_
#define LOOM_CORE_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/shape.h"
#include "core/storage.h"

namespace loom::core {

// A dense, contiguous, row-major tensor: shape + dtype + a byte offset into
// reference-counted storage. Views (Narrow along dim 0, Reshape) share the
// storage, so a tensor is cheap to copy and a view of a parameter buffer
// writes through to it. An empty Tensor() has no storage (defined() false).
class Tensor {
 public:
  Tensor() = default;

  // Uninitialised memory (CPU: 64-byte aligned).
  static absl::StatusOr<Tensor> Empty(const Shape& shape, DType dtype,
                                      Device device = Device::CPU());
  static absl::StatusOr<Tensor> Zeros(const Shape& shape, DType dtype,
                                      Device device = Device::CPU());

  // A tensor over existing storage (e.g. Storage::Borrow) at byte `offset`;
  // OutOfRange when shape x dtype does not fit.
  static absl::StatusOr<Tensor> FromStorage(std::shared_ptr<Storage> storage, size_t offset,
                                            const Shape& shape, DType dtype);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  int64_t dim(int i) const { return shape_.dim(i); }
  int64_t numel() const { return shape_.numel(); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::CPU(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }
  size_t storage_offset_bytes() const { return offset_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  void* raw_data() const {
    return storage_ ? static_cast<char*>(storage_->data()) + offset_ : nullptr;
  }
  // Typed access; the dtype must match T (checked: aborts on misuse, a bug).
  template <typename T>
  T* data() const {
    CheckDType(DTypeOf<T>::value);
    return static_cast<T*>(raw_data());
  }

  // Rows [start, start + length) along dim 0; shares storage.
  absl::StatusOr<Tensor> Narrow(int64_t start, int64_t length) const;
  // Same elements, new shape (numel must match); shares storage.
  absl::StatusOr<Tensor> Reshape(const Shape& shape) const;
  // A view of `numel` elements at element offset `offset`, with `shape`;
  // the building block for views into one contiguous parameter buffer.
  absl::StatusOr<Tensor> View(int64_t offset, const Shape& shape) const;

  // Deep copy into new storage on the same device.
  absl::StatusOr<Tensor> Clone() const;
  // Deep copy onto `device` (host <-> device through the device's Allocator).
  absl::StatusOr<Tensor> To(Device device) const;
  // True if both views share storage.
  bool SharesStorageWith(const Tensor& other) const { return storage_ == other.storage_; }

  std::string DebugString() const;  // "f32[2, 3] cpu"

 private:
  Tensor(std::shared_ptr<Storage> storage, size_t offset, Shape shape, DType dtype)
      : storage_(std::move(storage)), offset_(offset), shape_(shape), dtype_(dtype) {}
  void CheckDType(DType expected) const;

  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes
  Shape shape_;
  DType dtype_ = DType::kF32;
};

// Error helpers shared by kernels: they name the op and the offending shapes.
absl::Status CheckDTypeIs(const char* op, const char* arg, const Tensor& t, DType dtype);
absl::Status CheckRank(const char* op, const char* arg, const Tensor& t, int rank);
absl::Status CheckSameShape(const char* op, const char* a_name, const Tensor& a,
                            const char* b_name, const Tensor& b);
absl::Status CheckCpu(const char* op, const char* arg, const Tensor& t);

}  // namespace loom::core

#endif  // LOOM_CORE_TENSOR_H_
