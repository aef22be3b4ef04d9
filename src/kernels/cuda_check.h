// Checked CUDA calls for the CUDA backend (host side). Included only from src/backend/cuda.
//
// RETROINFER_CUDA_CHECK(expr) throws retroinfer::Error with the call, the CUDA error string and the place.
// launch_check(name, stream) checks the launch status (cudaGetLastError) and, when the environment sets
// RETROINFER_CUDA_SYNC=1, synchronises the stream so that an asynchronous fault is reported at the kernel
// that caused it (debug switch; costs the overlap of host and device).
#pragma once

#include <cuda_runtime.h>

#include "retroinfer/error.h"

#define RETROINFER_CUDA_CHECK(expr)                                                                   \
  do {                                                                                                \
    const cudaError_t retroinfer_cuda_err_ = (expr);                                                  \
    if (retroinfer_cuda_err_ != cudaSuccess)                                                          \
      RETROINFER_FAIL("CUDA call `", #expr, "` failed: ", cudaGetErrorString(retroinfer_cuda_err_),   \
                      " (check the device state; rerun with RETROINFER_CUDA_SYNC=1 to locate faults)"); \
  } while (0)

namespace retroinfer::cuda::detail {

// True when RETROINFER_CUDA_SYNC=1 (read once).
bool sync_after_launch();

// Throws Error naming `kernel` if `status` (a launcher's return) or the last launch failed; synchronises
// `stream` first when the debug switch is on.
void launch_check(cudaError_t status, const char* kernel, cudaStream_t stream);

}  // namespace retroinfer::cuda::detail
