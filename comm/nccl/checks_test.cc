// The nccl backend's argument checks, without a GPU: a fake "CUDA" allocator
// (host memory labelled cuda:N) gives tensors on CUDA devices. Nothing here
// touches CUDA, so this runs on every machine.
#include "comm/nccl/checks.h"

#include <cstdlib>

#include "absl/strings/match.h"
#include "core/storage.h"
#include "gtest/gtest.h"

namespace loom::comm::nccl {
namespace {

using core::Device;
using core::DType;
using core::Tensor;

class FakeCudaAllocator : public core::Allocator {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes, Device) override {
    return std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  }
  void Free(void* p, size_t, Device) override { std::free(p); }
};

class ChecksTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (core::GetAllocator(core::DeviceType::kCUDA) == nullptr) {
      core::SetAllocator(core::DeviceType::kCUDA, new FakeCudaAllocator());
    }
  }
  static Tensor On(Device d, int64_t n, DType t = DType::kF32) {
    return *Tensor::Empty({n}, t, d);
  }
  const Device dev_ = Device::CUDA(0);
};

void ExpectInvalid(const absl::Status& s, std::initializer_list<const char*> parts) {
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  for (const char* p : parts) EXPECT_TRUE(absl::StrContains(s.message(), p)) << s << " lacks " << p;
}

TEST_F(ChecksTest, CpuTensorIsRejectedNamingOpAndDevice) {
  Tensor cpu = On(Device::CPU(), 8), gpu = On(dev_, 8);
  ExpectInvalid(CheckAllReduce(cpu, gpu, dev_), {"all_reduce", "input", "is on cpu", "cuda:0"});
  ExpectInvalid(CheckAllReduce(gpu, cpu, dev_), {"all_reduce", "output", "is on cpu"});
  ExpectInvalid(CheckBroadcast(cpu, cpu, 0, 1, dev_), {"broadcast", "cpu"});
  ExpectInvalid(CheckReduce(cpu, cpu, 0, 1, dev_), {"reduce", "cpu"});
  ExpectInvalid(CheckAllGather(cpu, gpu, 0, 1, dev_), {"all_gather", "cpu"});
  ExpectInvalid(CheckReduceScatter(gpu, cpu, 0, 1, dev_), {"reduce_scatter", "cpu"});
  ExpectInvalid(CheckAllToAll(cpu, cpu, 1, dev_), {"all_to_all", "cpu"});
  ExpectInvalid(CheckP2P("send", cpu, 1, 0, 0, 2, dev_), {"send", "tensor", "cpu"});
  ExpectInvalid(CheckBatch({{P2POp::Kind::kRecv, cpu, 1, 0}}, 0, 2, dev_),
                {"batch_send_recv(recv)", "cpu"});
}

TEST_F(ChecksTest, OtherGpuIsRejectedNamingBothDevices) {
  Tensor other = On(Device::CUDA(1), 8), mine = On(dev_, 8);
  ExpectInvalid(CheckAllReduce(other, mine, dev_), {"all_reduce", "is on cuda:1", "(cuda:0)"});
  ExpectInvalid(CheckP2P("recv", other, 1, 0, 0, 2, dev_), {"recv", "cuda:1"});
}

TEST_F(ChecksTest, SameChecksAsTheHostBackends) {
  Tensor f7 = On(dev_, 7), f8 = On(dev_, 8), i7 = On(dev_, 7, DType::kI32);
  ExpectInvalid(CheckAllReduce(f7, f8, dev_), {"all_reduce", "7", "8"});
  ExpectInvalid(CheckAllReduce(f7, i7, dev_), {"dtype"});
  ExpectInvalid(CheckAllReduce(Tensor(), f7, dev_), {"undefined"});
  ExpectInvalid(CheckAllReduce(*f8.View(0, {7}), *f8.View(1, {7}), dev_), {"overlap"});
  ExpectInvalid(CheckBroadcast(f7, f7, -1, 2, dev_), {"root -1"});
  ExpectInvalid(CheckReduce(f7, f7, 5, 2, dev_), {"root 5"});
  ExpectInvalid(CheckAllGather(f7, f7, 0, 2, dev_), {"group size x input"});
  ExpectInvalid(CheckReduceScatter(f7, f8, 0, 2, dev_), {"group size x output"});
  ExpectInvalid(CheckAllToAll(f7, f7, 2, dev_), {"multiple of the group size"});
  ExpectInvalid(CheckP2P("send", f7, 0, 0, 0, 2, dev_), {"is this rank"});
  ExpectInvalid(CheckP2P("send", f7, 3, 0, 0, 2, dev_), {"out of range"});
  ExpectInvalid(CheckP2P("send", f7, 1, -4, 0, 2, dev_), {"tag -4"});
}

TEST_F(ChecksTest, ValidLayoutsPass) {
  Tensor big = On(dev_, 16), small = On(dev_, 8);
  EXPECT_TRUE(CheckAllReduce(big, big, dev_).ok());
  EXPECT_TRUE(CheckAllGather(*big.View(8, {8}), big, 1, 2, dev_).ok());      // in place
  EXPECT_TRUE(CheckReduceScatter(big, *big.View(8, {8}), 1, 2, dev_).ok());  // in place
  EXPECT_TRUE(CheckAllGather(small, big, 0, 2, dev_).ok());
  EXPECT_TRUE(CheckAllToAll(big, big, 4, dev_).ok());
  EXPECT_TRUE(CheckBatch({{P2POp::Kind::kSend, small, 1, 3}, {P2POp::Kind::kRecv, small, 1, 4}},
                         0, 2, dev_)
                  .ok());
}

}  // namespace
}  // namespace loom::comm::nccl
