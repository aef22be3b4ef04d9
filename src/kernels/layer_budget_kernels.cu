// The budget calibration's kernels (layer_budget_kernels.h).
#include "kernels/common.cuh"
#include "kernels/layer_budget_kernels.h"

namespace retroinfer::cuda::detail {
namespace {

constexpr int kRows = kCalibrationRows, kTile = kCalibrationTile, kWarps = kTile / 32;

// The logits of this thread's token against the pass's rows of KV head blockIdx.y (query i, head g: row i * G +
// g), scaled; -inf past a row's query or past the cache. qs: the rows, staged by the caller.
__device__ void tile_logits(const CalibrationMassParams& p, const float* qs, int rows, int G, int64_t t,
                            float* logit) {
  const int D = p.head_dim;
#pragma unroll
  for (int r = 0; r < kRows; ++r) logit[r] = 0.0f;
  if (t < p.num_tokens) {
    const uint4* row = reinterpret_cast<const uint4*>(p.k + (int64_t{blockIdx.y} * p.kv_stride + t) * D);
    for (int c = 0; c < D / 8; ++c) {
      float f[8];
      bf16x8_to_float(row[c], f);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r < rows) {
          float a = logit[r];
#pragma unroll
          for (int e = 0; e < 8; ++e) a += qs[r * D + c * 8 + e] * f[e];
          logit[r] = a;
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    if (r >= rows || t >= p.num_tokens || t > p.first_pos + r / G) logit[r] = -INFINITY;
}

__device__ void stage_rows(const CalibrationMassParams& p, float* qs, int rows, int G) {
  const int D = p.head_dim;
  for (int x = threadIdx.x; x < rows * D; x += kTile) {
    const int r = x / D, d = x % D, i = r / G, g = r % G;
    qs[r * D + d] = p.q[(int64_t{i} * p.num_heads_q + int64_t{blockIdx.y} * G + g) * D + d] * p.scale;
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kTile) row_stats_tile_kernel(CalibrationMassParams p) {
  __shared__ float qs[kCalibrationQueryFloats];
  __shared__ float red[kWarps][kRows];
  __shared__ float tmax[kRows];
  const int G = p.num_heads_q / p.num_heads_kv, rows = p.n * G;
  stage_rows(p, qs, rows, G);
  const int64_t t = int64_t{blockIdx.x} * kTile + threadIdx.x;
  float logit[kRows];
  tile_logits(p, qs, rows, G, t, logit);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (r >= rows) break;
    float v = logit[r];
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) red[warp][r] = v;
  }
  __syncthreads();
  if (threadIdx.x < rows) {
    float m = red[0][threadIdx.x];
    for (int w = 1; w < kWarps; ++w) m = fmaxf(m, red[w][threadIdx.x]);
    tmax[threadIdx.x] = m;
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (r >= rows) break;
    float v = tmax[r] == -INFINITY ? 0.0f : __expf(logit[r] - tmax[r]);
    v = warp_sum(v);
    if (lane == 0) red[warp][r] = v;
  }
  __syncthreads();
  if (threadIdx.x < rows) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) sum += red[w][threadIdx.x];
    const int r = threadIdx.x, i = r / G, g = r % G;
    const int64_t row = int64_t{i} * p.num_heads_q + int64_t{blockIdx.y} * G + g;
    p.tile_stats[row * gridDim.x + blockIdx.x] = make_float2(tmax[r], sum);
  }
}

__global__ void row_stats_merge_kernel(CalibrationMassParams p, int64_t tiles) {
  __shared__ float red[32];
  const float2* ts = p.tile_stats + int64_t{blockIdx.x} * tiles;
  float m = -INFINITY;
  for (int64_t x = threadIdx.x; x < tiles; x += blockDim.x) m = fmaxf(m, ts[x].x);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();
  m = red[0];
  for (int w = 1; w < int(blockDim.x >> 5); ++w) m = fmaxf(m, red[w]);
  __syncthreads();
  float s = 0.0f;
  for (int64_t x = threadIdx.x; x < tiles; x += blockDim.x)
    if (ts[x].x != -INFINITY) s += ts[x].y * __expf(ts[x].x - m);
  s = warp_sum(s);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int w = 0; w < int(blockDim.x >> 5); ++w) sum += red[w];
    p.row_stats[blockIdx.x] = make_float2(m, sum);
  }
}

