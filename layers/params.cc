#include "layers/params.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "core/cpu/philox.h"
#include "core/ops/ops.h"
#include "core/status_macros.h"

namespace loom::layers {
namespace {

// A stable 64-bit hash of the name (FNV-1a): absl::Hash is salted per process.
uint64_t NameKey(const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

float InitialValue(const ParamSpec& spec, uint64_t seed, int64_t index) {
  switch (spec.init) {
    case Init::kZeros:
      return 0.0f;
    case Init::kOnes:
      return 1.0f;
    case Init::kNormal:
    case Init::kScaledNormal: {
      // Box-Muller over two words of the Philox block at (name, index), keyed by seed.
      const uint64_t name = NameKey(spec.name), i = static_cast<uint64_t>(index);
      const core::cpu::PhiloxCounter block = core::cpu::Philox4x32_10(
          {static_cast<uint32_t>(i), static_cast<uint32_t>(i >> 32), static_cast<uint32_t>(name),
           static_cast<uint32_t>(name >> 32)},
          {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
      const uint32_t w0 = block[0], w1 = block[1];
      const double u1 = (static_cast<double>(w0) + 1.0) / 4294967297.0;  // (0, 1)
      const double u2 = static_cast<double>(w1) / 4294967296.0;
      const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
      return static_cast<float>(spec.std * z);
    }
  }
  return 0.0f;
}

absl::StatusOr<ParamBuffer> ParamBuffer::Create(std::vector<ParamSpec> specs, int tp_rank,
                                                int tp_size, uint64_t seed, int64_t multiple,
                                                core::Device device, core::DType compute_dtype,
                                                bool gradients, bool values) {
  if (compute_dtype != core::DType::kF32 && compute_dtype != core::DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("ParamBuffer: compute dtype ",
                                                   core::DTypeName(compute_dtype),
                                                   ", expected f32 or bf16"));
  }
  ParamBuffer buf;
  buf.specs_ = std::move(specs);
  int64_t total = 0;
  std::vector<core::Shape> local_shapes;
  std::vector<int64_t> starts;
  for (const ParamSpec& spec : buf.specs_) {
    const core::Shape& g = spec.global_shape;
    int dim = spec.split == TpSplit::kRows ? 0 : spec.split == TpSplit::kCols ? 1 : -1;
    int64_t dims[core::Shape::kMaxRank];
    for (int i = 0; i < g.rank(); ++i) dims[i] = g.dim(i);
    int64_t start = 0;
    if (dim >= 0) {
      if (dim >= g.rank() || g.dim(dim) % tp_size != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "parameter ", spec.name, " ", g.ToString(), ": dim ", dim,
            " is not divisible by --tensor-model-parallel-size ", tp_size));
      }
      dims[dim] = g.dim(dim) / tp_size;
      start = dims[dim] * tp_rank;
    }
    absl::StatusOr<core::Shape> local = core::Shape::Make(dims, g.rank());
    if (!local.ok()) return local.status();
    local_shapes.push_back(*local);
    starts.push_back(start);
    if (buf.index_.count(spec.name)) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate parameter name ", spec.name));
    }
    buf.index_[spec.name] = buf.params_.size();
    Param param;
    param.offset = total;
    param.split_start = start;
    buf.params_.push_back(std::move(param));
    buf.numel_ += local->numel();
    total += multiple > 1 ? (local->numel() + multiple - 1) / multiple * multiple : local->numel();
  }
  buf.padded_numel_ = total;
  buf.seed_ = seed;
  buf.device_ = device;
  buf.compute_dtype_ = compute_dtype;
  for (size_t i = 0; i < buf.params_.size(); ++i) {
    buf.params_[i].spec = &buf.specs_[i];
    buf.params_[i].shape = local_shapes[i];
  }
  if (values) {
    LOOM_ASSIGN_OR_RETURN(buf.values_, core::Tensor::Zeros(core::Shape{total}, core::DType::kF32));
    LOOM_RETURN_IF_ERROR(buf.InitialValues(0, total, buf.values_.data<float>()));
  }
  // Initialised on the host; now place the buffers and make the views.
  if (values && !device.is_cpu()) {
    LOOM_ASSIGN_OR_RETURN(buf.values_, buf.values_.To(device));
  }
  // Gradients start at zero where they live (no host buffer to copy over).
  if (gradients) {
    LOOM_ASSIGN_OR_RETURN(buf.grads_,
                          core::Tensor::Empty(core::Shape{total}, core::DType::kF32, device));
    LOOM_RETURN_IF_ERROR(buf.ZeroGrads());
  }
  if (values && compute_dtype != core::DType::kF32) {
    LOOM_ASSIGN_OR_RETURN(buf.compute_, core::Tensor::Empty(core::Shape{total}, compute_dtype, device));
    LOOM_RETURN_IF_ERROR(buf.SyncComputeCopy());
  }
  for (size_t i = 0; i < buf.params_.size(); ++i) {
    Param& p = buf.params_[i];
    if (gradients) p.grad = *buf.grads_.View(p.offset, local_shapes[i]);
    if (!values) continue;
    p.master = *buf.values_.View(p.offset, local_shapes[i]);
    p.value = buf.compute_.defined() && !device.is_cpu()
                  ? *buf.compute_.View(p.offset, local_shapes[i])
                  : p.master;
    if (buf.compute_.defined() && device.is_cpu()) {
      p.gemm_value = *buf.compute_.View(p.offset, local_shapes[i]);
    }
  }
  return buf;
}

absl::Status ParamBuffer::InitialValues(int64_t begin, int64_t end, float* out) const {
  if (begin < 0 || end > padded_numel_ || begin > end) {
    return absl::InvalidArgumentError(absl::StrCat("ParamBuffer::InitialValues: [", begin, ", ",
                                                   end, ") outside ", padded_numel_, " elements"));
  }
  std::memset(out, 0, static_cast<size_t>(end - begin) * sizeof(float));
  for (const Param& p : params_) {
    const int64_t n = p.shape.numel();
    const int64_t from = std::max(begin, p.offset), to = std::min(end, p.offset + n);
    if (from >= to) continue;
    // The shard's element k holds the global tensor's element at the
    // matching index: a function of (seed, name, index) only.
    const ParamSpec& spec = *p.spec;
    const core::Shape& g = spec.global_shape;
    const int64_t cols = g.rank() >= 2 ? g.numel() / g.dim(0) : 1;
    const int64_t local_cols = p.shape.rank() >= 2 ? n / p.shape.dim(0) : 1;
    float* v = out + (from - begin);
    const int64_t k0 = from - p.offset, count = to - from;
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < count; ++j) {
      const int64_t k = k0 + j;
      const int64_t row = k / local_cols, col = k % local_cols;
      const int64_t global = spec.split == TpSplit::kRows   ? (row + p.split_start) * cols + col
                             : spec.split == TpSplit::kCols ? row * cols + col + p.split_start
                                                            : k;
      v[j] = InitialValue(spec, seed_, global);
    }
  }
  return absl::OkStatus();
}

