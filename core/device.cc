#include "core/device.h"

namespace loom::core {

std::string Device::ToString() const {
  return type == DeviceType::kCPU ? "cpu" : "cuda:" + std::to_string(index);
}

}  // namespace loom::core
