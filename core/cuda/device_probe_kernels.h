#ifndef LOOM_CORE_CUDA_DEVICE_PROBE_KERNELS_H_
#define LOOM_CORE_CUDA_DEVICE_PROBE_KERNELS_H_

// C interface of device_probe.cu (kept free of Abseil so nvcc sees plain C++).
// Each returns 0 on success, else the CUDA error code with `err` filled in.
extern "C" {
int loom_cuda_device_count(int* count, char* err, int err_len);
int loom_cuda_fill_iota(float* host_out, int n, float value, char* err, int err_len);
}

#endif  // LOOM_CORE_CUDA_DEVICE_PROBE_KERNELS_H_
