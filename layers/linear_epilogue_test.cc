// The "linear_epilogue" kernel choice wired through the layers: with
// LOOM_KERNEL_IMPL=linear_epilogue=cublaslt the linear layers and the GELU
// MLP run core/ops's LinearForward / LinearBackwardData /
// LinearBackwardWeight (on CUDA one cuBLASLt GEMM with its epilogue each).
// Their CPU implementations are the unfused kernels composed, so outputs,
// input gradients and every parameter gradient must equal the unfused path
// bitwise: on the CPU, on the fake device (CUDA tensors, CPU kernels behind
// poisoned pointers: dispatch and placement as on a GPU), and under TP=2 with
// and without sequence parallelism (where the row-parallel bias must stay
// outside the GEMM: added after the reduction, its gradient over the shard).

#include <cstdlib>
#include <vector>

#include "core/ops/kernel_choice.h"
#include "core/ops/testing/fake_device.h"
#include "core/status_macros.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "layers/attention.h"
#include "layers/linear.h"
#include "layers/params.h"
#include "layers/test_util.h"

namespace loom::layers {
namespace {

using core::Shape;
using core::Tensor;
using testing::RandomTensor;
using testing::ToVector;

constexpr int64_t kS = 8, kB = 2, kH = 32, kF = 128, kO = 48;

std::vector<ParamSpec> Specs() {
  ParamSpec uw{"up.weight", Shape{kF, kH}, TpSplit::kRows};
  ParamSpec ub{"up.bias", Shape{kF}, TpSplit::kRows, Init::kNormal};
  ParamSpec dw{"down.weight", Shape{kH, kF}, TpSplit::kCols};
  ParamSpec db{"down.bias", Shape{kH}, TpSplit::kReplicated, Init::kNormal};
  ParamSpec cw{"col.weight", Shape{kO, kH}, TpSplit::kRows};
  ParamSpec cb{"col.bias", Shape{kO}, TpSplit::kRows, Init::kNormal};
  ParamSpec rw{"row.weight", Shape{kH, kO}, TpSplit::kCols};
  ParamSpec rb{"row.bias", Shape{kH}, TpSplit::kReplicated, Init::kNormal};
  uw.std = dw.std = cw.std = rw.std = 0.2f;
  return {uw, ub, dw, db, cw, cb, rw, rb};
}

// Everything a step produces on one rank, as CPU floats.
using StepOut = std::vector<std::vector<float>>;

std::vector<float> Host(const Tensor& t) {
  if (t.device().is_cpu()) return ToVector(t);
  absl::StatusOr<Tensor> h = t.To(core::Device::CPU());
  EXPECT_TRUE(h.ok()) << h.status();
  return ToVector(*h);
}

// x -> GELU MLP -> column -> row (+ the MLP's input), forward and backward
// from dy on `device`, over `tp`. Inputs are the rows of this rank's
// sequence shard with SP.
absl::Status Step(const TpGroup& tp, core::Device device, StepOut* out) {
  LOOM_ASSIGN_OR_RETURN(ParamBuffer buf,
                        ParamBuffer::Create(Specs(), tp.rank(), tp.size(), /*seed=*/7, 1, device));
  ParallelMlp mlp(&buf.at("up.weight"), &buf.at("up.bias"), &buf.at("down.weight"),
                  &buf.at("down.bias"), tp);
  ColumnParallelLinear col(&buf.at("col.weight"), &buf.at("col.bias"), tp);
  RowParallelLinear row(&buf.at("row.weight"), &buf.at("row.bias"), tp);
  const int64_t s = tp.sequence_parallel ? kS / tp.size() : kS;
  const int64_t first = tp.sequence_parallel ? tp.rank() * s : 0;
  LOOM_ASSIGN_OR_RETURN(Tensor x_full_rows, RandomTensor(Shape{kS, kB, kH}, 1).Narrow(first, s));
  LOOM_ASSIGN_OR_RETURN(Tensor dy_rows, RandomTensor(Shape{kS, kB, kH}, 2).Narrow(first, s));
  LOOM_ASSIGN_OR_RETURN(Tensor x, x_full_rows.To(device));
  LOOM_ASSIGN_OR_RETURN(Tensor dy, dy_rows.To(device));
  ParallelMlp::Saved ms;
  ColumnParallelLinear::Saved cs;
  RowParallelLinear::Saved rs;
  LOOM_ASSIGN_OR_RETURN(Tensor h, mlp.Forward(x, &ms));
  LOOM_ASSIGN_OR_RETURN(Tensor c, col.Forward(h, &cs));
  LOOM_ASSIGN_OR_RETURN(Tensor y, row.Forward(c, &rs));
  LOOM_ASSIGN_OR_RETURN(Tensor dc, row.Backward(dy, rs));
  LOOM_ASSIGN_OR_RETURN(Tensor dh, col.Backward(dc, cs));
  LOOM_ASSIGN_OR_RETURN(Tensor dx, mlp.Backward(dh, ms));
  *out = {Host(y), Host(dx), Host(h), Host(ms.pre_gelu)};
  for (const char* name : {"up.weight", "up.bias", "down.weight", "down.bias", "col.weight",
                           "col.bias", "row.weight", "row.bias"}) {
    out->push_back(Host(buf.at(name).grad));
  }
  return absl::OkStatus();
}

class LinearEpilogueTest : public ::testing::Test {
 protected:
  void TearDown() override { Force(nullptr); }
  // nullptr: the manifest's default (the reference, "unfused").
  static void Force(const char* impl) {
    if (impl == nullptr) {
      unsetenv("LOOM_KERNEL_IMPL");
    } else {
      setenv("LOOM_KERNEL_IMPL", impl, 1);
    }
    core::ops::ForgetKernelChoicesForTesting();
  }
  static std::string Chosen(core::DeviceType d) {
    absl::StatusOr<core::ops::KernelChoice> c = core::ops::ChooseKernel("linear_epilogue", d);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? c->implementation : "";
  }
};

void ExpectBitwise(const StepOut& got, const StepOut& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size()) << what << " output " << i;
    int bad = 0;
    for (size_t j = 0; j < got[i].size() && bad < 3; ++j) {
      if (got[i][j] != want[i][j]) {
        ++bad;
        ADD_FAILURE() << what << " output " << i << "[" << j << "]: " << got[i][j] << " vs "
                      << want[i][j];
      }
    }
  }
}

