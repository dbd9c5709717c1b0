#ifndef LOOM_CORE_DEVICE_H_
#define LOOM_CORE_DEVICE_H_

#include <string>

namespace loom::core {

enum class DeviceType { kCPU, kCUDA };

// Where a tensor's bytes live. CUDA devices are numbered from 0.
struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;

  static Device CPU() { return Device{DeviceType::kCPU, 0}; }
  static Device CUDA(int index) { return Device{DeviceType::kCUDA, index}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string ToString() const;  // "cpu", "cuda:0"
};

}  // namespace loom::core

#endif  // LOOM_CORE_DEVICE_H_
