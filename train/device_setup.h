#ifndef LOOM_TRAIN_DEVICE_SETUP_H_
#define LOOM_TRAIN_DEVICE_SETUP_H_

// Binds a rank to its device before anything is allocated: for --device=cuda
// the GPU its communicator uses (NCCL: the local rank mod the visible GPUs),
// so the model and the collectives always share one device; otherwise
// `local_rank` (comm::launch::RankInfo's) mod the visible GPUs. It is made
// current for the calling thread, and the model's parameters and activations
// go there.

#include "absl/status/status.h"
#include "config/config.h"
#include "core/device.h"

namespace loom::train {

// What SelectDevice would refuse, checked before any rank starts (a launcher
// calls it with the ranks it is about to start on this node). No-op for
// --device=cpu. For cuda: FailedPrecondition when this binary was built
// without CUDA, Unavailable (with the CUDA error) when no GPU is usable,
// InvalidArgument when the node has fewer GPUs than `ranks_on_this_node`
// (NCCL refuses two ranks on one GPU).
absl::Status CheckDevice(const TrainConfig& config, int ranks_on_this_node);

// CheckDevice, then sets config->model.device to this rank's GPU and makes it
// current. `local_world_size`: ranks on this node (comm::launch::RankInfo's).
absl::Status SelectDevice(TrainConfig* config, int local_rank, int local_world_size,
                          core::Device comm_device = core::Device::CPU());

// True when this binary carries the CUDA kernels and the NCCL backend.
bool BuiltWithCuda();

}  // namespace loom::train

#endif  // LOOM_TRAIN_DEVICE_SETUP_H_
