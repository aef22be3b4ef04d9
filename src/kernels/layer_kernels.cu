// Kernels of the decode-attention layers behind the runner's seam (kernels.h, "decode-attention layers"):
// the index append of an index update, the outlier split of a k-means result, token-list helpers and
// the oracle's exact token scores. The attention itself is the backend's sparse decode kernel.
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace retroinfer::cuda::detail {
namespace {

constexpr int kThreads = 256;

int grid_for(int64_t work, int per_block, int most) {
  const int64_t b = (work + per_block - 1) / per_block;
  return static_cast<int>(b < 1 ? 1 : (b > most ? most : b));
}

// ---- index append ----

__global__ void index_append_kernel(const IndexAppendParams p) {
  const int h = blockIdx.y, H = p.num_heads, co = p.c_old, cb = p.c_blk, cn = co + cb;
  const int64_t ob = co > 0 ? p.off_old[int64_t{h} * co] : 0;
  const int64_t oc = co > 0 ? p.off_old[int64_t{h + 1} * co] - ob : 0;
  const int64_t bb = p.off_blk[int64_t{h} * cb];
  const int64_t bc = p.off_blk[int64_t{h + 1} * cb] - bb;
  const int64_t nb = ob + bb;  // earlier heads' old and block members
  const int64_t n_new = p.n_old + p.n_blk;
  int64_t work = oc + bc;
  if (cn > work) work = cn;
  if (n_new > work) work = n_new;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < work; i += int64_t{gridDim.x} * blockDim.x) {
    if (i < oc) p.mem_new[nb + i] = p.mem_old[ob + i];
    else if (i < oc + bc) p.mem_new[nb + i] = p.mem_blk[bb + (i - oc)] + static_cast<uint32_t>(p.n_old);
    if (i < co) p.off_new[int64_t{h} * cn + i] = static_cast<int>(nb + p.off_old[int64_t{h} * co + i] - ob);
    else if (i < cn) p.off_new[int64_t{h} * cn + i] = static_cast<int>(nb + oc + p.off_blk[int64_t{h} * cb + (i - co)] - bb);
    if (p.asg_new == nullptr) {
      // the layer keeps no assignment (RetroLayer::set_keep_assignment(false))
    } else if (i < p.n_old) {
      p.asg_new[int64_t{h} * n_new + i] = p.asg_old[int64_t{h} * p.n_old + i];
    } else if (i < n_new) {
      const int a = p.asg_blk[int64_t{h} * p.n_blk + (i - p.n_old)];
      p.asg_new[int64_t{h} * n_new + i] = a < 0 ? -1 : a + co;
    }
  }
  if (h == H - 1 && blockIdx.x == 0 && threadIdx.x == 0) p.off_new[int64_t{H} * cn] = static_cast<int>(nb + oc + bc);
}

// ---- token lists ----

__global__ void list_append_kernel(const ListAppendParams p) {
  const int h = blockIdx.x;
  const int c0 = p.count[h], n = p.src_count[h];
  __syncthreads();  // every thread has read count[h] before thread 0 rewrites it
  for (int i = threadIdx.x; i < n; i += blockDim.x) p.list[int64_t{h} * p.list_stride + c0 + i] = p.src[int64_t{h} * p.src_stride + i];
  if (threadIdx.x == 0) p.count[h] = c0 + n;
}

__global__ void range_list_kernel(const RangeListParams p) {
  const int64_t total = p.a_end + (p.b_end - p.b_begin);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x)
    p.list[i] = static_cast<int>(i < p.a_end ? i : p.b_begin + (i - p.a_end));
  if (blockIdx.x == 0)
    for (int h = threadIdx.x; h < p.num_heads; h += blockDim.x) p.count[h] = static_cast<int>(total);
}

// ---- oracle ----

constexpr int kOracleTokens = 256;  // tokens per CTA of the logit kernel

// (max, sum of e^{x - max}) merge; (-inf, 0) is the empty state.
__device__ __forceinline__ void ml_merge(float& m, float& l, float m2, float l2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) {
    m = m2;
    l = l2;
    return;
  }
  const float mx = fmaxf(m, m2);
  l = l * expf(m - mx) + l2 * expf(m2 - mx);
  m = mx;
}

