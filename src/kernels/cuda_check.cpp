// Launch checking and the RETROINFER_CUDA_SYNC debug switch.
#include "kernels/cuda_check.h"
#include "kernels/stream_priority.h"

#include <cstdlib>
#include <cstring>

namespace retroinfer::cuda::detail {

bool sync_after_launch() {
  static const bool on = [] {
    const char* s = std::getenv("RETROINFER_CUDA_SYNC");
    return s != nullptr && std::strcmp(s, "1") == 0;
  }();
  return on;
}

void launch_check(cudaError_t status, const char* kernel, cudaStream_t stream) {
  if (status == cudaSuccess) status = cudaGetLastError();
  if (status == cudaSuccess && sync_after_launch()) status = cudaStreamSynchronize(stream);
  if (status != cudaSuccess)
    RETROINFER_FAIL("CUDA kernel ", kernel, " failed: ", cudaGetErrorString(status),
                    " (rerun with RETROINFER_CUDA_SYNC=1 to report faults at the launch that caused them)");
}

StreamPriorities stream_priorities() {
  int least = 0, greatest = 0;
  RETROINFER_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  StreamPriorities p;
  p.urgent = greatest;
  p.compute = greatest < least ? greatest + 1 : greatest;  // one level below the urgent one where there are two
  return p;
}

}  // namespace retroinfer::cuda::detail
