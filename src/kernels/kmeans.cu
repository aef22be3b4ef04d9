// Segmented spherical k-means on the GPU (docs/design.md §2; the CPU specification is src/index/kmeans.h),
// batched over flat heads and segments.
//
// Arithmetic against the CPU reference: the mean key, the centroid sums and the value sums are f32 sums
// of the bf16 keys/values converted to f32 (sum order: fixed, ascending token order inside a cluster);
// the assignment scores are exact integer dots of per-row int8 copies of the centred keys and centroids
// times the centroid's scale (kmeans_kernels.h centred_q8). An argmax can therefore differ from the CPU's
// f32 scores where two centroids score within the int8 rounding of each other (~2^-8 of the row's largest
// element); the GPU tests measure that mismatch rate and the objective. The assignment kernel is in
// kmeans_assign.cu, the grouping in kmeans_group.cu (counting sort, segment passes) and kmeans_sort.cu
// (radix sort).
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace retroinfer::cuda::detail {
namespace {

constexpr int kThreads = 256;

// Partial sums of the indexed keys: CTA (chunk, h) sums rows of one chunk with D/8 threads per row.
template <int D>
__global__ void __launch_bounds__(kThreads) mean_partial_kernel(const KMeansKernelParams p) {
  constexpr int kPerRow = D / 8, kRows = kThreads / kPerRow;
  __shared__ float red[kThreads][8 + 1];
  const int h = blockIdx.y, chunk = blockIdx.x;
  const int64_t per = (p.n_idx + kMeanChunks - 1) / kMeanChunks;
  const int64_t r0 = chunk * per, r1 = r0 + per < p.n_idx ? r0 + per : p.n_idx;
  const int col = threadIdx.x % kPerRow, rsub = threadIdx.x / kPerRow;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const uint16_t* kh = p.keys + (int64_t{h} * p.kv_stride + p.idx_begin) * D;
  for (int64_t r = r0 + rsub; r < r1; r += kRows) {
    float f[8];
    bf16x8_to_float(*reinterpret_cast<const uint4*>(kh + r * D + col * 8), f);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] += f[j];
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) red[threadIdx.x][j] = acc[j];
  __syncthreads();
  if (threadIdx.x < kPerRow) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int rs = 0; rs < kRows; ++rs)
#pragma unroll
      for (int j = 0; j < 8; ++j) s[j] += red[rs * kPerRow + threadIdx.x][j];
#pragma unroll
    for (int j = 0; j < 8; ++j) p.mean_partial[(int64_t{h} * kMeanChunks + chunk) * D + threadIdx.x * 8 + j] = s[j];
  }
}

__global__ void mean_finish_kernel(const KMeansKernelParams p) {
  const int h = blockIdx.x, D = p.head_dim;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float s = 0.0f;
    for (int c = 0; c < kMeanChunks; ++c) s += p.mean_partial[(int64_t{h} * kMeanChunks + c) * D + d];
    p.mean[int64_t{h} * D + d] = s / static_cast<float>(p.n_idx);
  }
}

// Per-row int8 quantization (kmeans_kernels.h centred_q8): with m = max |x| of the row, inv = 127 / m (0 for a zero
// row), x_q = clamp(rint(x * inv), -127, 127); the row's scale is m / 127 (IEEE operations throughout, so
// the host tests repeat them exactly).
__device__ __forceinline__ float q8_inv(float m) { return m > 0.0f ? __fdiv_rn(127.0f, m) : 0.0f; }
__device__ __forceinline__ int8_t quantize_q8(float x, float inv) {
  return static_cast<int8_t>(static_cast<int>(fminf(127.0f, fmaxf(-127.0f, rintf(__fmul_rn(x, inv))))));
}