// CTA (chunk, h): warp per token, lanes over D; logits of every query head of the group and the CTA's
// (max, sum) per query head.
template <int D>
__global__ void __launch_bounds__(kThreads) oracle_logits_kernel(const OracleParams p) {
  constexpr int kE = D / 32;
  const int h = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, G = p.group;
  __shared__ float2 red[kThreads / 32][kMaxGroup];
  float qr[kMaxGroup][kE];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
#pragma unroll
    for (int e = 0; e < kE; ++e) qr[g][e] = g < G ? p.q[(int64_t{h} * G + g) * D + lane * kE + e] * p.scale : 0.0f;
  float m[kMaxGroup], l[kMaxGroup];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
  }
  const int64_t t0 = int64_t{blockIdx.x} * kOracleTokens;
  const int64_t t1 = t0 + kOracleTokens < p.num_tokens ? t0 + kOracleTokens : p.num_tokens;
  for (int64_t t = t0 + warp; t < t1; t += kThreads / 32) {
    const uint16_t* kr = p.k + (int64_t{h} * p.kv_stride + t) * D + lane * kE;
    float kf[kE];
    if constexpr (kE == 4) {
      const uint2 w = *reinterpret_cast<const uint2*>(kr);
      const float2 a = bf16x2_to_float2(w.x), b = bf16x2_to_float2(w.y);
      kf[0] = a.x; kf[1] = a.y; kf[2] = b.x; kf[3] = b.y;
    } else {
      const float2 a = bf16x2_to_float2(*reinterpret_cast<const uint32_t*>(kr));
      kf[0] = a.x; kf[1] = a.y;
    }
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g < G) {
        float acc = 0.0f;
#pragma unroll
        for (int e = 0; e < kE; ++e) acc += qr[g][e] * kf[e];
        acc = warp_sum(acc);
        if (lane == 0) p.logits[(int64_t{h} * G + g) * p.num_tokens + t] = acc;
        ml_merge(m[g], l[g], acc, 1.0f);
      }
    }
  }
  if (lane == 0)
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) red[warp][g] = make_float2(m[g], l[g]);
  __syncthreads();
  if (threadIdx.x < G) {
    const int g = threadIdx.x;
    float mm = -INFINITY, ll = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) ml_merge(mm, ll, red[w][g].x, red[w][g].y);
    p.partial[(int64_t{h} * G + g) * gridDim.x + blockIdx.x] = make_float2(mm, ll);
  }
}

// CTA (chunk, h): every CTA reduces the head's partials to lse_g, then scores its indexed tokens.
__global__ void __launch_bounds__(kThreads) oracle_score_kernel(const OracleParams p, int parts) {
  const int h = blockIdx.y, G = p.group, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __shared__ float2 red[kThreads / 32];
  __shared__ float lse[kMaxGroup];
  for (int g = 0; g < G; ++g) {
    float m = -INFINITY, l = 0.0f;
    for (int i = threadIdx.x; i < parts; i += blockDim.x) {
      const float2 x = p.partial[(int64_t{h} * G + g) * parts + i];
      ml_merge(m, l, x.x, x.y);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o), l2 = __shfl_xor_sync(0xffffffffu, l, o);
      ml_merge(m, l, m2, l2);
    }
    if (lane == 0) red[warp] = make_float2(m, l);
    __syncthreads();
    if (threadIdx.x == 0) {
      float mm = -INFINITY, ll = 0.0f;
      for (int w = 0; w < kThreads / 32; ++w) ml_merge(mm, ll, red[w].x, red[w].y);
      lse[g] = mm + logf(ll);
    }
    __syncthreads();
  }
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < p.n_idx; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = p.idx_begin + i;
    float s = 0.0f;
    for (int g = 0; g < G; ++g) s += expf(p.logits[(int64_t{h} * G + g) * p.num_tokens + t] - lse[g]);
    p.scores[int64_t{h} * p.n_idx + i] = s;
  }
}

// ---- outliers ----

