#include "core/cuda/test_util.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "core/cpu/convert.h"
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

Tensor Random(const Shape& shape, uint64_t seed, float lo, float hi) {
  Tensor t = CpuEmpty(shape, DType::kF32);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

Tensor FromValues(const Shape& shape, const std::vector<float>& values) {
  Tensor t = CpuEmpty(shape, DType::kF32);
  if (static_cast<int64_t>(values.size()) != t.numel()) std::abort();
  std::copy(values.begin(), values.end(), t.data<float>());
  return t;
}

Tensor Ids(const Shape& shape, DType dtype, const std::vector<int64_t>& values) {
  Tensor t = CpuEmpty(shape, dtype);
  if (static_cast<int64_t>(values.size()) != t.numel()) std::abort();
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kI32) {
      t.data<int32_t>()[i] = static_cast<int32_t>(values[i]);
    } else {
      t.data<int64_t>()[i] = values[i];
    }
  }
  return t;
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
  if (got.numel() != want.numel()) return INFINITY;
  const float* g = got.data<float>();
  const float* w = want.data<float>();
  double max_err = 0.0, max_ref = 0.0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double e = std::fabs(static_cast<double>(g[i]) - w[i]);
    if (!(e <= max_err)) max_err = std::isnan(e) ? INFINITY : e;
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(w[i])));
  }
  return max_ref == 0.0 ? max_err : max_err / max_ref;
}

double Tol(DType dtype, double f32_tol, double bf16_tol) {
  return dtype == DType::kF32 ? f32_tol : bf16_tol;
}

::testing::AssertionResult IsInvalidArgument(const absl::Status& status,
                                             const std::vector<std::string>& needles) {
  if (status.code() != absl::StatusCode::kInvalidArgument) {
    return ::testing::AssertionFailure() << "expected InvalidArgument, got " << status;
  }
  for (const std::string& n : needles) {
    if (status.message().find(n) == absl::string_view::npos) {
      return ::testing::AssertionFailure() << "message lacks \"" << n << "\": " << status;
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace loom::core::cuda::testing
