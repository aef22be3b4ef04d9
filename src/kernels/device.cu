// Device discovery for the CUDA backend.
#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "retroinfer/cuda_device.h"

namespace retroinfer::cuda {

bool device_available() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls are not poisoned
    return false;
  }
  return n > 0;
}

std::string device_description() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("no usable CUDA device: ") + cudaGetErrorString(e);
  if (n == 0) return "no CUDA device";
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "CUDA device 0: properties unavailable";
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s (sm_%d%d, %.0f GiB)", p.name, p.major, p.minor,
                static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace retroinfer::cuda