// Warp per (h, i): squared residual ||k - c||^2 in f64 (the CPU's arithmetic), -inf when it is within
// f32 rounding of an exact representation (kExactRel: index/wave_index.cpp split_outliers).
template <int D>
__global__ void __launch_bounds__(kThreads) outlier_residual_kernel(const OutlierParams p) {
  constexpr int kE = D / 32;
  constexpr double kExactRel = 1e-10;
  const int lane = threadIdx.x & 31;
  const int64_t total = int64_t{p.num_heads} * p.n;
  for (int64_t w = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5; w < total;
       w += (int64_t{gridDim.x} * blockDim.x) >> 5) {
    const int64_t h = w / p.n, i = w % p.n;
    const int c = p.assignment[w];
    const uint16_t* kr = p.keys + (h * p.kv_stride + p.begin + i) * D + lane * kE;
    const float* cr = p.centroids + (h * p.num_clusters + c) * D + lane * kE;
    double s = 0.0, kk = 0.0, cc = 0.0;
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      const double k = bf16_to_f32(kr[e]), cv = cr[e], d = k - cv;
      s += d * d;
      kk += k * k;
      cc += cv * cv;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      s += __shfl_xor_sync(0xffffffffu, s, o);
      kk += __shfl_xor_sync(0xffffffffu, kk, o);
      cc += __shfl_xor_sync(0xffffffffu, cc, o);
    }
    if (lane == 0) p.residual[w] = s > kExactRel * (kk + cc) ? static_cast<float>(s) : -INFINITY;
  }
}

// Thread per picked token: assignment -1, its cluster touched, its KV token appended to the outliers.
__global__ void outlier_mark_kernel(const OutlierParams p) {
  const int h = blockIdx.x;
  const int cnt = p.picked_count[h], base = p.outlier_count[h];
  for (int j = threadIdx.x; j < cnt; j += blockDim.x) {
    const int i = p.picked[int64_t{h} * p.picked_stride + j];
    const int64_t at = int64_t{h} * p.n + i;
    const int c = p.assignment[at];
    p.touched[int64_t{h} * p.num_clusters + c] = 1;
    p.assignment[at] = -1;
    p.outliers[int64_t{h} * p.out_stride + base + j] = static_cast<int>(p.begin + i);
  }
}

// Warp per touched cluster: key / value sums of the remaining members (ascending token order, f32), the
// plain mean as centroid (an emptied cluster keeps its centroid), value sum and size; bf16 copies.
template <int D>
__global__ void __launch_bounds__(kThreads) outlier_recompute_kernel(const OutlierParams p) {
  constexpr int kE = D / 32;
  const int lane = threadIdx.x & 31;
  const int64_t total = int64_t{p.num_heads} * p.num_clusters;
  for (int64_t w = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5; w < total;
       w += (int64_t{gridDim.x} * blockDim.x) >> 5) {
    if (p.touched[w] == 0) continue;
    const int64_t h = w / p.num_clusters;
    float ks[kE], vs[kE];
#pragma unroll
    for (int e = 0; e < kE; ++e) ks[e] = vs[e] = 0.0f;
    int size = 0;
    for (int m = p.offsets[w]; m < p.offsets[w + 1]; ++m) {
      const uint32_t i = p.members[m];
      if (p.assignment[h * p.n + i] < 0) continue;
      ++size;
      const int64_t row = (h * p.kv_stride + p.begin + i) * D + lane * kE;
#pragma unroll
      for (int e = 0; e < kE; ++e) {
        ks[e] += bf16_to_f32(p.keys[row + e]);
        vs[e] += bf16_to_f32(p.values[row + e]);
      }
    }
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      const int64_t at = w * D + lane * kE + e;
      if (size > 0) {
        p.centroids[at] = ks[e] / static_cast<float>(size);
        p.centroids_bf16[at] = f32_to_bf16(p.centroids[at]);
      }
      p.value_sums[at] = vs[e];
      p.value_sums_bf16[at] = f32_to_bf16(vs[e]);
    }
    if (lane == 0) p.sizes[w] = size;
  }
}

constexpr int kScanThreads = 1024;

// Exclusive block scan of v; *total receives the sum. blockDim.x == kScanThreads.
__device__ int block_exclusive(int v, int* warp_sums, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {
    const int w = warp_sums[lane];
    int s = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += y;
    }
    warp_sums[lane] = s - w;
    if (lane == 31) warp_sums[32] = s;
  }
  __syncthreads();
  const int r = warp_sums[warp] + x - v;
  *total = warp_sums[32];
  __syncthreads();
  return r;
}