// centred_q8[h, i, :] = the f32 key - mean quantized per row: kPerRow = D / 8 lanes per row (8 elements
// each), 32 / kPerRow rows per warp, warp-uniform trip counts. Grid (x, heads): blockIdx.y is the head and
// rows are 32-bit within it, so no row costs a 64-bit division or modulo.
template <int D>
__global__ void centre_q8_kernel(const KMeansKernelParams p) {
  constexpr int kPerRow = D / 8, kRowsPerWarp = 32 / kPerRow;
  const int lane = threadIdx.x & 31, col = lane % kPerRow;
  const int h = blockIdx.y;
  const int rows = static_cast<int>(p.n_idx);
  const int warps = gridDim.x * (blockDim.x >> 5);
  const uint16_t* kh = p.keys + (int64_t{h} * p.kv_stride + p.idx_begin) * D + col * 8;
  int8_t* qh = p.centred_q8 + int64_t{h} * p.n_idx * D + col * 8;
  float mu[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) mu[j] = p.mean[h * D + col * 8 + j];
  for (int r0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * kRowsPerWarp; r0 < rows;
       r0 += warps * kRowsPerWarp) {
    const int i = r0 + lane / kPerRow;
    const bool ok = i < rows;
    float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (ok) {
      bf16x8_to_float(*reinterpret_cast<const uint4*>(kh + int64_t{i} * D), f);
#pragma unroll
      for (int j = 0; j < 8; ++j) f[j] -= mu[j];
    }
    float mx = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) mx = fmaxf(mx, fabsf(f[j]));
#pragma unroll
    for (int o = 1; o < kPerRow; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (!ok) continue;  // no shuffle follows in this trip
    const float inv = q8_inv(mx);
    uint32_t w[2] = {0u, 0u};
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j / 4] |= uint32_t{static_cast<uint8_t>(quantize_q8(f[j], inv))} << (8 * (j % 4));
    *reinterpret_cast<uint2*>(qh + int64_t{i} * D) = make_uint2(w[0], w[1]);
  }
}

// Writes centroid (f32, bf16, and the int8 copy with its scale) of flat cluster hc from per-lane values (lane
// owns dims lane + 32 j). The whole warp calls it.
__device__ __forceinline__ void store_centroid(const KMeansKernelParams& p, int64_t hc, const float* c, int lane) {
  float mx = 0.0f;
  for (int j = 0; lane + 32 * j < p.head_dim; ++j) {
    p.centroids[hc * p.head_dim + lane + 32 * j] = c[j];
    p.centroids_bf16[hc * p.head_dim + lane + 32 * j] = f32_to_bf16(c[j]);
    mx = fmaxf(mx, fabsf(c[j]));
  }
  mx = warp_max(mx);
  const float inv = q8_inv(mx);
  for (int j = 0; lane + 32 * j < p.head_dim; ++j)
    p.centroids_q8[hc * p.head_dim + lane + 32 * j] = quantize_q8(c[j], inv);
  if (lane == 0) p.centroid_scale[hc] = __fdiv_rn(mx, 127.0f);
}

// Initial centroids: the centred key at index floor(j * L / k) of the segment, L2-normalised (a zero
// key stays zero). One warp per flat cluster; grid (cluster blocks, heads). The segment cluster table is
// staged in shared memory (up to kInitSegs + 1 entries, else read from global memory) and binary-searched
// (a linear walk would be one dependent global load per segment before the cluster's).
constexpr int kInitSegs = 1023;
__global__ void init_kernel(const KMeansKernelParams p) {
  __shared__ int seg_c[kInitSegs + 1];
  const bool staged = p.num_segments <= kInitSegs;
  if (staged)
    for (int i = threadIdx.x; i <= p.num_segments; i += blockDim.x) seg_c[i] = p.seg_cluster_begin[i];
  __syncthreads();
  const int* sc = staged ? seg_c : p.seg_cluster_begin;
  const int lane = threadIdx.x & 31;
  const int h = blockIdx.y;
  const int c = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
  if (c >= p.num_clusters) return;
  const int64_t hc = int64_t{h} * p.num_clusters + c;
  int lo = 0, hi = p.num_segments - 1;  // the segment s with sc[s] <= c < sc[s + 1]
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (sc[mid] <= c) lo = mid;
    else hi = mid - 1;
  }
  const int s = lo;
  const int64_t L = p.seg_token_begin[s + 1] - p.seg_token_begin[s];
  const int64_t k = sc[s + 1] - sc[s];
  const int64_t j = c - sc[s];
  const int64_t src = p.seg_token_begin[s] + j * L / k;
  const int D = p.head_dim;
  float v[4], ss = 0.0f;
  for (int jj = 0; lane + 32 * jj < D; ++jj) {
    const int d = lane + 32 * jj;
    v[jj] = bf16_to_f32(p.keys[(h * p.kv_stride + p.idx_begin + src) * D + d]) - p.mean[int64_t{h} * D + d];
    ss += v[jj] * v[jj];
  }
  ss = warp_sum(ss);
  const float inv = ss > 0.0f ? 1.0f / sqrtf(ss) : 0.0f;
  for (int jj = 0; lane + 32 * jj < D; ++jj) v[jj] *= inv;
  store_centroid(p, hc, v, lane);
}

