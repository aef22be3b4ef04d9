// Shared pieces of the zone selection kernels (select_bins.cu, select_cluster.cu, select_grid.cu) and of the
// score formations (select_bins.cu, select_cluster.cu, select_scores.cu form_scores_kernel, score_common.cuh
// form_own_scores): the per-head softmax normaliser merge, the logit loads and the score of an item, the block
// scan, and the exact radix select of both thresholds (3 passes of 11-bit digits).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/kernels.h"

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

// Query head g's softmax normaliser (M_g, 1 / L_g) from its parts partial (max, sum of exp) pairs
// part[0 .. parts), merged by one warp (all lanes call): lane-strided ms_merge in index order, then the xor
// tree; lane 0 writes gmax[g] = M_g and ginv[g] = 1 / L_g (0 when L_g = 0). Every score formation calls
// this one function, so all get the same (M_g, 1 / L_g) bit for bit. The partials are read through L2
// (__ldcg): the score grid's own formation reads them after its grid barrier, written by other CTAs of the
// same kernel (never the non-coherent path).
// The xor tree and lane 0's writes of merge_head_normaliser (the lanes' merged (m, s)).
__device__ __forceinline__ void merge_head_normaliser_tree(float m, float s, int g, float* gmax, float* ginv) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, off), s2 = __shfl_xor_sync(0xffffffffu, s, off);
    ms_merge(m, s, m2, s2);
  }
  if ((threadIdx.x & 31) == 0) {
    gmax[g] = m;
    ginv[g] = s > 0.0f ? 1.0f / s : 0.0f;
  }
}
__device__ __forceinline__ void merge_head_normaliser(const float2* part, int parts, int g, float* gmax, float* ginv) {
  const int lane = threadIdx.x & 31;
  float m = -INFINITY, s = 0.0f;
#pragma unroll 4
  for (int i = lane; i < parts; i += 32) {
    const float2 v = __ldcg(part + i);
    ms_merge(m, s, v.x, v.y);
  }
  merge_head_normaliser_tree(m, s, g, gmax, ginv);
}
// merge_head_normaliser with the lane's first partial (part[lane], when lane < parts) loaded by the caller, so
// that it can be issued ahead of other loads (the bins selection's formation issues it before its 128 KiB of
// logit loads, behind which it would wait ~1 us). The same ms_merge sequence, so the same bits.
__device__ __forceinline__ void merge_head_normaliser_first(const float2* part, int parts, float2 first, int g,
                                                            float* gmax, float* ginv) {
  const int lane = threadIdx.x & 31;
  float m = -INFINITY, s = 0.0f;
  if (lane < parts) ms_merge(m, s, first.x, first.y);
  for (int i = lane + 32; i < parts; i += 32) {
    const float2 v = __ldcg(part + i);
    ms_merge(m, s, v.x, v.y);
  }
  merge_head_normaliser_tree(m, s, g, gmax, ginv);
}

// The logits of kB items i0 + b * step (b < kB) of one head, lgh = [G, stride] row-major (query head g's
// logits at lgh + g * stride), all kB * G loads issued together; items >= end and heads >= G read 0
// (unused). kL2: through L2 (__ldcg; logits this grid wrote), else the read-only path (__ldg).
template <int kB, bool kL2>
__device__ __forceinline__ void load_logits(float (&lv)[kB][kMaxGroup], const float* lgh, int64_t stride, int G,
                                            int i0, int step, int end) {
#pragma unroll
  for (int b = 0; b < kB; ++b)
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      const int i = i0 + b * step;
      if (g < G && i < end) lv[b][g] = kL2 ? __ldcg(lgh + int64_t{g} * stride + i) : __ldg(lgh + int64_t{g} * stride + i);
      else lv[b][g] = 0.0f;
    }
}

// The selection score of one item from its logits lv[g] (g < G): the sum over the group, in order, of the
// per-head softmax e^{lv[g] - M_g} / L_g; -inf when any logit is -inf (an empty cluster). One expression
// for every formation: the scores are bit-identical whichever kernel forms them.
__device__ __forceinline__ float form_head_score(const float (&lv)[kMaxGroup], int G, const float* gmax,
                                                 const float* ginv) {
  float s = 0.0f;
  bool empty = false;
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
    if (g < G) {
      if (lv[g] == -INFINITY) empty = true;
      else s += __expf(lv[g] - gmax[g]) * ginv[g];
    }
  return empty ? -INFINITY : s;
}

// Diagnostics (kernels.h kPhaseSlots): %globaltimer in ns (common.cuh global_ns; comparable between
// kernels) and the multiprocessor's cycle counter (fine, within one CTA).
// Thread 0 of the selection CTA stamps phase boundary j of head h (call right after a barrier).
__device__ __forceinline__ void sel_stamp(uint64_t* phase, int h, int j) {
  if (phase != nullptr && threadIdx.x == 0) {
    uint64_t* ph = phase + int64_t{h} * kPhaseSlots;
    ph[2 + j] = global_ns();
    ph[2 + kSelPhases + j] = static_cast<uint64_t>(clock64());
  }
}

