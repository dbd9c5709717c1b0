#ifndef LOOM_CORE_OPS_TESTING_FAKE_DEVICE_H_
#define LOOM_CORE_OPS_TESTING_FAKE_DEVICE_H_

// A stand-in GPU for tests on machines without one. Installed as the kCUDA
// allocator and kernel table, it keeps "device" tensors in host memory but
// hands out poisoned (non-canonical) addresses, so any code that reads or
// writes a device tensor from the host crashes at once instead of silently
// working on a CPU. Its kernels are the CPU kernels run on unpoisoned
// aliases, so a model on the fake device must reproduce the CPU run
// bit for bit. This proves the plumbing of --device=cuda (placement,
// transfers, dispatch) here; the real GPU kernels are proven on a GPU.

namespace loom::core::ops::testing {

// Registers the fake allocator and kernel table for DeviceType::kCUDA for
// the lifetime of the object, restoring the previous ones afterwards.
class ScopedFakeDevice {
 public:
  ScopedFakeDevice();
  ~ScopedFakeDevice();
  ScopedFakeDevice(const ScopedFakeDevice&) = delete;
  ScopedFakeDevice& operator=(const ScopedFakeDevice&) = delete;

  // Kernel calls and bytes copied host<->device so far (the test can check
  // that work really went through the device table).
  static long kernel_calls();
  static long copied_bytes();

 private:
  const void* previous_allocator_;
  const void* previous_table_;
};

}  // namespace loom::core::ops::testing

#endif  // LOOM_CORE_OPS_TESTING_FAKE_DEVICE_H_