// The new centroid of flat cluster hc from its n members' sum (lane owns dims lane + 32 j; whole warp):
// spherical = normalised sum of centred members, else plain mean; an empty cluster (or a zero sum,
// spherical) keeps its previous centroid.
template <int D>
__device__ __forceinline__ void update_centroid(const KMeansKernelParams& p, int64_t hc, int n, float* s, bool spherical,
                                                int lane) {
  constexpr int kJ = D / 32;
  if (n == 0) return;
  if (spherical) {
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kJ; ++j) ss += s[j] * s[j];
    ss = warp_sum(ss);
    if (!(ss > 0.0f)) return;
    const float inv = 1.0f / sqrtf(ss);
#pragma unroll
    for (int j = 0; j < kJ; ++j) s[j] *= inv;
  } else {
    const float inv = 1.0f / static_cast<float>(n);
#pragma unroll
    for (int j = 0; j < kJ; ++j) s[j] *= inv;
  }
  store_centroid(p, hc, s, lane);
}

// ---- Update and finalize: kLanes = D / 8 lanes per flat cluster (32 / kLanes clusters per warp), each
// lane owning 8 consecutive dims read with one 16-byte load per member row. Per dim the sum is one chain of
// f32 operations (s += x - shift, ascending member order); the spherical norm is reduced after handing the
// sums over (through shared memory) to update_centroid's layout of one warp per cluster, lane owning dims
// lane + 32 j, whose warp_sum fixes the order of the adds.
template <int D>
struct ClusterLanes {
  static constexpr int kLanes = D / 8;               // lanes per cluster
  static constexpr int kGroups = 32 / kLanes;        // clusters per warp
  static_assert(32 % kLanes == 0 && kLanes >= 8, "D = 64 or 128");
};