TEST_F(LinearEpilogueTest, ReferenceByDefaultOnBothDevices) {
  Force(nullptr);
  EXPECT_EQ(Chosen(core::DeviceType::kCPU), "unfused");
  EXPECT_EQ(Chosen(core::DeviceType::kCUDA), "unfused");
  Force("linear_epilogue=cublaslt");
  EXPECT_EQ(Chosen(core::DeviceType::kCPU), "cublaslt");
  EXPECT_EQ(Chosen(core::DeviceType::kCUDA), "cublaslt");
}

TEST_F(LinearEpilogueTest, CpuFusedEqualsUnfusedBitwise) {
  StepOut want, got;
  Force(nullptr);
  ASSERT_TRUE(Step(TpGroup{}, core::Device::CPU(), &want).ok());
  Force("linear_epilogue=cublaslt");
  absl::Status s = Step(TpGroup{}, core::Device::CPU(), &got);
  ASSERT_TRUE(s.ok()) << s;
  ExpectBitwise(got, want, "cpu");
}

TEST_F(LinearEpilogueTest, FakeDeviceFusedEqualsCpuUnfusedBitwise) {
  StepOut want, got;
  Force(nullptr);
  ASSERT_TRUE(Step(TpGroup{}, core::Device::CPU(), &want).ok());
  core::ops::testing::ScopedFakeDevice device;
  using core::ops::testing::ScopedFakeDevice;
  StepOut unfused;
  const long calls0 = ScopedFakeDevice::kernel_calls();
  ASSERT_TRUE(Step(TpGroup{}, core::Device::CUDA(0), &unfused).ok());
  const long calls1 = ScopedFakeDevice::kernel_calls();
  Force("linear_epilogue=cublaslt");
  absl::Status s = Step(TpGroup{}, core::Device::CUDA(0), &got);
  ASSERT_TRUE(s.ok()) << s;
  const long calls2 = ScopedFakeDevice::kernel_calls();
  // The epilogues replace kernels: 10 fewer device calls in this step. Forward:
  // the up-projection's bias and GELU, the bias of the down-projection, col
  // and row (TP 1). Backward: the bias gradients of row and the down-projection
  // (no SP) and of col; dGELU and the up-projection's bias gradient.
  EXPECT_EQ((calls1 - calls0) - (calls2 - calls1), 10);
  ExpectBitwise(unfused, want, "fake cuda unfused");
  ExpectBitwise(got, want, "fake cuda");
}

TEST_F(LinearEpilogueTest, TensorAndSequenceParallelFusedEqualsUnfusedBitwise) {
  for (bool sp : {false, true}) {
    std::vector<StepOut> want(2), got(2);
    for (int pass = 0; pass < 2; ++pass) {
      Force(pass == 0 ? nullptr : "linear_epilogue=cublaslt");
      std::vector<StepOut>& runs = pass == 0 ? want : got;
      absl::Status s = testing::RunRanks(2, [&](int r, comm::Communicator* c) -> absl::Status {
        return Step(TpGroup{c, sp}, core::Device::CPU(), &runs[r]);
      });
      ASSERT_TRUE(s.ok()) << s;
    }
    for (int r = 0; r < 2; ++r) {
      ExpectBitwise(got[r], want[r], absl::StrCat("tp=2 sp=", sp, " rank ", r));
    }
  }
}

}  // namespace
}  // namespace loom::layers