// A retrieval item's tokens: (begin, length) in the index (pages: item id covers index tokens
// [id * page_tokens, ...) up to n_idx; clusters: head h's CSR range of members), and with `prefetch` the
// cluster's members started on their way into L2 (the expansion reads them later).
struct ItemTokens {
  int begin = 0, length = 0;
};
__device__ __forceinline__ ItemTokens item_tokens(const SelectParams& p, int h, int id, bool prefetch) {
  ItemTokens r;
  if (p.page_tokens > 0) {
    const int64_t b64 = int64_t{id} * p.page_tokens;
    r.begin = static_cast<int>(b64);
    r.length = static_cast<int>(b64 + p.page_tokens < p.n_idx ? p.page_tokens : p.n_idx - b64);
  } else {
    const int64_t hc = int64_t{h} * p.num_items + id;
    r.begin = p.offsets[hc];
    r.length = p.offsets[hc + 1] - r.begin;
    if (prefetch)
      for (int o = 0; o < r.length; o += 32) prefetch_l2(p.members + r.begin + o);
  }
  return r;
}

constexpr int kSelThreads = 1024;  // threads of the one-CTA-per-head selection (select_bins.cu)
constexpr int kSelWarps = kSelThreads / 32;

// Shared memory of block_scan2 for a CTA of kWarps warps (<= 32).
template <int kWarps>
struct ScanSmem {
  int a[kWarps + 1], b[kWarps + 1];
};

// Inclusive scan of the pair (a, b) over the CTA of kWarps warps (all threads call); *ta, *tb receive the CTA
// sums.
template <int kWarps>
__device__ int2 block_scan2(int a, int b, ScanSmem<kWarps>& sm, int* ta, int* tb) {
  static_assert(kWarps >= 1 && kWarps <= 32, "one warp scans the warp sums");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int ia = a, ib = b;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int ya = __shfl_up_sync(0xffffffffu, ia, off), yb = __shfl_up_sync(0xffffffffu, ib, off);
    if (lane >= off) { ia += ya; ib += yb; }
  }
  if (lane == 31) { sm.a[warp] = ia; sm.b[warp] = ib; }
  __syncthreads();
  if (warp == 0) {
    const int x = lane < kWarps ? sm.a[lane] : 0, y = lane < kWarps ? sm.b[lane] : 0;
    int xi = x, yi = y;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int u = __shfl_up_sync(0xffffffffu, xi, off), v = __shfl_up_sync(0xffffffffu, yi, off);
      if (lane >= off) { xi += u; yi += v; }
    }
    if (lane < kWarps) { sm.a[lane] = xi - x; sm.b[lane] = yi - y; }
    if (lane == 31) { sm.a[kWarps] = xi; sm.b[kWarps] = yi; }
  }
  __syncthreads();
  const int2 r = make_int2(sm.a[warp] + ia, sm.b[warp] + ib);
  *ta = sm.a[kWarps];
  *tb = sm.b[kWarps];
  __syncthreads();
  return r;
}

constexpr int kRadixBins = 2048;  // 11-bit digits: 3 passes (bits 31..21, 20..10, 9..0)

// Shared memory of radix_select2 in a CTA of kThreads threads.
template <int kThreads>
struct RadixSmem {
  ScanSmem<kThreads / 32> scan;
  unsigned hist[2][kRadixBins];  // threshold 1, threshold 2 (16 KiB)
  int found_digit[2];
  int found_rem[2];
};
using SelectSmem = RadixSmem<kSelThreads>;

// The histograms of one radix pass as every thread then reads them, for a selection whose items are all in
// this CTA: the CTA's own (already complete after the barrier that follows their counting). The cluster
// selection (select_cluster.cu) passes one that adds every CTA's counts into one histogram first.
struct CtaHistograms {
  __device__ __forceinline__ const unsigned* operator()(const unsigned* local, int /*pass*/, int /*words*/) const {
    return local;
  }
};