absl::Status ParamBuffer::BindValues(int64_t begin, int64_t end, const core::Tensor& master,
                                     const core::Tensor& compute) {
  if (values_.defined()) {
    return absl::FailedPreconditionError(
        "ParamBuffer::BindValues: this buffer holds its values whole (built with values)");
  }
  if (master.defined() &&
      (master.dtype() != core::DType::kF32 || master.numel() < end - begin ||
       (compute_dtype_ != core::DType::kF32 &&
        (!compute.defined() || compute.dtype() != compute_dtype_ || compute.numel() < end - begin)))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ParamBuffer::BindValues: [", begin, ", ", end, ") does not fit f32 ",
        master.DebugString(), (compute_dtype_ != core::DType::kF32 ? " and its compute copy " : ""),
        compute_dtype_ != core::DType::kF32 ? compute.DebugString() : ""));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    if (p.offset < begin || SlotEnd({static_cast<int>(i)}) > end) continue;
    if (!master.defined()) {
      p.master = p.value = p.gemm_value = core::Tensor();
      continue;
    }
    LOOM_ASSIGN_OR_RETURN(p.master, master.View(p.offset - begin, p.shape));
    p.value = p.master;
    if (compute_dtype_ == core::DType::kF32) continue;
    LOOM_ASSIGN_OR_RETURN(core::Tensor copy, compute.View(p.offset - begin, p.shape));
    if (device_.is_cpu()) {
      p.gemm_value = copy;  // the CPU's GEMMs take bf16, its other kernels f32
    } else {
      p.value = copy;
    }
  }
  return absl::OkStatus();
}

