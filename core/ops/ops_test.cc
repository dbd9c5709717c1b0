#include "core/ops/ops.h"

#include <cstdlib>
#include <cstring>

#include "core/cpu/matmul.h"
#include "core/cpu/rmsnorm.h"
#include "core/cpu/rope.h"
#include "core/cpu/swiglu.h"
#include "core/cpu/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::ops {
namespace {

using cpu::testing::Random;

TEST(OpsTest, CpuTensorsRunTheCpuKernel) {
  const Tensor a = Random(Shape{3, 4}, 1), b = Random(Shape{4, 5}, 2);
  Tensor via_ops = *Tensor::Empty(Shape{3, 5}, DType::kF32);
  Tensor direct = *Tensor::Empty(Shape{3, 5}, DType::kF32);
  ASSERT_TRUE(Matmul(a, b, &via_ops).ok());
  ASSERT_TRUE(cpu::Matmul(a, b, &direct).ok());
  EXPECT_EQ(std::memcmp(via_ops.raw_data(), direct.raw_data(), direct.nbytes()), 0);
}

// The Llama kernels (RMSNorm, RoPE, SwiGLU) through core/ops: the CPU kernel's bits.
TEST(OpsTest, LlamaKernelsRunTheCpuKernels) {
  auto same = [](const Tensor& a, const Tensor& b) {
    return std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
  };
  auto empty = [](const Shape& s) { return *Tensor::Empty(s, DType::kF32); };
  const Tensor x = Random(Shape{3, 2, 4, 8}, 1), g = Random(Shape{8}, 2);
  Tensor a = empty(x.shape()), b = empty(x.shape()), ra = empty(Shape{24}), rb = empty(Shape{24});
  ASSERT_TRUE(RmsNormForward(x, g, 1e-6f, &a, &ra).ok());
  ASSERT_TRUE(cpu::RmsNormForward(x, g, 1e-6f, &b, &rb).ok());
  EXPECT_TRUE(same(a, b) && same(ra, rb));
  Tensor dga = *Tensor::Zeros(Shape{8}, DType::kF32), dgb = *Tensor::Zeros(Shape{8}, DType::kF32);
  ASSERT_TRUE(RmsNormBackward(x, x, g, ra, &a, &dga).ok());
  ASSERT_TRUE(cpu::RmsNormBackward(x, x, g, rb, &b, &dgb).ok());
  EXPECT_TRUE(same(a, b) && same(dga, dgb));
  RopeOptions o;
  o.rotary_dim = 4;
  o.position_offset = 5;
  ASSERT_TRUE(ops::RopeForward(x, o, &a).ok());  // qualified: ADL also finds cpu::
  ASSERT_TRUE(cpu::RopeForward(x, o, &b).ok());
  EXPECT_TRUE(same(a, b));
  ASSERT_TRUE(ops::RopeBackward(x, o, &a).ok());
  ASSERT_TRUE(cpu::RopeBackward(x, o, &b).ok());
  EXPECT_TRUE(same(a, b));
  Tensor ha = empty(Shape{3, 2, 4, 4}), hb = empty(Shape{3, 2, 4, 4});
  ASSERT_TRUE(SwigluForward(x, &ha).ok());
  ASSERT_TRUE(cpu::SwigluForward(x, &hb).ok());
  EXPECT_TRUE(same(ha, hb));
  ASSERT_TRUE(SwigluBackward(ha, x, &a).ok());
  ASSERT_TRUE(cpu::SwigluBackward(hb, x, &b).ok());
  EXPECT_TRUE(same(a, b));
}

TEST(OpsTest, CloneCopyAndZeroOnCpu) {
  const Tensor a = Random(Shape{2, 3}, 3);
  absl::StatusOr<Tensor> c = a.Clone();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->SharesStorageWith(a));
  EXPECT_EQ(std::memcmp(c->raw_data(), a.raw_data(), a.nbytes()), 0);
  ASSERT_TRUE(Zero(&*c).ok());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(c->data<float>()[i], 0.0f);
  Tensor wrong = *Tensor::Empty(Shape{5}, DType::kF32);
  absl::Status st = Copy(a, &wrong);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("equal dtype and element count"), std::string::npos) << st;
}

// Host memory posing as a device, so dispatch can be observed without a GPU.
class FakeDeviceAllocator : public Allocator {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes, Device) override { return std::malloc(bytes + 1); }
  void Free(void* ptr, size_t, Device) override { std::free(ptr); }
};

int g_fake_matmul_calls = 0;
absl::Status FakeMatmul(const Tensor&, const Tensor&, Tensor*, const cpu::MatmulOptions&) {
  ++g_fake_matmul_calls;
  return absl::OkStatus();
}

TEST(OpsTest, DeviceTensorsRunTheRegisteredTableOrNameWhatIsMissing) {
  FakeDeviceAllocator fake;
  Allocator* previous_allocator = SetAllocator(DeviceType::kCUDA, &fake);
  const KernelTable* previous_table = RegisterKernelTable(DeviceType::kCUDA, nullptr);
  Tensor a = *Tensor::Empty(Shape{2, 2}, DType::kF32, Device::CUDA(0));
  Tensor c = *Tensor::Empty(Shape{2, 2}, DType::kF32, Device::CUDA(0));

  absl::Status st = Matmul(a, a, &c);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("cuda:0"), std::string::npos) << st;
  EXPECT_NE(st.message().find("//core/cuda:ops"), std::string::npos) << st;

  KernelTable table;
  table.name = "fake";
  table.matmul = &FakeMatmul;
  RegisterKernelTable(DeviceType::kCUDA, &table);
  EXPECT_TRUE(Matmul(a, a, &c).ok());
  EXPECT_EQ(g_fake_matmul_calls, 1);
  // A CPU call still goes to the CPU, whatever is registered for the device.
  const Tensor x = Random(Shape{2, 2}, 4);
  Tensor y = *Tensor::Empty(Shape{2, 2}, DType::kF32);
  EXPECT_TRUE(Matmul(x, x, &y).ok());
  EXPECT_EQ(g_fake_matmul_calls, 1);
  // A kernel the registered table lacks is an error naming it, not a crash.
  Tensor half = *Tensor::Empty(Shape{2, 1}, DType::kF32, Device::CUDA(0));
  st = SwigluForward(a, &half);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(st.message().find("fake kernel table has no swiglu_forward"), std::string::npos) << st;

  RegisterKernelTable(DeviceType::kCUDA, previous_table);
  SetAllocator(DeviceType::kCUDA, previous_allocator);
}

}  // namespace
}  // namespace loom::core::ops
