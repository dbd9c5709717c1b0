#include "core/cuda/check_args.h"

#include "absl/strings/str_cat.h"
#include "core/cpu/philox.h"
#include "core/cuda/runtime.h"

namespace loom::core::cuda::internal {
namespace {

absl::Status Undefined(const char* op, const char* arg) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", arg, " is undefined"));
}

}  // namespace

absl::Status CheckFloat(const char* op, const char* arg, const Tensor& t) {
  if (!t.defined()) return Undefined(op, arg);
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", arg, " is ", t.DebugString(), ", expected dtype f32 or bf16"));
  }
  return absl::OkStatus();
}

absl::Status CheckFloatOut(const char* op, const char* arg, const Tensor* t) {
  if (t == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": output ", arg, " is null (the caller allocates outputs)"));
  }
  return CheckFloat(op, arg, *t);
}

absl::Status CheckIs(const char* op, const char* arg, const Tensor* t, DType dtype) {
  if (t == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": output ", arg, " is null (the caller allocates outputs)"));
  }
  return CheckDTypeIs(op, arg, *t, dtype);
}

absl::Status CheckIds(const char* op, const char* arg, const Tensor& t) {
  if (!t.defined()) return Undefined(op, arg);
  if (t.dtype() != DType::kI32 && t.dtype() != DType::kI64) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", arg, " is ", t.DebugString(), ", expected dtype i32 or i64"));
  }
  return absl::OkStatus();
}

absl::Status CheckSameDType(const char* op, const char* a_name, const Tensor& a,
                            const char* b_name, const Tensor& b) {
  if (a.dtype() != b.dtype()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", b_name, " is ", b.DebugString(),
                                                   " but ", a_name, " is ", a.DebugString(),
                                                   ": expected the same dtype"));
  }
  return absl::OkStatus();
}

absl::Status CheckSameOrF32(const char* op, const char* a_name, const Tensor& a,
                            const char* b_name, const Tensor& b) {
  if (b.dtype() != a.dtype() && b.dtype() != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", b_name, " is ", b.DebugString(),
                                                   ", expected f32 or the dtype of ", a_name, " ",
                                                   a.DebugString()));
  }
  return absl::OkStatus();
}

absl::Status CheckRows(const char* op, const char* what, int64_t rows) {
  if (rows >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", rows, " ", what, " exceed the 2^31 - 1 blocks of one CUDA grid"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CheckColumnChunks(const char* op, const char* arg, const Tensor& t,
                                          int64_t rows) {
  const int64_t chunks = kernels::ColumnChunks(rows);
  if (chunks > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", arg, " ", t.DebugString(), " has ",
                                                   rows, " rows; at most ",
                                                   65535 * kernels::kColumnChunkRows,
                                                   " are supported"));
  }
  return chunks;
}

absl::Status CheckAlike(const char* op, std::initializer_list<Arg> args) {
  for (const Arg& a : args) LOOM_RETURN_IF_ERROR(CheckFloatOut(op, a.name, a.t));
  const Arg& first = *args.begin();
  for (const Arg& a : args) LOOM_RETURN_IF_ERROR(CheckSameDType(op, first.name, *first.t, a.name, *a.t));
  for (const Arg& a : args) LOOM_RETURN_IF_ERROR(CheckSameShape(op, first.name, *first.t, a.name, *a.t));
  return absl::OkStatus();
}

absl::Status CheckDevices(const char* op, std::initializer_list<Arg> args) {
  const Arg* first = nullptr;
  for (const Arg& a : args) {
    if (a.t == nullptr || !a.t->defined()) continue;  // optional arguments
    if (a.t->device().type != DeviceType::kCUDA) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": ", a.name, " is ", a.t->DebugString(),
          ", expected a CUDA tensor (copy it with cuda::ToDevice, or use core/cpu)"));
    }
    if (first == nullptr) {
      first = &a;
      continue;
    }
    if (a.t->device() != first->t->device()) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": ", a.name, " is ", a.t->DebugString(),
                                                     " but ", first->name, " is ",
                                                     first->t->DebugString(),
                                                     ": all tensors must be on one device"));
    }
  }
  if (first != nullptr && first->t->device().index != CurrentDevice()) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", first->name, " is ", first->t->DebugString(),
        " but the calling thread's current device is cuda:", CurrentDevice(),
        " (call SetCurrentDevice first)"));
  }
  return absl::OkStatus();
}

kernels::AttentionMask AttentionMaskOf(const ops::AttentionDropout& dr, int64_t heads) {
  kernels::AttentionMask m;
  m.dropout = dr.p > 0.0f;
  m.params.seed = dr.seed;
  m.params.offset = dr.offset;
  m.params.threshold = cpu::DropoutThreshold(dr.p);
  m.params.scale = dr.p >= 1.0f ? 0.0f : 1.0f / (1.0f - dr.p);
  m.heads = heads;
  m.total_heads = dr.total_heads == 0 ? heads : dr.total_heads;
  m.head_offset = dr.head_offset;
  return m;
}

const void* ElementAt(const Tensor& t, int64_t elems) {
  return static_cast<const char*>(t.raw_data()) + elems * static_cast<int64_t>(DTypeSize(t.dtype()));
}
void* ElementAt(Tensor* t, int64_t elems) {
  return static_cast<char*>(t->raw_data()) + elems * static_cast<int64_t>(DTypeSize(t->dtype()));
}

kernels::Elem ElemOf(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return kernels::Elem::kBF16;
    case DType::kF16:
      return kernels::Elem::kF16;
    default:
      return kernels::Elem::kF32;
  }
}

kernels::Index IndexOf(DType dtype) {
  return dtype == DType::kI32 ? kernels::Index::kI32 : kernels::Index::kI64;
}

absl::StatusOr<cudaStream_t> Stream() { return CurrentStream(); }

absl::Status Launched(const char* op, cudaError_t err) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(op, ": CUDA kernel launch failed: ",
                                          cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

absl::StatusOr<Tensor> Scratch(const Shape& shape, DType dtype) {
  return Tensor::Empty(shape, dtype, Device::CUDA(CurrentDevice()));
}

}  // namespace loom::core::cuda::internal