// Sum over the n members (CSR entries [b, b + n)) of (row - shift) for the lane's dims 8 sub .. 8 sub + 7
// of rows from `base` ([n_idx, D] bf16, member i at row i); shift ([D] f32) may be null. The whole warp
// calls it (n may differ per group: the trip count is the warp's largest n, rows past n are skipped).
template <int D>
__device__ __forceinline__ void member_sum(const KMeansKernelParams& p, int b, int n, const uint16_t* base,
                                                const float* shift, float (&s)[8], int sub) {
  using L = ClusterLanes<D>;
  int nmax = n;
#pragma unroll
  for (int o = L::kLanes; o < 32; o <<= 1) nmax = max(nmax, __shfl_xor_sync(0xffffffffu, nmax, o));
  float sh[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    s[j] = 0.0f;
    sh[j] = shift ? shift[8 * sub + j] : 0.0f;
  }
  for (int i0 = 0; i0 < nmax; i0 += L::kLanes) {
    // The group's lanes fetch kLanes member ids at once, load those kLanes rows (all in flight), then sum
    // them in ascending member order. Trip counts are warp-uniform (nmax); rows past n are neither
    // loaded nor added.
    const uint32_t mine = i0 + sub < n ? p.members[b + i0 + sub] : 0u;
    uint4 x[L::kLanes];
#pragma unroll
    for (int t = 0; t < L::kLanes; ++t) {
      const int64_t row = __shfl_sync(0xffffffffu, mine, t, L::kLanes);
      x[t] = i0 + t < n ? __ldg(reinterpret_cast<const uint4*>(base + row * D + 8 * sub)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int t = 0; t < L::kLanes; ++t) {
      if (i0 + t < n) {
        float f[8];
        bf16x8_to_float(x[t], f);
#pragma unroll
        for (int j = 0; j < 8; ++j) s[j] += f[j] - sh[j];
      }
    }
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads) update_kernel(const KMeansKernelParams p, bool spherical) {
  using L = ClusterLanes<D>;
  __shared__ float red[kThreads / 32][L::kGroups][D];  // hand-over to update_centroid's layout: 8 KiB
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, sub = lane % L::kLanes, grp = lane / L::kLanes;
  const int64_t total = int64_t{p.num_heads} * p.num_clusters;
  const int64_t hc0 = (blockIdx.x * int64_t{kThreads / 32} + warp) * L::kGroups;  // the warp's first cluster
  if (hc0 >= total) return;  // whole warp
  const int64_t hc = hc0 + grp;
  int b = 0, n = 0;
  const uint16_t* base = p.keys;
  const float* shift = nullptr;
  if (hc < total) {
    const int64_t h = hc / p.num_clusters;
    b = p.offsets[hc];
    n = p.offsets[hc + 1] - b;
    base = p.keys + (h * p.kv_stride + p.idx_begin) * D;
    shift = p.mean + h * D;
  }
  float s[8];
  member_sum<D>(p, b, n, base, shift, s, sub);
#pragma unroll
  for (int j = 0; j < 8; ++j) red[warp][grp][8 * sub + j] = s[j];
  __syncwarp();
  constexpr int kJ = D / 32;
#pragma unroll 1
  for (int g = 0; g < L::kGroups && hc0 + g < total; ++g) {  // warp-uniform
    const int ng = __shfl_sync(0xffffffffu, n, g * L::kLanes);
    float so[kJ];
#pragma unroll
    for (int j = 0; j < kJ; ++j) so[j] = red[warp][g][lane + 32 * j];
    update_centroid<D>(p, hc0 + g, ng, so, spherical, lane);
  }
}

// Final outputs of each flat cluster: sizes, value sums, de-centred centroids and bf16 copies. kMean: the
// last global iteration's plain-mean update first, from the same member sums of the centred keys as
// update_kernel times the same 1 / n, so the centroid is the one update + finalize would write, bit for bit
// (an empty cluster keeps its centroid); one pass over the members instead of two.
template <int D, bool kMean>
__global__ void __launch_bounds__(kThreads) finalize_kernel(const KMeansKernelParams p) {
  using L = ClusterLanes<D>;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, sub = lane % L::kLanes, grp = lane / L::kLanes;
  const int64_t total = int64_t{p.num_heads} * p.num_clusters;
  const int64_t hc0 = (blockIdx.x * int64_t{kThreads / 32} + warp) * L::kGroups;
  if (hc0 >= total) return;  // whole warp
  const int64_t hc = hc0 + grp;
  const bool valid = hc < total;
  const int64_t h = valid ? hc / p.num_clusters : 0;
  int b = 0, n = 0;
  if (valid) {
    b = p.offsets[hc];
    n = p.offsets[hc + 1] - b;
  }
  float sk[8];
  if constexpr (kMean) member_sum<D>(p, b, n, p.keys + (h * p.kv_stride + p.idx_begin) * D, p.mean + h * D, sk, sub);
  float s[8];
  member_sum<D>(p, b, n, p.values + (h * p.kv_stride + p.idx_begin) * D, nullptr, s, sub);
  if (!valid) return;
  const int64_t at = hc * D + 8 * sub;
  float c[8];
  uint32_t vb[4], cw[4];
  if (kMean && n > 0) {
    const float inv = 1.0f / static_cast<float>(n);  // update_centroid's plain mean
#pragma unroll
    for (int j = 0; j < 8; ++j) c[j] = __fadd_rn(__fmul_rn(sk[j], inv), p.mean[h * D + 8 * sub + j]);  // no FMA
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) c[j] = p.centroids[at + j] + p.mean[h * D + 8 * sub + j];
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    vb[j] = uint32_t{f32_to_bf16(s[2 * j])} | (uint32_t{f32_to_bf16(s[2 * j + 1])} << 16);
    cw[j] = uint32_t{f32_to_bf16(c[2 * j])} | (uint32_t{f32_to_bf16(c[2 * j + 1])} << 16);
  }
  reinterpret_cast<float4*>(p.value_sums + at)[0] = make_float4(s[0], s[1], s[2], s[3]);
  reinterpret_cast<float4*>(p.value_sums + at)[1] = make_float4(s[4], s[5], s[6], s[7]);
  reinterpret_cast<float4*>(p.centroids + at)[0] = make_float4(c[0], c[1], c[2], c[3]);
  reinterpret_cast<float4*>(p.centroids + at)[1] = make_float4(c[4], c[5], c[6], c[7]);
  *reinterpret_cast<uint4*>(p.value_sums_bf16 + at) = make_uint4(vb[0], vb[1], vb[2], vb[3]);
  *reinterpret_cast<uint4*>(p.centroids_bf16 + at) = make_uint4(cw[0], cw[1], cw[2], cw[3]);
  if (sub == 0) p.sizes[hc] = n;
}

int cluster_blocks(int64_t clusters, int per_warp) {
  const int64_t per_cta = int64_t{kThreads / 32} * per_warp;
  return static_cast<int>((clusters + per_cta - 1) / per_cta);
}

int warp_blocks(int64_t warps) { return static_cast<int>((warps * 32 + kThreads - 1) / kThreads); }

bool has_q8_centroids(const KMeansKernelParams& p) { return p.centroids_q8 != nullptr && p.centroid_scale != nullptr; }
bool head_dim_ok(const KMeansKernelParams& p) { return p.head_dim == 128 || p.head_dim == 64; }

}  // namespace

