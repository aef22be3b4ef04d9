// Measured memory bandwidths for the bytes-moved floors of `retroinfer bench decode`. Host-only header.
#pragma once

#include <cstddef>

namespace retroinfer::cuda {

struct BandwidthFigures {
  double hbm_gb_s = 0.0;  // device-to-device copy, (bytes read + bytes written) / time, GB/s (1e9)
  double h2d_gb_s = 0.0;  // pinned host -> device cudaMemcpyAsync, bytes / time, GB/s
  size_t hbm_bytes = 0, h2d_bytes = 0;  // bytes per copy
  int reps = 0;                         // timed copies per figure (median reported)
};

// Medians of `reps` timed copies (CUDA events) after one warm-up copy each: a device-to-device copy of
// hbm_bytes (large against the 60 MB L2, so it streams from HBM) and a pinned host-to-device copy of
// h2d_bytes. Allocates and frees the buffers; synchronous. Throws Error on CUDA failures.
BandwidthFigures measure_bandwidth(size_t hbm_bytes = size_t{1} << 30, size_t h2d_bytes = size_t{256} << 20,
                                   int reps = 10);

}  // namespace retroinfer::cuda
