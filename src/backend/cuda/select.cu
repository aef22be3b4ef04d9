// Cluster scoring and zone selection (DESIGN.md §2 "Scoring"), also used for quest's page selection.
//
// score_kernel: logits[h, g, c] = scale * q_g . c_c from the bf16 centroids (D/8 lanes per centroid,
// one 16-byte load each, the GQA group's queries in registers); -inf for empty clusters.
// select_kernel: one CTA per flat head. Scores (sum over the group of the per-head softmax over the
// non-empty clusters), then an exact radix select (4 passes of 8 bits over the order-preserving integer
// image of the float scores) of the k-th best score for k = k_retrieval and k = k_retrieval +
// k_estimation; ties at the threshold are taken in ascending id order, so the selection equals "sort by
// (score desc, id asc) and cut", the CPU reference's rule. The ids are written in ascending order, and the
// retrieval items are expanded into the head's exact-token list (steady zone first).
#include <cuda_runtime.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace retroinfer::cuda::detail {
namespace {

// Online (max, sum of exp) pair merge for the per-head softmax normaliser.
__device__ __forceinline__ void ms_merge(float& m, float& s, float m2, float s2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) { m = m2; s = s2; return; }
  const float mx = fmaxf(m, m2);
  s = s * __expf(m - mx) + s2 * __expf(m2 - mx);
  m = mx;
}

constexpr int kScoreWarps = 8;
constexpr int kScoreBatch = 4;  // passes whose loads are issued together

template <int D>
__global__ void __launch_bounds__(kScoreWarps * 32) score_kernel(const ScoreParams p) {
  constexpr int kLpc = D / 8;        // lanes per centroid
  constexpr int kCpp = 32 / kLpc;    // centroids per warp pass
  const int h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, G = p.group;
  const int sub = lane % kLpc, slot = lane / kLpc;
  float qr[kMaxGroup][8];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
#pragma unroll
    for (int j = 0; j < 8; ++j) qr[g][j] = g < G ? p.q[(int64_t{h} * G + g) * D + sub * 8 + j] * p.scale : 0.0f;
  const uint16_t* ch = p.centroids_bf16 + int64_t{h} * p.num_clusters * D;
  const int* sz = p.sizes + int64_t{h} * p.num_clusters;
  float nm[kMaxGroup], ns[kMaxGroup];  // online (max, sum) of this lane's logits per query head
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    nm[g] = -INFINITY;
    ns[g] = 0.0f;
  }
  const int stride = gridDim.x * kScoreWarps;
  for (int pass0 = blockIdx.x * kScoreWarps + warp; pass0 * kCpp < p.num_clusters; pass0 += stride * kScoreBatch) {
    uint4 w[kScoreBatch];
    int c[kScoreBatch];
#pragma unroll
    for (int b = 0; b < kScoreBatch; ++b) {
      c[b] = (pass0 + b * stride) * kCpp + slot;
      w[b] = c[b] < p.num_clusters ? __ldg(reinterpret_cast<const uint4*>(ch + int64_t{c[b]} * D + sub * 8))
                                   : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int b = 0; b < kScoreBatch; ++b) {
      float kf[8];
      bf16x8_to_float(w[b], kf);
      const bool empty = c[b] < p.num_clusters ? sz[c[b]] == 0 : true;
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g < G) {
          float acc = 0.0f;
#pragma unroll
          for (int j = 0; j < 8; ++j) acc += qr[g][j] * kf[j];
#pragma unroll
          for (int off = kLpc / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
          if (sub == 0 && c[b] < p.num_clusters) {
            p.logits[(int64_t{h} * G + g) * p.num_clusters + c[b]] = empty ? -INFINITY : acc;
            if (!empty) ms_merge(nm[g], ns[g], acc, 1.0f);
          }
        }
      }
    }
  }
  // CTA normaliser per query head: warp shuffles, then warp 0 over the warps.
  __shared__ float2 red[kScoreWarps][kMaxGroup];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, nm[g], off), s2 = __shfl_xor_sync(0xffffffffu, ns[g], off);
      ms_merge(nm[g], ns[g], m2, s2);
    }
    if (lane == 0) red[warp][g] = make_float2(nm[g], ns[g]);
  }
  __syncthreads();
  if (threadIdx.x < G) {
    float m = -INFINITY, sum = 0.0f;
    for (int w = 0; w < kScoreWarps; ++w) ms_merge(m, sum, red[w][threadIdx.x].x, red[w][threadIdx.x].y);
    p.norm_partial[(int64_t{h} * G + threadIdx.x) * gridDim.x + blockIdx.x] = make_float2(m, sum);
  }
}

