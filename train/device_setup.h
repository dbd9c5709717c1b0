#ifndef LOOM_TRAIN_DEVICE_SETUP_H_
#define LOOM_TRAIN_DEVICE_SETUP_H_

// Binds a rank to its device before anything is allocated: for --device=cuda
// the GPU its communicator uses (NCCL: the local rank mod the visible GPUs),
// so the model and the collectives always share one device; otherwise
// `local_rank` (comm::launch::DiscoverRank's) mod the visible GPUs. It is made current for the calling thread, and
// the model's parameters and activations go there.

#include "absl/status/status.h"
#include "core/device.h"
#include "train/config.h"

namespace loom::train {

// No-op for --device=cpu. For cuda: FailedPrecondition when this binary was
// built without CUDA, Unavailable (with the CUDA error) when no GPU is
// usable. Sets config->model.device to the chosen GPU.
absl::Status SelectDevice(TrainConfig* config, int local_rank,
                          core::Device comm_device = core::Device::CPU());

// True when this binary carries the CUDA kernels and the NCCL backend.
bool BuiltWithCuda();

}  // namespace loom::train

#endif  // LOOM_TRAIN_DEVICE_SETUP_H_