cudaError_t kmeans_mean(const KMeansKernelParams& p, cudaStream_t s) {
  if (!head_dim_ok(p) || p.centred_q8 == nullptr) return cudaErrorInvalidValue;
  const dim3 grid(kMeanChunks, p.num_heads);
  if (p.head_dim == 128) mean_partial_kernel<128><<<grid, kThreads, 0, s>>>(p);
  else mean_partial_kernel<64><<<grid, kThreads, 0, s>>>(p);
  mean_finish_kernel<<<p.num_heads, 128, 0, s>>>(p);
  // Per head: one row per kPerRow lanes, up to 8192 / heads CTAs per head (at least one).
  const int64_t per_head = p.n_idx * (p.head_dim / 8) / kThreads + 1;
  const dim3 q8_grid(static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(per_head, 8192 / p.num_heads))),
                     p.num_heads);
  if (p.head_dim == 128) centre_q8_kernel<128><<<q8_grid, kThreads, 0, s>>>(p);
  else centre_q8_kernel<64><<<q8_grid, kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

cudaError_t kmeans_init(const KMeansKernelParams& p, cudaStream_t s) {
  if (!head_dim_ok(p) || !has_q8_centroids(p)) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(warp_blocks(p.num_clusters)), p.num_heads);
  init_kernel<<<grid, kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

