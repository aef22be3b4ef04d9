// measure_bandwidth: HBM (device copy) and PCIe (pinned host -> device) figures for bytes-moved floors.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "retroinfer/cuda_device.h"
#include "kernels/cuda_check.h"
#include "retroinfer/error.h"

namespace retroinfer::cuda {

namespace {

// Owning wrappers so that an exception between allocations frees what was allocated.
struct DeviceMem {
  void* p = nullptr;
  explicit DeviceMem(size_t n) { RETROINFER_CUDA_CHECK(cudaMalloc(&p, n)); }
  ~DeviceMem() { cudaFree(p); }
};
struct PinnedMem {
  void* p = nullptr;
  explicit PinnedMem(size_t n) { RETROINFER_CUDA_CHECK(cudaMallocHost(&p, n)); }
  ~PinnedMem() { cudaFreeHost(p); }
};
struct Events {
  cudaEvent_t a = nullptr, b = nullptr;
  Events() {
    RETROINFER_CUDA_CHECK(cudaEventCreate(&a));
    RETROINFER_CUDA_CHECK(cudaEventCreate(&b));
  }
  ~Events() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
};

template <typename Copy>
double median_ms(int reps, cudaStream_t s, Copy copy) {
  Events ev;
  copy();  // warm-up
  RETROINFER_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<float> ms(static_cast<size_t>(reps));
  for (auto& t : ms) {
    RETROINFER_CUDA_CHECK(cudaEventRecord(ev.a, s));
    copy();
    RETROINFER_CUDA_CHECK(cudaEventRecord(ev.b, s));
    RETROINFER_CUDA_CHECK(cudaEventSynchronize(ev.b));
    RETROINFER_CUDA_CHECK(cudaEventElapsedTime(&t, ev.a, ev.b));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

BandwidthFigures measure_bandwidth(size_t hbm_bytes, size_t h2d_bytes, int reps) {
  RETROINFER_CHECK(hbm_bytes >= (size_t{1} << 20) && h2d_bytes >= (size_t{1} << 20) && reps >= 1,
                   "measure_bandwidth: copies must be >= 1 MiB and reps >= 1");
  BandwidthFigures f;
  f.hbm_bytes = hbm_bytes;
  f.h2d_bytes = h2d_bytes;
  f.reps = reps;
  cudaStream_t s = nullptr;
  RETROINFER_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  try {
    {
      DeviceMem a(hbm_bytes), b(hbm_bytes);
      RETROINFER_CUDA_CHECK(cudaMemsetAsync(a.p, 1, hbm_bytes, s));
      const double ms = median_ms(reps, s, [&] {
        RETROINFER_CUDA_CHECK(cudaMemcpyAsync(b.p, a.p, hbm_bytes, cudaMemcpyDeviceToDevice, s));
      });
      f.hbm_gb_s = 2.0 * double(hbm_bytes) / (ms * 1e-3) / 1e9;
    }
    {
      PinnedMem h(h2d_bytes);
      DeviceMem d(h2d_bytes);
      std::fill_n(static_cast<unsigned char*>(h.p), h2d_bytes, static_cast<unsigned char>(1));
      const double ms = median_ms(reps, s, [&] {
        RETROINFER_CUDA_CHECK(cudaMemcpyAsync(d.p, h.p, h2d_bytes, cudaMemcpyHostToDevice, s));
      });
      f.h2d_gb_s = double(h2d_bytes) / (ms * 1e-3) / 1e9;
    }
  } catch (...) {
    cudaStreamDestroy(s);
    throw;
  }
  RETROINFER_CUDA_CHECK(cudaStreamDestroy(s));
  return f;
}

}  // namespace retroinfer::cuda
