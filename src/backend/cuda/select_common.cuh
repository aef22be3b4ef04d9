// Shared pieces of the one-CTA selection kernels (select.cu: the radix kernel; select_bins.cu: the
// few-barrier kernel): the per-head softmax normaliser merge, the block scans, and the exact radix select of
// both thresholds (3 passes of 11-bit digits).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

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

constexpr int kSelThreads = 1024;
constexpr int kSelWarps = kSelThreads / 32;

constexpr int kRadixBins = 2048;  // 11-bit digits: 3 passes (bits 31..21, 20..10, 9..0)
constexpr int kBinsPerThread = kRadixBins / kSelThreads;
static_assert(kRadixBins % kSelThreads == 0 && kSelWarps == 32, "scan layout");

struct SelectSmem {
  int warp_sums[kSelWarps + 1];
  int warp_sums_b[kSelWarps + 1];
  unsigned hist[2][kRadixBins];  // threshold 1, threshold 2 (16 KiB)
  int found_digit[2];
  int found_rem[2];
};

// Inclusive scan of the pair (a, b) over the block; *ta, *tb receive the block sums.
__device__ int2 block_scan2(int a, int b, SelectSmem& sm, int* ta, int* tb) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int ia = a, ib = b;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int ya = __shfl_up_sync(0xffffffffu, ia, off), yb = __shfl_up_sync(0xffffffffu, ib, off);
    if (lane >= off) { ia += ya; ib += yb; }
  }
  if (lane == 31) { sm.warp_sums[warp] = ia; sm.warp_sums_b[warp] = ib; }
  __syncthreads();
  if (warp == 0) {
    const int x = sm.warp_sums[lane], y = sm.warp_sums_b[lane];
    int xi = x, yi = y;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int u = __shfl_up_sync(0xffffffffu, xi, off), v = __shfl_up_sync(0xffffffffu, yi, off);
      if (lane >= off) { xi += u; yi += v; }
    }
    sm.warp_sums[lane] = xi - x;
    sm.warp_sums_b[lane] = yi - y;
    if (lane == 31) { sm.warp_sums[kSelWarps] = xi; sm.warp_sums_b[kSelWarps] = yi; }
  }
  __syncthreads();
  const int2 r = make_int2(sm.warp_sums[warp] + ia, sm.warp_sums_b[warp] + ib);
  *ta = sm.warp_sums[kSelWarps];
  *tb = sm.warp_sums_b[kSelWarps];
  __syncthreads();
  return r;
}

// Exclusive scan over the block; *total receives the block sum.
__device__ int block_exclusive_scan(int v, SelectSmem& sm, int* total) {
  int unused;
  return block_scan2(v, 0, sm, total, &unused).x - v;
}

// Both thresholds in one sequence of 3 radix passes: with k[j] = min(budget[j], finite items) (budget[0]
// <= budget[1]; the first pass's histogram counts the finite items), the k[j]-th largest order key as
// thr[j] and how many of the items equal to it belong to the top k[j] as take[j]; all zero when no item is
// finite. While the two prefixes agree, one histogram serves both.
__device__ void radix_select2(const float* sc, int n, const int budget[2], SelectSmem& sm, int k[2], uint32_t thr[2],
                              int take[2]) {
  uint32_t prefix[2] = {0u, 0u}, hi_mask = 0u;
  int rem[2] = {0, 0};
  k[0] = k[1] = 0;
  const int tid = threadIdx.x, lane = tid & 31;
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
    const uint32_t dmask = pass == 2 ? 1023u : 2047u;
    const bool same = prefix[0] == prefix[1];
    unsigned* h0 = sm.hist[0];
    unsigned* h1 = same ? sm.hist[0] : sm.hist[1];
    for (int i = tid; i < (same ? kRadixBins : 2 * kRadixBins); i += blockDim.x) (&sm.hist[0][0])[i] = 0u;
    __syncthreads();
    // Warp-aggregated histogram: the scores share their high bits, so plain atomics would serialise on one
    // bin; lanes with the same digit add once through their leader.
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
    // Thread t owns bins kRadixBins-1-2t, kRadixBins-2-2t (descending).
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
    const int2 inc = block_scan2(a, b, sm, &ta, &tb);
    if (pass == 0) {  // ta: the finite items (the same in every thread)
      k[0] = budget[0] < ta ? budget[0] : ta;
      k[1] = budget[1] < ta ? budget[1] : ta;
      rem[0] = k[0];
      rem[1] = k[1];
      if (k[0] == 0) break;
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
      prefix[j] |= static_cast<uint32_t>(sm.found_digit[j]) << shift;
      rem[j] = sm.found_rem[j];
    }
    hi_mask |= dmask << shift;
  }
  thr[0] = prefix[0];
  thr[1] = prefix[1];
  take[0] = rem[0];
  take[1] = rem[1];
}

}  // namespace
}  // namespace retroinfer::cuda::detail