__global__ void __launch_bounds__(kTile) cluster_mass_kernel(CalibrationMassParams p) {
  __shared__ float qs[kCalibrationQueryFloats];
  __shared__ float2 st[kRows];
  const int G = p.num_heads_q / p.num_heads_kv, rows = p.n * G;
  const int64_t t0 = int64_t{blockIdx.x} * kTile;
  if (t0 + kTile <= p.idx_begin || t0 >= p.idx_begin + p.n_idx) return;  // the tile holds no indexed token
  stage_rows(p, qs, rows, G);
  if (threadIdx.x < rows) {
    const int r = threadIdx.x, i = r / G, g = r % G;
    st[r] = p.row_stats[int64_t{i} * p.num_heads_q + int64_t{blockIdx.y} * G + g];
  }
  __syncthreads();
  const int64_t t = t0 + threadIdx.x;
  float logit[kRows];
  tile_logits(p, qs, rows, G, t, logit);
  if (t < p.idx_begin || t >= p.idx_begin + p.n_idx) return;
  const int c = p.token_cluster[int64_t{blockIdx.y} * p.n_idx + (t - p.idx_begin)];
  if (c < 0) return;  // an outlier: read exactly at every step
  for (int i = 0; i < p.n; ++i) {
    float m = 0.0f;
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (r / G == i && r < rows && logit[r] != -INFINITY) m += __expf(logit[r] - st[r].x) / st[r].y;
    if (m > 0.0f) atomicAdd(&p.group_mass[(int64_t{i} * p.num_heads_kv + blockIdx.y) * p.clusters + c], m);
  }
}

__global__ void token_clusters_kernel(const int* offsets, const uint32_t* members, int clusters, int64_t n_idx,
                                      int* token_cluster) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= clusters) return;
  const int64_t c = int64_t{blockIdx.y} * clusters + j;
  for (int e = offsets[c]; e < offsets[c + 1]; ++e) token_cluster[int64_t{blockIdx.y} * n_idx + members[e]] = j;
}

bool valid(const CalibrationMassParams& p) {
  return p.n > 0 && p.head_dim % 8 == 0 && p.head_dim <= 256 && p.num_heads_kv > 0 &&
         p.num_heads_q % p.num_heads_kv == 0 &&
         p.n * (p.num_heads_q / p.num_heads_kv) <= calibration_max_rows(p.head_dim) &&
         p.first_pos >= 0 && p.first_pos + p.n <= p.num_tokens && p.num_heads_kv <= 65535;
}

}  // namespace

cudaError_t calibration_token_clusters(const int* offsets, const uint32_t* members, int heads, int clusters,
                                       int64_t n_idx, int* token_cluster, cudaStream_t s) {
  if (heads <= 0 || clusters <= 0 || n_idx <= 0) return cudaSuccess;
  cudaError_t e = cudaMemsetAsync(token_cluster, 0xff, size_t(heads) * n_idx * 4, s);
  if (e != cudaSuccess) return e;
  constexpr int kThreads = 128;
  token_clusters_kernel<<<dim3((clusters + kThreads - 1) / kThreads, heads), kThreads, 0, s>>>(offsets, members,
                                                                                               clusters, n_idx,
                                                                                               token_cluster);
  return cudaGetLastError();
}

cudaError_t calibration_row_stats(const CalibrationMassParams& p, cudaStream_t s) {
  if (!valid(p)) return cudaErrorInvalidValue;
  const int64_t tiles = calibration_tiles(p.num_tokens);
  if (tiles > 0x7fffffff) return cudaErrorInvalidValue;
  row_stats_tile_kernel<<<dim3(static_cast<unsigned>(tiles), p.num_heads_kv), kTile, 0, s>>>(p);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  row_stats_merge_kernel<<<p.n * p.num_heads_q, 256, 0, s>>>(p, tiles);
  return cudaGetLastError();
}

cudaError_t calibration_cluster_mass(const CalibrationMassParams& p, cudaStream_t s) {
  if (!valid(p)) return cudaErrorInvalidValue;
  if (p.clusters <= 0 || p.n_idx <= 0) return cudaSuccess;
  const int64_t tiles = calibration_tiles(p.num_tokens);
  cluster_mass_kernel<<<dim3(static_cast<unsigned>(tiles), p.num_heads_kv), kTile, 0, s>>>(p);
  return cudaGetLastError();
}

}  // namespace retroinfer::cuda::detail
