#ifndef LOOM_TRAIN_DEVICE_SETUP_H_
#define LOOM_TRAIN_DEVICE_SETUP_H_

// Binds a rank to its device before anything is allocated: for --device=cuda
// rank r uses GPU r mod (GPUs on the node), made current for the calling
// thread, and the model's parameters and activations go there.

#include "absl/status/status.h"
#include "train/config.h"

namespace loom::train {

// No-op for --device=cpu. For cuda: FailedPrecondition when this binary was
// built without CUDA, Unavailable (with the CUDA error) when no GPU is
// usable. Sets config->model.device to the chosen GPU.
absl::Status SelectDevice(TrainConfig* config, int rank);

// True when this binary carries the CUDA kernels and the NCCL backend.
bool BuiltWithCuda();

}  // namespace loom::train

#endif  // LOOM_TRAIN_DEVICE_SETUP_H_