constexpr int kSelThreads = 1024;
constexpr int kSelWarps = kSelThreads / 32;

struct SelectSmem {
  int warp_sums[kSelWarps + 1];
  unsigned hist[256];
  int found_digit;
  int found_rem;
};

// Exclusive scan over the block; *total receives the block sum.
__device__ int block_exclusive_scan(int v, SelectSmem& sm, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int incl = v;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += y;
  }
  if (lane == 31) sm.warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int x = sm.warp_sums[lane];
    int xi = x;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, xi, off);
      if (lane >= off) xi += y;
    }
    sm.warp_sums[lane] = xi - x;
    if (lane == 31) sm.warp_sums[kSelWarps] = xi;
  }
  __syncthreads();
  const int r = sm.warp_sums[warp] + incl - v;
  *total = sm.warp_sums[kSelWarps];
  __syncthreads();
  return r;
}

// The k-th largest order key among the finite scores (1 <= k <= finite count), and how many of the items
// equal to it belong to the top k.
__device__ void radix_select(const float* sc, int n, int k, SelectSmem& sm, uint32_t* thr, int* take) {
  uint32_t prefix = 0, mask = 0;
  int rem = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) sm.hist[i] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const float f = sc[i];
      if (f == -INFINITY) continue;
      const uint32_t u = float_order_key(f);
      if ((u & mask) == prefix) atomicAdd(&sm.hist[(u >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane l owns digits 255-8l .. 248-8l (descending); find the digit where the count from the top
      // reaches rem.
      const int lane = threadIdx.x;
      int local = 0;
      for (int j = 0; j < 8; ++j) local += static_cast<int>(sm.hist[255 - 8 * lane - j]);
      int incl = local;
      for (int off = 1; off < 32; off <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += y;
      }
      const int excl = incl - local;
      if (excl < rem && rem <= incl) {
        int cum = excl;
        for (int j = 0; j < 8; ++j) {
          const int d = 255 - 8 * lane - j;
          const int hcount = static_cast<int>(sm.hist[d]);
          if (cum + hcount >= rem) {
            sm.found_digit = d;
            sm.found_rem = rem - cum;
            break;
          }
          cum += hcount;
        }
      }
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(sm.found_digit) << shift;
    mask |= 255u << shift;
    rem = sm.found_rem;
    __syncthreads();
  }
  *thr = prefix;
  *take = rem;
}

__global__ void __launch_bounds__(kSelThreads) select_kernel(const SelectParams p, bool scores_in_smem) {
  __shared__ SelectSmem sm;
  extern __shared__ float smem_scores[];
  const int h = blockIdx.x, N = p.num_items, G = p.group;
  float* gsc = p.scores + int64_t{h} * N;
  // The radix passes and the compaction read the scores up to 11 times: from shared memory when they fit.
  float* sc = scores_in_smem ? smem_scores : gsc;
  if (G > 0) {
    // Scores from logits: sum over the group of softmax over the non-empty items. Warp g merges the
    // normaliser partials of query head g; one pass over the logits then forms the scores.
    __shared__ float gmax[kMaxGroup], ginv[kMaxGroup];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp < G) {
      const float2* part = p.norm_partial + (int64_t{h} * G + warp) * p.norm_parts;
      float m = -INFINITY, s = 0.0f;
#pragma unroll 4
      for (int i = lane; i < p.norm_parts; i += 32) ms_merge(m, s, part[i].x, part[i].y);
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, off), s2 = __shfl_xor_sync(0xffffffffu, s, off);
        ms_merge(m, s, m2, s2);
      }
      if (lane == 0) {
        gmax[warp] = m;
        ginv[warp] = s > 0.0f ? 1.0f / s : 0.0f;
      }
    }
    __syncthreads();
    const float* lgh = p.logits + int64_t{h} * G * N;
    for (int i0 = threadIdx.x; i0 < N; i0 += 4 * blockDim.x) {
      float lv[4][kMaxGroup];  // the loads of 4 items are issued together
#pragma unroll
      for (int b = 0; b < 4; ++b)
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) {
          const int i = i0 + b * blockDim.x;
          lv[b][g] = g < G && i < N ? __ldg(lgh + int64_t{g} * N + i) : 0.0f;
        }
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int i = i0 + b * blockDim.x;
        if (i >= N) break;
        float s = 0.0f;
        bool empty = false;
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g)
          if (g < G) {
            if (lv[b][g] == -INFINITY) empty = true;
            else s += __expf(lv[b][g] - gmax[g]) * ginv[g];
          }
        s = empty ? -INFINITY : s;
        gsc[i] = s;
        if (scores_in_smem) sc[i] = s;
      }
    }
    __syncthreads();
  } else if (scores_in_smem) {
    for (int i = threadIdx.x; i < N; i += blockDim.x) sc[i] = gsc[i];
    __syncthreads();
  }
  int finite = 0;
  for (int i = threadIdx.x; i < N; i += blockDim.x) finite += sc[i] != -INFINITY;
  int total_finite;
  block_exclusive_scan(finite, sm, &total_finite);
  const int k1 = p.k_retrieval < total_finite ? p.k_retrieval : total_finite;
  const int k2 = p.k_retrieval + p.k_estimation < total_finite ? p.k_retrieval + p.k_estimation : total_finite;
  uint32_t t1 = 0, t2 = 0;
  int take1 = 0, take2 = 0;
  if (k1 > 0) radix_select(sc, N, k1, sm, &t1, &take1);
  if (k2 > k1) radix_select(sc, N, k2, sm, &t2, &take2);
  else { t2 = t1; take2 = take1; }

  // Ascending-id compaction. An item is in the top k when its key beats the threshold or ties it with
  // fewer than `take` lower-id ties before it.
  int* ret = p.retrieval_ids + int64_t{h} * p.k_retrieval;
  int* est = p.k_estimation > 0 ? p.estimation_ids + int64_t{h} * p.k_estimation : nullptr;
  int ties1 = 0, ties2 = 0, out1 = 0, out2 = 0;
  for (int base = 0; base < N; base += blockDim.x) {
    const int i = base + threadIdx.x;
    const bool valid = i < N && sc[i] != -INFINITY;
    const uint32_t u = valid ? float_order_key(sc[i]) : 0u;
    const bool eq1 = valid && k1 > 0 && u == t1, eq2 = valid && k2 > 0 && u == t2;
    int tot;
    const int eq_pre = block_exclusive_scan((eq1 ? 1 : 0) | (eq2 ? 1 << 16 : 0), sm, &tot);
    const bool in1 = valid && k1 > 0 && (u > t1 || (eq1 && ties1 + (eq_pre & 0xffff) < take1));
    const bool in2 = valid && k2 > 0 && (u > t2 || (eq2 && ties2 + (eq_pre >> 16) < take2));
    ties1 += tot & 0xffff;
    ties2 += tot >> 16;
    const bool ine = in2 && !in1;
    int tot2;
    const int pos = block_exclusive_scan((in1 ? 1 : 0) | (ine ? 1 << 16 : 0), sm, &tot2);
    if (in1) ret[out1 + (pos & 0xffff)] = i;
    if (ine) est[out2 + (pos >> 16)] = i;
    out1 += tot2 & 0xffff;
    out2 += tot2 >> 16;
  }
  for (int i = out1 + threadIdx.x; i < p.k_retrieval; i += blockDim.x) ret[i] = -1;
  for (int i = out2 + threadIdx.x; i < p.k_estimation; i += blockDim.x) est[i] = -1;
  __syncthreads();

  // Expansion: steady tokens, then the retrieval items' tokens in id order.
  const int64_t w_begin = p.idx_begin + p.n_idx;
  const int steady = static_cast<int>(p.idx_begin + (p.num_tokens - w_begin));
  int* list = p.token_list + int64_t{h} * p.list_stride;
  for (int i = threadIdx.x; i < steady; i += blockDim.x)
    list[i] = static_cast<int>(i < p.idx_begin ? i : w_begin + (i - p.idx_begin));
  int* pre = p.scan_scratch + int64_t{h} * (p.k_retrieval + 1);
  int running = steady;
  for (int base = 0; base < out1; base += blockDim.x) {
    const int i = base + threadIdx.x;
    int len = 0;
    if (i < out1) {
      const int c = ret[i];
      if (p.page_tokens > 0) {
        const int64_t b = int64_t{c} * p.page_tokens;
        len = static_cast<int>(b + p.page_tokens < p.n_idx ? p.page_tokens : p.n_idx - b);
      } else {
        const int64_t hc = int64_t{h} * N + c;
        len = p.offsets[hc + 1] - p.offsets[hc];
      }
    }
    int tot;
    const int ex = block_exclusive_scan(len, sm, &tot);
    if (i < out1) pre[i] = running + ex;
    running += tot;
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int i = warp; i < out1; i += kSelWarps) {
    const int c = ret[i], at = pre[i];
    if (p.page_tokens > 0) {
      const int64_t b = int64_t{c} * p.page_tokens;
      const int len = static_cast<int>(b + p.page_tokens < p.n_idx ? p.page_tokens : p.n_idx - b);
      for (int t = lane; t < len; t += 32) list[at + t] = static_cast<int>(p.idx_begin + b + t);
    } else {
      const int64_t hc = int64_t{h} * N + c;
      const int b = p.offsets[hc], e = p.offsets[hc + 1];
      for (int t = b + lane; t < e; t += 32) list[at + (t - b)] = static_cast<int>(p.idx_begin + p.members[t]);
    }
  }
  if (threadIdx.x == 0) p.token_count[h] = running;
}

}  // namespace

