#include "core/cuda/test_util.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/cpu/convert.h"
#include "core/cpu/test_util.h"
#include "core/cuda/copy.h"
#include "core/cuda/runtime.h"

namespace loom::core::cuda::testing {
namespace {

template <typename T>
T OrDie(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::fprintf(stderr, "test_util: %s: %s\n", what, v.status().ToString().c_str());
    std::abort();
  }
  return *std::move(v);
}

void OrDie(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "test_util: %s: %s\n", what, s.ToString().c_str());
    std::abort();
  }
}

}  // namespace

absl::Status GpuStatus() {
  absl::StatusOr<int> n = VisibleDeviceCount();
  if (!n.ok()) return n.status();
  return SetCurrentDevice(0);
}

Tensor CpuEmpty(const Shape& shape, DType dtype) {
  return OrDie(Tensor::Empty(shape, dtype), "CPU allocation");
}

Tensor RoundedTo(const Tensor& f32, DType dtype) {
  Tensor out = CpuEmpty(f32.shape(), DType::kF32);
  if (dtype == DType::kF32) {
    std::memcpy(out.raw_data(), f32.raw_data(), f32.nbytes());
    return out;
  }
  Tensor low = CpuEmpty(f32.shape(), dtype);
  OrDie(cpu::Convert(f32, &low), "cpu::Convert");
  OrDie(cpu::Convert(low, &out), "cpu::Convert");
  return out;
}

Tensor Upload(const Tensor& t) { return OrDie(ToDevice(t, CurrentDevice()), "ToDevice"); }

Tensor ToGpu(const Tensor& f32, DType dtype) {
  if (dtype == DType::kF32) return Upload(f32);
  Tensor low = CpuEmpty(f32.shape(), dtype);
  OrDie(cpu::Convert(f32, &low), "cpu::Convert");
  return Upload(low);
}

Tensor Poisoned(const Shape& shape, DType dtype) {
  Tensor t = OrDie(Tensor::Empty(shape, dtype, Device::CUDA(CurrentDevice())), "CUDA allocation");
  OrDie(FillBytes(&t, 0xff), "FillBytes");
  return t;
}

Tensor Download(const Tensor& t) { return OrDie(ToHost(t), "ToHost"); }

Tensor ToCpuF32(const Tensor& t) {
  Tensor host = t.device().is_cpu() ? t : Download(t);
  if (host.dtype() == DType::kF32) return host;
  Tensor out = CpuEmpty(host.shape(), DType::kF32);
  OrDie(cpu::Convert(host, &out), "cpu::Convert");
  return out;
}

double RelError(const Tensor& got, const Tensor& want) {
  return cpu::testing::RelError(got, cpu::testing::ToDouble(want));
}

double Tol(DType dtype, double f32_tol, double bf16_tol) {
  return dtype == DType::kF32 ? f32_tol : bf16_tol;
}

}  // namespace loom::core::cuda::testing
