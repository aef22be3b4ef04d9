// Grouping of the k-means assignment by cluster: a stable radix sort (CUB, part of the CUDA toolkit) of
// the keys h * C + cluster with the index token as payload, so that every cluster's members come out in
// ascending token order (the CPU reference's order), followed by the CSR offsets. Its own file: CUB's
// templates are the slowest part of the backend to compile.
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>

#include "kernels/kernels.h"

namespace retroinfer::cuda::detail {
namespace {

int bits_for(int64_t values) {
  int b = 1;
  while ((int64_t{1} << b) < values) ++b;
  return b;
}

// offsets[c] = first sorted position whose key >= c, for every c in [0, H*C]: position q writes the
// offsets of the keys in (key[q-1], key[q]], so each entry is written exactly once.
__global__ void offsets_kernel(const uint32_t* keys, int64_t items, int64_t num_flat, int* offsets) {
  for (int64_t q = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; q <= items; q += int64_t{gridDim.x} * blockDim.x) {
    const int64_t prev = q == 0 ? -1 : static_cast<int64_t>(keys[q - 1]);
    const int64_t cur = q == items ? num_flat : static_cast<int64_t>(keys[q]);
    for (int64_t c = prev + 1; c <= cur; ++c) offsets[c] = static_cast<int>(q);
  }
}

}  // namespace

size_t kmeans_sort_temp_bytes(int64_t items, int end_bit) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t*>(nullptr),
                                  static_cast<uint32_t*>(nullptr), static_cast<const uint32_t*>(nullptr),
                                  static_cast<uint32_t*>(nullptr), items, 0, end_bit);
  return bytes;
}

cudaError_t kmeans_group(const KMeansKernelParams& p, cudaStream_t s) {
  const int64_t items = int64_t{p.num_heads} * p.n_idx;
  const int64_t num_flat = int64_t{p.num_heads} * p.num_clusters;
  size_t bytes = p.sort_temp_bytes;
  cudaError_t e = cub::DeviceRadixSort::SortPairs(p.sort_temp, bytes, p.sort_keys, p.sort_keys_out, p.iota,
                                                  p.members, items, 0, bits_for(num_flat), s);
  if (e != cudaSuccess) return e;
  const int blocks = static_cast<int>((items + 256) / 256 < 4096 ? (items + 256) / 256 : 4096);
  offsets_kernel<<<blocks, 256, 0, s>>>(p.sort_keys_out, items, num_flat, p.offsets);
  return cudaGetLastError();
}

}  // namespace retroinfer::cuda::detail