namespace {
// top_sizes_sum: one 1024-thread CTA per head. Radix-select by histogram: each pass bins the sizes of the
// current value range [lo, hi] into 4096 bins of width 2^shift, walks the bins from the top until k sizes
// are reached, adds every size above the threshold bin exactly (a block sum), and narrows the range to
// that bin; the pass with width 1 adds the threshold value times the sizes still wanted. Sizes >= 0.
constexpr int kTopBins = 4096, kTopThreads = 1024;
__device__ long long block_sum_ll(long long v, long long* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  long long t = 0;
  for (int w = 0; w < kTopThreads / 32; ++w) t += red[w];
  return t;
}
__global__ void __launch_bounds__(kTopThreads) top_sizes_sum_kernel(const int* sizes, int C, int k, long long* out) {
  __shared__ int hist[kTopBins];
  __shared__ long long red[kTopThreads / 32];
  __shared__ int s_tb, s_need;
  const int* sz = sizes + int64_t{blockIdx.x} * C;
  int mx = 0;
  for (int i = threadIdx.x; i < C; i += kTopThreads) mx = max(mx, sz[i]);
  for (int o = 16; o > 0; o >>= 1) mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = mx;
  __syncthreads();
  int hi = 0;
  for (int w = 0; w < kTopThreads / 32; ++w) hi = max(hi, static_cast<int>(red[w]));
  int lo = 0, need = k;
  long long acc = 0;
  while (need > 0) {
    int shift = 0;
    while (((hi - lo) >> shift) >= kTopBins) ++shift;
    __syncthreads();
    for (int b = threadIdx.x; b < kTopBins; b += kTopThreads) hist[b] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < C; i += kTopThreads) {
      const int v = sz[i];
      if (v >= lo && v <= hi) atomicAdd(&hist[(v - lo) >> shift], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int b = (hi - lo) >> shift, left = need;
      while (b >= 0 && hist[b] < left) left -= hist[b--];
      s_tb = b;       // -1: every size in range is wanted
      s_need = left;  // wanted from bin b
    }
    __syncthreads();
    const int tb = s_tb, left = s_need;
    long long part = 0;
    for (int i = threadIdx.x; i < C; i += kTopThreads) {
      const int v = sz[i];
      if (v >= lo && v <= hi && (tb < 0 || ((v - lo) >> shift) > tb)) part += v;
    }
    acc += block_sum_ll(part, red);
    if (tb < 0) break;
    if (shift == 0) {
      acc += static_cast<long long>(left) * (lo + tb);
      break;
    }
    const int nlo = lo + (tb << shift);
    hi = min(hi, nlo + (1 << shift) - 1);
    lo = nlo;
    need = left;
  }
  if (threadIdx.x == 0) out[blockIdx.x] = acc;
}
}  // namespace

cudaError_t top_sizes_sum(const int* sizes, int heads, int clusters, int k, long long* out, cudaStream_t s) {
  if (heads <= 0 || clusters <= 0 || k <= 0 || k > clusters) return cudaErrorInvalidValue;
  top_sizes_sum_kernel<<<heads, kTopThreads, 0, s>>>(sizes, clusters, k, out);
  return cudaGetLastError();
}

cudaError_t kmeans_update(const KMeansKernelParams& p, bool spherical, cudaStream_t s) {
  if (!has_q8_centroids(p)) return cudaErrorInvalidValue;
  const int64_t total = int64_t{p.num_heads} * p.num_clusters;
  if (p.head_dim == 128)
    update_kernel<128><<<cluster_blocks(total, ClusterLanes<128>::kGroups), kThreads, 0, s>>>(p, spherical);
  else if (p.head_dim == 64)
    update_kernel<64><<<cluster_blocks(total, ClusterLanes<64>::kGroups), kThreads, 0, s>>>(p, spherical);
  else
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t kmeans_finalize(const KMeansKernelParams& p, cudaStream_t s, bool with_mean) {
  const int64_t total = int64_t{p.num_heads} * p.num_clusters;
  auto launch = [&](auto kernel, int groups) {
    kernel<<<cluster_blocks(total, groups), kThreads, 0, s>>>(p);
    return cudaGetLastError();
  };
  if (p.head_dim == 128)
    return with_mean ? launch(finalize_kernel<128, true>, ClusterLanes<128>::kGroups)
                     : launch(finalize_kernel<128, false>, ClusterLanes<128>::kGroups);
  if (p.head_dim == 64)
    return with_mean ? launch(finalize_kernel<64, true>, ClusterLanes<64>::kGroups)
                     : launch(finalize_kernel<64, false>, ClusterLanes<64>::kGroups);
  return cudaErrorInvalidValue;
}

}  // namespace retroinfer::cuda::detail
