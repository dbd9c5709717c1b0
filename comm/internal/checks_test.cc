// The per-op argument checks every backend runs, for both kinds of
// communicator: host memory (local, mpi, ucx) and a CUDA device (nccl). A
// fake "CUDA" allocator (host memory labelled cuda:N) gives tensors on CUDA
// devices; nothing here touches CUDA, so this runs on every machine.
#include "comm/internal/checks.h"

#include <cstdlib>
#include <initializer_list>

#include "absl/strings/match.h"
#include "core/storage.h"
#include "gtest/gtest.h"

namespace loom::comm::internal {
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

void ExpectInvalid(const absl::Status& s, std::initializer_list<const char*> parts) {
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  for (const char* p : parts) EXPECT_TRUE(absl::StrContains(s.message(), p)) << s << " lacks " << p;
}

// Parameterised by the communicator's device: the same checks and messages
// for both, but for where the tensors must live.
class ChecksTest : public ::testing::TestWithParam<Device> {
 protected:
  static void SetUpTestSuite() {
    if (core::GetAllocator(core::DeviceType::kCUDA) == nullptr) {
      core::SetAllocator(core::DeviceType::kCUDA, new FakeCudaAllocator());
    }
  }
  static Tensor On(Device d, int64_t n, DType t = DType::kF32) {
    return *Tensor::Empty({n}, t, d);
  }
  Tensor Mine(int64_t n, DType t = DType::kF32) const { return On(dev_, n, t); }
  const Device dev_ = GetParam();
};

TEST_P(ChecksTest, SameChecksOnEveryDevice) {
  Tensor f7 = Mine(7), f8 = Mine(8), i7 = Mine(7, DType::kI32);
  ExpectInvalid(CheckAllReduce(f7, f8, dev_), {"all_reduce", "output has 8 elements, expected 7"});
  ExpectInvalid(CheckAllReduce(f7, i7, dev_), {"all_reduce", "dtype"});
  ExpectInvalid(CheckAllReduce(Tensor(), f7, dev_), {"input is an undefined tensor"});
  ExpectInvalid(CheckAllReduce(*f8.View(0, {7}), *f8.View(1, {7}), dev_), {"overlap"});
  ExpectInvalid(CheckBroadcast(f7, f7, -1, 2, dev_), {"broadcast", "root -1"});
  ExpectInvalid(CheckReduce(f7, f7, 5, 2, dev_), {"reduce", "root 5"});
  ExpectInvalid(CheckAllGather(f7, f7, 0, 2, dev_), {"all_gather", "group size x input"});
  ExpectInvalid(CheckReduceScatter(f7, f8, 0, 2, dev_), {"reduce_scatter", "group size x output"});
  ExpectInvalid(CheckAllToAll(f7, f7, 2, dev_), {"all_to_all", "multiple of the group size"});
  ExpectInvalid(CheckAllToAllV(f7, {3, 4, 0}, f8, {4, 4}, 0, 2, dev_),
                {"all_to_all_v", "send_counts has 3 entries, expected 2"});
  ExpectInvalid(CheckAllToAllV(f7, {7, 0}, f8, {9, -1}, 0, 2, dev_),
                {"all_to_all_v", "recv_counts[1] is -1, expected >= 0"});
  ExpectInvalid(CheckAllToAllV(f7, {3, 3}, f8, {4, 4}, 0, 2, dev_),
                {"all_to_all_v", "input has 7 elements, expected 6 (the sum of send_counts)"});
  ExpectInvalid(CheckAllToAllV(f7, {3, 4}, f8, {4, int64_t{1} << 62}, 0, 2, dev_),
                {"all_to_all_v", "output has 8 elements, expected more than 8"});
  ExpectInvalid(CheckAllToAllV(f7, {3, 4}, f7, {3, 4}, 0, 2, dev_), {"all_to_all_v", "overlap"});
  ExpectInvalid(CheckAllToAllV(f7, {3, 4}, i7, {3, 4}, 0, 2, dev_), {"all_to_all_v", "dtype"});
  ExpectInvalid(CheckAllToAllV(f7, {3, 4}, f8, {4, 4}, 0, 2, dev_),
                {"all_to_all_v", "send_counts[0] is 3 but recv_counts[0] is 4"});
  ExpectInvalid(CheckP2P("send", f7, 0, 0, 0, 2, dev_), {"send", "is this rank"});
  ExpectInvalid(CheckP2P("send", f7, 3, 0, 0, 2, dev_), {"send", "out of range"});
  ExpectInvalid(CheckP2P("recv", f7, 1, -4, 0, 2, dev_), {"recv", "tag -4"});
  ExpectInvalid(CheckP2P("send", f7, 1, kMaxTag, 0, 2, dev_), {"tag"});
  ExpectInvalid(CheckBatch({{P2POp::Kind::kSend, f7, 1, 0}, {P2POp::Kind::kRecv, f7, 2, 0}}, 0, 2,
                           dev_),
                {"batch_send_recv(recv)", "peer 2"});
}

TEST_P(ChecksTest, ValidLayoutsPass) {
  Tensor big = Mine(16), small = Mine(8);
  EXPECT_TRUE(CheckAllReduce(big, big, dev_).ok());
  EXPECT_TRUE(CheckAllReduce(small, *big.View(8, {8}), dev_).ok());
  EXPECT_TRUE(CheckBroadcast(big, big, 1, 2, dev_).ok());
  EXPECT_TRUE(CheckReduce(small, small, 0, 2, dev_).ok());
  EXPECT_TRUE(CheckAllGather(*big.View(8, {8}), big, 1, 2, dev_).ok());      // in place
  EXPECT_TRUE(CheckReduceScatter(big, *big.View(8, {8}), 1, 2, dev_).ok());  // in place
  EXPECT_TRUE(CheckAllGather(small, big, 0, 2, dev_).ok());
  EXPECT_TRUE(CheckAllToAll(big, big, 4, dev_).ok());
  EXPECT_TRUE(CheckAllToAllV(small, {5, 3, 0}, *big.View(8, {8}), {5, 0, 3}, 0, 3, dev_).ok());
  EXPECT_TRUE(CheckAllToAllV(Mine(0), {0, 0}, Mine(0), {0, 0}, 0, 2, dev_).ok());
  EXPECT_TRUE(CheckBatch({{P2POp::Kind::kSend, small, 1, 3}, {P2POp::Kind::kRecv, small, 1, 4}},
                         0, 2, dev_)
                  .ok());
  // An in-place slot at the wrong rank is an overlap, not in place.
  ExpectInvalid(CheckAllGather(*big.View(8, {8}), big, 0, 2, dev_), {"all_gather", "overlap"});
}

// A tensor elsewhere is named with both devices, for every op.
TEST_P(ChecksTest, TensorElsewhereIsRejectedNamingOpAndDevices) {
  const Device other = dev_.is_cpu() ? Device::CUDA(0) : Device::CPU();
  const std::string other_name = other.ToString(), mine_name = "(" + dev_.ToString() + ")";
  const std::string is_on = "is on " + other_name;
  Tensor there = On(other, 8), here = Mine(8);
  for (const char* part : {"all_reduce", "input", is_on.c_str(), mine_name.c_str()}) {
    EXPECT_TRUE(absl::StrContains(CheckAllReduce(there, here, dev_).message(), part)) << part;
  }
  ExpectInvalid(CheckAllReduce(here, there, dev_), {"all_reduce", "output", is_on.c_str()});
  ExpectInvalid(CheckBroadcast(there, there, 0, 1, dev_), {"broadcast", is_on.c_str()});
  ExpectInvalid(CheckReduce(there, there, 0, 1, dev_), {"reduce", is_on.c_str()});
  ExpectInvalid(CheckAllGather(there, here, 0, 1, dev_), {"all_gather", is_on.c_str()});
  ExpectInvalid(CheckReduceScatter(here, there, 0, 1, dev_), {"reduce_scatter", is_on.c_str()});
  ExpectInvalid(CheckAllToAll(there, there, 1, dev_), {"all_to_all", is_on.c_str()});
  ExpectInvalid(CheckAllToAllV(here, {8}, there, {8}, 0, 1, dev_), {"all_to_all_v", is_on.c_str()});
  ExpectInvalid(CheckP2P("send", there, 1, 0, 0, 2, dev_), {"send", "tensor", is_on.c_str()});
  ExpectInvalid(CheckBatch({{P2POp::Kind::kRecv, there, 1, 0}}, 0, 2, dev_),
                {"batch_send_recv(recv)", is_on.c_str()});
}

INSTANTIATE_TEST_SUITE_P(Devices, ChecksTest, ::testing::Values(Device::CPU(), Device::CUDA(0)),
                         [](const ::testing::TestParamInfo<Device>& info) {
                           return info.param.is_cpu() ? std::string("Host")
                                                      : std::string("Cuda");
                         });

// The nccl backend's own case: another GPU of the same machine.
TEST(ChecksOnCuda, OtherGpuIsRejectedNamingBothDevices) {
  if (core::GetAllocator(core::DeviceType::kCUDA) == nullptr) {
    core::SetAllocator(core::DeviceType::kCUDA, new FakeCudaAllocator());
  }
  const Device mine = Device::CUDA(0);
  Tensor other = *Tensor::Empty({8}, DType::kF32, Device::CUDA(1));
  Tensor here = *Tensor::Empty({8}, DType::kF32, mine);
  ExpectInvalid(CheckAllReduce(other, here, mine), {"all_reduce", "is on cuda:1", "(cuda:0)"});
  ExpectInvalid(CheckP2P("recv", other, 1, 0, 0, 2, mine), {"recv", "cuda:1"});
  ExpectInvalid(CheckAllReduce(*Tensor::Empty({8}, DType::kF32), here, mine),
                {"is on cpu", "copy host tensors to the GPU first"});
}

}  // namespace
}  // namespace loom::comm::internal
