// Cluster-contiguous K/V rows for RetroLayer::make_cluster_contiguous (an experiment of run 15's next step,
// docs/cuda-kernels.md "Cluster-contiguous rows"): the rows of one head's indexed range gathered into
// cluster order, the members rewritten to row positions, and the per-row cluster ids rebuilt.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kernels.h"

namespace retroinfer::cuda::detail {
namespace {

constexpr int kThreads = 256;

// dst[j, :] = src[members[j], :] for j < n: rows of `row_bytes` bytes (a multiple of 16), thread = one
// 16-byte chunk.
__global__ void gather_rows_kernel(const uint4* src, const uint32_t* members, uint4* dst, int64_t n, int chunks) {
  const int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (e >= n * chunks) return;
  const int64_t j = e / chunks;
  const int c = static_cast<int>(e % chunks);
  dst[j * chunks + c] = src[int64_t{members[j]} * chunks + c];
}

__global__ void iota_kernel(uint32_t* out, int64_t n, int64_t per_head) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = static_cast<uint32_t>(i % per_head);
}

// assignment[h * n_idx + (p - h * n_idx)] = c for the positions p of flat cluster h * C + c: warp per cluster.
__global__ void assignment_from_offsets_kernel(const int* offsets, int* assignment, int64_t num_flat, int C) {
  const int64_t hc = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (hc >= num_flat) return;
  for (int p = offsets[hc] + lane; p < offsets[hc + 1]; p += 32) assignment[p] = static_cast<int>(hc % C);
}

int blocks_for(int64_t work) { return static_cast<int>((work + kThreads - 1) / kThreads); }

}  // namespace

cudaError_t gather_rows(const uint16_t* src, const uint32_t* members, uint16_t* dst, int64_t n, int row_elems,
                        cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  if (row_elems % 8 != 0 || (reinterpret_cast<uintptr_t>(src) & 15) != 0 || (reinterpret_cast<uintptr_t>(dst) & 15) != 0)
    return cudaErrorInvalidValue;
  const int chunks = row_elems / 8;
  gather_rows_kernel<<<blocks_for(n * chunks), kThreads, 0, s>>>(reinterpret_cast<const uint4*>(src), members,
                                                                  reinterpret_cast<uint4*>(dst), n, chunks);
  return cudaGetLastError();
}

cudaError_t members_to_rows(uint32_t* members, int* assignment, const int* offsets, int64_t num_heads,
                            int64_t n_idx, int num_clusters, cudaStream_t s) {
  const int64_t n = num_heads * n_idx;
  if (n <= 0) return cudaSuccess;
  iota_kernel<<<blocks_for(n) < 4096 ? blocks_for(n) : 4096, kThreads, 0, s>>>(members, n, n_idx);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || assignment == nullptr) return e;
  const int64_t flat = num_heads * num_clusters;
  assignment_from_offsets_kernel<<<blocks_for(flat * 32), kThreads, 0, s>>>(offsets, assignment, flat, num_clusters);
  return cudaGetLastError();
}

}  // namespace retroinfer::cuda::detail