int score_blocks(int num_clusters, int head_dim) {
  // 2 batches of kScoreBatch passes per warp: enough CTAs to fill the chip at batch 1, few enough to
  // amortise loading the queries.
  const int cpp = 32 / (head_dim / 8);
  const int64_t passes = (int64_t{num_clusters} + cpp - 1) / cpp;
  const int blocks_x = static_cast<int>((passes + kScoreWarps * kScoreBatch * 2 - 1) / (kScoreWarps * kScoreBatch * 2));
  return blocks_x > 0 ? blocks_x : 1;
}

cudaError_t score_clusters(const ScoreParams& p, cudaStream_t s) {
  const dim3 grid(score_blocks(p.num_clusters, p.head_dim), p.num_heads);
  if (p.head_dim == 128) score_kernel<128><<<grid, kScoreWarps * 32, 0, s>>>(p);
  else if (p.head_dim == 64) score_kernel<64><<<grid, kScoreWarps * 32, 0, s>>>(p);
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t select_and_expand(const SelectParams& p, cudaStream_t s) {
  // Scores in shared memory up to 40K items (160 KiB; the static part is ~1.5 KiB of the 227 KiB).
  constexpr size_t kMaxSmemScores = 160 * 1024;
  const size_t bytes = size_t(p.num_items) * 4;
  const bool in_smem = bytes <= kMaxSmemScores;
  static bool attr_set = false;
  if (!attr_set) {
    const cudaError_t e = cudaFuncSetAttribute(select_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(kMaxSmemScores));
    if (e != cudaSuccess) return e;
    attr_set = true;
  }
  select_kernel<<<p.num_heads, kSelThreads, in_smem ? bytes : 0, s>>>(p, in_smem);
  return cudaGetLastError();
}

}  // namespace retroinfer::cuda::detail