// Both thresholds of "sort by (score desc, id asc) and cut at budget[0] and budget[1]" (budget[0] <= budget[1])
// in one sequence of 3 radix passes over the order keys of the finite scores sc[0, n) of this CTA: with k[j] =
// min(budget[j], finite items) (the first pass's histogram counts them), the k[j]-th largest key as thr[j] and
// how many of the items equal to it belong to the top k[j] as take[j]. All zero when k[1] == 0 (no item
// finite, or no budget at all); with k[0] == 0 < k[1] (no retrieval budget) the second threshold is searched
// alone, thr[0] = thr[1] and take[0] = 0, so the first cut takes nothing and the second its k[1] items. While
// the two prefixes agree one histogram serves both. Warp-aggregated histograms: the scores share their high
// bits, so plain atomics would serialise on one bin; lanes with the same digit add once through their leader.
// merge(local, pass, words) returns the histograms [2][kRadixBins] every thread reads after the CTA counted
// its items into `local` (its first `words` counters are in use): the CTA's own (CtaHistograms) or, where
// the items are spread over several CTAs, their sum (every CTA then finds the same digits).
template <int kThreads, typename Merge = CtaHistograms>
__device__ void radix_select2(const float* sc, int n, const int budget[2], RadixSmem<kThreads>& sm, int k[2],
                              uint32_t thr[2], int take[2], const Merge& merge = Merge()) {
  constexpr int kBinsPerThread = kRadixBins / kThreads;
  static_assert(kRadixBins % kThreads == 0, "each thread scans whole bins");
  uint32_t prefix[2] = {0u, 0u}, hi_mask = 0u;
  int rem[2] = {0, 0};
  k[0] = k[1] = 0;
  const int tid = threadIdx.x, lane = tid & 31;
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
    const uint32_t dmask = pass == 2 ? 1023u : 2047u;
    const bool same = prefix[0] == prefix[1];
    const int words = same ? kRadixBins : 2 * kRadixBins;
    for (int i = tid; i < words; i += blockDim.x) (&sm.hist[0][0])[i] = 0u;
    __syncthreads();
    for (int i0 = 0; i0 < n; i0 += blockDim.x) {
      const int i = i0 + tid;
      uint32_t u = 0u;
      bool ok = false;
      if (i < n) {
        const float f = sc[i];
        ok = f != -INFINITY;
        u = ok ? float_order_key(f) : 0u;
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        if (j == 1 && same) break;
        const unsigned key = ok && (u & hi_mask) == prefix[j] ? (u >> shift) & dmask : unsigned{kRadixBins};
        if (__any_sync(0xffffffffu, key < kRadixBins)) {
          const unsigned peers = __match_any_sync(0xffffffffu, key);
          if (key < kRadixBins && lane == __ffs(peers) - 1) atomicAdd(&sm.hist[j][key], __popc(peers));
        }
      }
    }
    __syncthreads();
    const unsigned* h0 = merge(&sm.hist[0][0], pass, words);
    const unsigned* h1 = same ? h0 : h0 + kRadixBins;
    // Thread t owns bins kRadixBins-1-kBinsPerThread t .. (descending).
    unsigned ca[kBinsPerThread], cb[kBinsPerThread];
    int a = 0, b = 0;
#pragma unroll
    for (int jj = 0; jj < kBinsPerThread; ++jj) {
      const int d = kRadixBins - 1 - kBinsPerThread * tid - jj;
      ca[jj] = h0[d];
      cb[jj] = h1[d];
      a += static_cast<int>(ca[jj]);
      b += static_cast<int>(cb[jj]);
    }
    int ta, tb;
    const int2 inc = block_scan2(a, b, sm.scan, &ta, &tb);
    if (pass == 0) {  // ta: the finite items (the same in every thread)
      k[0] = budget[0] < ta ? budget[0] : ta;
      k[1] = budget[1] < ta ? budget[1] : ta;
      rem[0] = k[0];
      rem[1] = k[1];
      if (k[1] == 0) break;  // k[0] <= k[1]: nothing to select (k[0] == 0 < k[1] searches the second only)
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int incl = j == 0 ? inc.x : inc.y, own = j == 0 ? a : b, excl = incl - own;
      if (excl < rem[j] && rem[j] <= incl) {
        int cum = excl;
#pragma unroll
        for (int jj = 0; jj < kBinsPerThread; ++jj) {
          const int c = static_cast<int>(j == 0 ? ca[jj] : cb[jj]);
          if (cum + c >= rem[j]) {
            sm.found_digit[j] = kRadixBins - 1 - kBinsPerThread * tid - jj;
            sm.found_rem[j] = rem[j] - cum;
            break;
          }
          cum += c;
        }
      }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      if (k[j] == 0) continue;  // no rank to find: found_digit[j] was not written
      prefix[j] |= static_cast<uint32_t>(sm.found_digit[j]) << shift;
      rem[j] = sm.found_rem[j];
    }
    if (k[0] == 0) prefix[0] = prefix[1];  // follows the second threshold (one histogram; take[0] stays 0)
    hi_mask |= dmask << shift;
  }
  thr[0] = prefix[0];
  thr[1] = prefix[1];
  take[0] = rem[0];
  take[1] = rem[1];
}

}  // namespace
}  // namespace retroinfer::cuda::detail