// CTA per head: offsets from the new sizes, members compacted (outliers dropped) into members_out, the
// outlier count advanced. Head h's compact base: h * n minus the earlier heads' picked tokens.
__global__ void __launch_bounds__(kScanThreads) outlier_compact_kernel(const OutlierParams p) {
  __shared__ int warp_sums[33];
  const int h = blockIdx.x, C = p.num_clusters;
  int64_t base = int64_t{h} * p.n;
  for (int j = 0; j < h; ++j) base -= p.picked_count[j];
  int64_t run = base;
  for (int c0 = 0; c0 < C; c0 += kScanThreads) {
    const int c = c0 + threadIdx.x;
    const int sz = c < C ? p.sizes[int64_t{h} * C + c] : 0;
    int tot = 0;
    const int ex = block_exclusive(sz, warp_sums, &tot);
    if (c < C) p.offsets[int64_t{h} * C + c] = static_cast<int>(run + ex);
    run += tot;
  }
  if (h == p.num_heads - 1 && threadIdx.x == 0) p.offsets[int64_t{p.num_heads} * C] = static_cast<int>(run);
  int64_t out = base;
  for (int64_t j0 = 0; j0 < p.n; j0 += kScanThreads) {
    const int64_t j = j0 + threadIdx.x;
    uint32_t m = 0;
    int keep = 0;
    if (j < p.n) {
      m = p.members[int64_t{h} * p.n + j];
      keep = p.assignment[int64_t{h} * p.n + m] >= 0 ? 1 : 0;
    }
    int tot = 0;
    const int ex = block_exclusive(keep, warp_sums, &tot);
    if (keep) p.members_out[out + ex] = m;
    out += tot;
  }
  if (threadIdx.x == 0) p.outlier_count[h] += p.picked_count[h];
}

}  // namespace

cudaError_t index_append(const IndexAppendParams& p, cudaStream_t s) {
  int64_t work = int64_t{p.n_old} + p.n_blk;
  const int64_t cn = int64_t{p.c_old} + p.c_blk;
  if (cn > work) work = cn;
  const dim3 grid(grid_for(work, kThreads, 1024), p.num_heads);
  index_append_kernel<<<grid, kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

cudaError_t list_append(const ListAppendParams& p, cudaStream_t s) {
  list_append_kernel<<<p.num_heads, kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

cudaError_t range_list(const RangeListParams& p, cudaStream_t s) {
  range_list_kernel<<<grid_for(p.a_end + (p.b_end - p.b_begin), kThreads, 1024), kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

int oracle_blocks(int64_t num_tokens) {
  return static_cast<int>((num_tokens + kOracleTokens - 1) / kOracleTokens);
}

cudaError_t oracle_scores(const OracleParams& p, cudaStream_t s) {
  const int parts = oracle_blocks(p.num_tokens);
  const dim3 g1(parts, p.num_heads);
  if (p.head_dim == 128) oracle_logits_kernel<128><<<g1, kThreads, 0, s>>>(p);
  else if (p.head_dim == 64) oracle_logits_kernel<64><<<g1, kThreads, 0, s>>>(p);
  else return cudaErrorInvalidValue;
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const dim3 g2(grid_for(p.n_idx, kThreads, 256), p.num_heads);
  oracle_score_kernel<<<g2, kThreads, 0, s>>>(p, parts);
  return cudaGetLastError();
}

cudaError_t outlier_residuals(const OutlierParams& p, cudaStream_t s) {
  const int blocks = grid_for(int64_t{p.num_heads} * p.n, kThreads / 32, 4096);
  if (p.head_dim == 128) outlier_residual_kernel<128><<<blocks, kThreads, 0, s>>>(p);
  else if (p.head_dim == 64) outlier_residual_kernel<64><<<blocks, kThreads, 0, s>>>(p);
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t outlier_remove(const OutlierParams& p, cudaStream_t s) {
  cudaError_t e = cudaMemsetAsync(p.touched, 0, size_t(p.num_heads) * p.num_clusters, s);
  if (e != cudaSuccess) return e;
  outlier_mark_kernel<<<p.num_heads, kThreads, 0, s>>>(p);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  const int blocks = grid_for(int64_t{p.num_heads} * p.num_clusters, kThreads / 32, 4096);
  if (p.head_dim == 128) outlier_recompute_kernel<128><<<blocks, kThreads, 0, s>>>(p);
  else if (p.head_dim == 64) outlier_recompute_kernel<64><<<blocks, kThreads, 0, s>>>(p);
  else return cudaErrorInvalidValue;
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  outlier_compact_kernel<<<p.num_heads, kScanThreads, 0, s>>>(p);
  return cudaGetLastError();
}

}  // namespace retroinfer::cuda::detail