size_t ParamBuffer::IndexOf(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    std::fprintf(stderr, "loom: no parameter named %s\n", name.c_str());
    std::abort();
  }
  return it->second;
}

Param& ParamBuffer::at(const std::string& name) { return params_[IndexOf(name)]; }
const Param& ParamBuffer::at(const std::string& name) const { return params_[IndexOf(name)]; }

ParamHandle ParamBuffer::Find(const std::string& name) const {
  auto it = index_.find(name);
  return ParamHandle{it == index_.end() ? -1 : static_cast<int>(it->second)};
}

int64_t ParamBuffer::SlotEnd(ParamHandle h) const {
  const size_t next = static_cast<size_t>(h.index) + 1;
  return next < params_.size() ? params_[next].offset : padded_numel();
}

absl::StatusOr<ParamBuffer> ParamBuffer::HostMirror() const {
  ParamBuffer m;
  m.specs_ = specs_;
  m.params_ = params_;
  m.index_ = index_;
  m.numel_ = numel_;
  m.padded_numel_ = padded_numel_;
  m.seed_ = seed_;
  const core::Shape flat{padded_numel()};
  LOOM_ASSIGN_OR_RETURN(m.values_, core::Tensor::Zeros(flat, core::DType::kF32));
  LOOM_ASSIGN_OR_RETURN(m.grads_, core::Tensor::Zeros(flat, core::DType::kF32));
  for (size_t i = 0; i < m.params_.size(); ++i) {
    Param& p = m.params_[i];
    p.spec = &m.specs_[i];
    p.master = *m.values_.View(p.offset, p.shape);
    p.grad = *m.grads_.View(p.offset, p.shape);
    p.value = p.master;
    p.gemm_value = core::Tensor();
  }
  return m;
}

absl::Status ParamBuffer::ZeroGrads() {
  if (!grads_.defined()) return absl::OkStatus();
  return core::ops::Zero(&grads_);
}

absl::Status ParamBuffer::BindGrads(const core::Tensor& flat) {
  if (flat.defined() && (flat.dtype() != core::DType::kF32 || flat.numel() != padded_numel() ||
                         flat.device() != device())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ParamBuffer::BindGrads: expected f32[", padded_numel(), "] on ", device().ToString(),
        ", got ", core::DTypeName(flat.dtype()), "[", flat.numel(), "] on ",
        flat.device().ToString()));
  }
  grads_ = flat;
  return BindGrads(0, padded_numel(), flat);
}

absl::Status ParamBuffer::BindGrads(int64_t begin, int64_t end, const core::Tensor& buffer) {
  if (buffer.defined() && (buffer.dtype() != core::DType::kF32 || buffer.numel() < end - begin)) {
    return absl::InvalidArgumentError(absl::StrCat("ParamBuffer::BindGrads: [", begin, ", ", end,
                                                   ") does not fit a buffer of ",
                                                   buffer.numel(), " elements"));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    if (p.offset < begin || SlotEnd({static_cast<int>(i)}) > end) continue;
    if (!buffer.defined()) {
      p.grad = core::Tensor();
      continue;
    }
    LOOM_ASSIGN_OR_RETURN(p.grad, buffer.View(p.offset - begin, p.shape));
  }
  return absl::OkStatus();
}

absl::Status ParamBuffer::SyncComputeCopy() {
  if (!compute_.defined()) return absl::OkStatus();
  return core::ops::Convert(values_, &compute_);
}

absl::Status ParamBuffer::SyncComputeCopy(int64_t begin, int64_t end) {
  if (!compute_.defined() || begin >= end) return absl::OkStatus();
  LOOM_ASSIGN_OR_RETURN(core::Tensor from, values_.Narrow(begin, end - begin));
  LOOM_ASSIGN_OR_RETURN(core::Tensor to, compute_.Narrow(begin, end - begin));
  return core::ops::Convert(from, &to);
}

}  // namespace loom::layers
