// The budget calibration's ranking on the device (layer_budget_kernels.h): each row's cluster masses sorted
// heaviest first by one radix sort of 64-bit keys (row << 32 | ~bits(mass): a mass is >= 0, so its bits order as
// its value and their complement orders it heaviest first within its row), then a block per row sums, for each
// retrieval size, the mass of the clusters past it. Its own file: CUB's templates are slow to compile.
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>

#include "kernels/layer_budget_kernels.h"

namespace retroinfer::cuda::detail {
namespace {

constexpr int kRankThreads = 256;

int bits_for(int64_t values) {
  int b = 1;
  while ((int64_t{1} << b) < values) ++b;
  return b;
}

__global__ void rank_keys_kernel(const float* mass, int64_t items, int clusters, uint64_t* keys) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < items; i += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t row = static_cast<uint64_t>(i / clusters);
    keys[i] = (row << 32) | static_cast<uint64_t>(~__float_as_uint(mass[i]));
  }
}

struct Counts {
  int n[kCalibrationMultiples];
};

// One block per row: missed[row][m] = the sum of the row's sorted masses from position counts.n[m] on, in f64,
// reduced in a fixed order (warps, then their partial sums in warp order).
__global__ void __launch_bounds__(kRankThreads) missed_kernel(const uint64_t* sorted, int clusters, Counts counts,
                                                              double* missed) {
  const int64_t base = int64_t{blockIdx.x} * clusters;
  double acc[kCalibrationMultiples];
  for (int m = 0; m < kCalibrationMultiples; ++m) acc[m] = 0.0;
  for (int j = threadIdx.x; j < clusters; j += kRankThreads) {
    const double v = __uint_as_float(~static_cast<uint32_t>(sorted[base + j]));
    for (int m = 0; m < kCalibrationMultiples; ++m)
      if (j >= counts.n[m]) acc[m] += v;
  }
  __shared__ double partial[kCalibrationMultiples][kRankThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int m = 0; m < kCalibrationMultiples; ++m) {
    double x = acc[m];
    for (int off = 16; off > 0; off /= 2) x += __shfl_down_sync(0xffffffffu, x, off);
    if (lane == 0) partial[m][warp] = x;
  }
  __syncthreads();
  if (threadIdx.x < kCalibrationMultiples) {
    double x = 0.0;
    for (int w = 0; w < kRankThreads / 32; ++w) x += partial[threadIdx.x][w];
    missed[int64_t{blockIdx.x} * kCalibrationMultiples + threadIdx.x] = x;
  }
}

}  // namespace

size_t calibration_rank_temp_bytes(int max_rows, int clusters) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortKeys(nullptr, bytes, static_cast<const uint64_t*>(nullptr),
                                 static_cast<uint64_t*>(nullptr), int64_t{max_rows} * clusters, 0,
                                 32 + bits_for(max_rows));
  return bytes;
}

cudaError_t calibration_rank(const CalibrationRankParams& p, cudaStream_t s) {
  if (p.rows <= 0 || p.clusters <= 0) return cudaSuccess;
  if (p.rows > p.max_rows) return cudaErrorInvalidValue;
  const int64_t items = int64_t{p.rows} * p.clusters;
  const int64_t blocks = (items + 255) / 256 < 4096 ? (items + 255) / 256 : 4096;
  rank_keys_kernel<<<static_cast<int>(blocks), 256, 0, s>>>(p.group_mass, items, p.clusters, p.keys);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  size_t bytes = p.sort_temp_bytes;
  e = cub::DeviceRadixSort::SortKeys(p.sort_temp, bytes, p.keys, p.keys_sorted, items, 0, 32 + bits_for(p.max_rows),
                                     s);
  if (e != cudaSuccess) return e;
  Counts c;
  for (int m = 0; m < kCalibrationMultiples; ++m) c.n[m] = p.counts[m];
  missed_kernel<<<p.rows, kRankThreads, 0, s>>>(p.keys_sorted, p.clusters, c, p.missed);
  return cudaGetLastError();
}

}  // namespace retroinfer::cuda::detail
