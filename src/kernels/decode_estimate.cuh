// The estimation CTA of the decode grids (decode.cu): estimate_cta and its shared memory, shared by run 9's
// grid (decode_est_kernel), the chained estimation grids of RETROINFER_EXACT=split* and the est-first grids
// of run 17. Included only from decode.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/decode_math.cuh"
#include "kernels/decode_merge.cuh"
#include "kernels/kernels.h"

namespace retroinfer::cuda::detail {
namespace {

constexpr int kW = kDecodeWarps;  // warps per CTA (decode.cu's kernels use it too)

// Shared memory of an estimation CTA of kC clusters (estimate_cta): the value-sum rows [kC][D] bf16, the
// weights [kMaxGroup][kC] f32 and the sizes [kC] f32 while loading; afterwards the warp sums [kW][kMaxGroup][D]
// f32 and the fused merge's weights (kMergeMaxStates f32) reuse the buffer from its start (both are written
// only after a barrier that ends every read of the rows, weights and sizes).
template <int D, int kC>
struct EstSmem {
  static constexpr size_t kLoad = size_t{kC} * D * 2 + size_t{kMaxGroup} * kC * 4 + size_t{kC} * 4;
  static constexpr size_t kRed = size_t{kW} * kMaxGroup * D * 4;
  static constexpr size_t kMerge = size_t{kMergeMaxStates} * 4;
  static constexpr size_t kBytes = kLoad > kRed ? (kLoad > kMerge ? kLoad : kMerge) : (kRed > kMerge ? kRed : kMerge);
};
// Run 17 (estimate_cta's kHalves, RETROINFER_EXACT=split64rh / rih): the rows staged half a chunk at a time
// and the weights and warp sums laid out for the group's G query heads instead of kMaxGroup, the merge's
// weights for the `total` states of a head: [kC / 2][D] bf16 + [G][kC] + [kC] f32 while loading, then
// [kW][G][D] f32, then total * G f32. At D = 128, kC = 64, G = 4: 9,472 bytes (<= EstSmem's kBytes always).
template <int D, int kC>
size_t est_half_bytes(int group, int total) {
  const size_t load = size_t{kC} / 2 * D * 2 + size_t(group) * kC * 4 + size_t{kC} * 4;
  const size_t red = size_t{kW} * group * D * 4, merge = size_t(total) * group * 4;
  return load > red ? (load > merge ? load : merge) : (red > merge ? red : merge);
}

// Loads of estimate_cta's inputs written by the kernels before the decode (ids, logits) and of the sizes:
// as run 9 had them (kL2 false: plain / read-only path), or through L2 (__ldcg) for the chained estimation
// grid of RETROINFER_EXACT=split*, which does not wait on its own (see estimate_chained_kernel) and so
// must not meet lines an earlier kernel left in L1.
template <bool kL2, typename T>
__device__ __forceinline__ T est_load(const T* p, bool read_only) {
  if constexpr (kL2) return __ldcg(p);
  else return read_only ? __ldg(p) : *p;
}

// Run 9 (DecodeParams::est_ctas): an estimation CTA of the exact-attention grid, estimated clusters
// [j * kC, min(k_e, (j + 1) * kC)) of flat head h (kC = kEstimateFusedChunk = the CTA's 128 threads; the
// chained estimation grid of RETROINFER_EXACT=split64 also 64). Same state as estimate_kernel's for the same
// clusters (chunk max m_g of the logits, l_g = sum size e^{l - m_g}, o_g = sum e^{l - m_g} VS), formed
// differently so that the whole chunk is in flight at once:
//   1. after the PDL wait (kChained: none, the exact grid before it waited), lane l < kC / kW of warp w
//      loads id w * kC / kW + l of the chunk (-1: padding) and the cluster's size and G logits (independent
//      loads); each warp copies its kC / kW clusters' value-sum rows into shared memory by cp.async, lanes
//      over consecutive 16-byte chunks (the ids by shuffle; padding rows zero-filled, so 0 * row never meets
//      stale shared memory);
//   2. warp w forms the weights of query heads w, w + 4 (max, e^{l - m}, the size-weighted sum) by shuffles
//      while the copies fly;
//   3. thread = (row slot, kVec consecutive dims of the row: 8 = a 16-byte chunk, or 4 for split64's lean
//      CTAs): sum over its rows of w_g[i] * VS_i for every g of the group (each row read from shared memory
//      once for all G query heads), the row slots of a warp added by shuffles, the 4 warps' sums in shared
//      memory in warp order;
//   4. the partial state into slot est.split_offset + j, then the fused merge like every other CTA.
// For kC = 128, kVec = 8 this is run 9's code (the same operations in the same order for any kChained).
// Shared memory: EstSmem<D, kC> (run 9: the decode CTA's tile buffers, which hold it).
// kTrigger (the est-first variants, estimate_first_kernel): griddepcontrol.launch_dependents right after the
// PDL wait, so that the chained exact grid may launch; nothing else changes.
// kHalves (run 17, split64rh / rih; est_half_bytes): lanes l < kC / kW of warp w load the ids of clusters
// (l / h) * kC / 2 + w * h + l % h (h = kC / (2 kW)), so that each warp holds the ids of its rows of both
// halves; step 1 copies the first half's rows, step 3 runs over them, then (a barrier, when the chunk has
// more than kC / 2 clusters) copies the second half's rows into the same buffer and continues. Every thread
// adds its rows in the same order as without (i = rs, rs + kRowSlots, ...: the first half's then the
// second's), so the partial state is the same bit for bit; one more round trip per CTA for half the
// shared memory.
template <int D, int kC, bool kChained, int kVec = 8, bool kTrigger = false, bool kHalves = false>
__device__ void estimate_cta(const DecodeParams& p, int j, int h, unsigned char* smem) {
  constexpr int kThreads = kW * 32;
  constexpr int kChunks = D / 8;                   // 16-byte chunks per value-sum row
  constexpr int kRowsW = kC / kW;                  // clusters (rows) loaded by each warp
  constexpr int kCopies = kRowsW * kChunks / 32;   // 16-byte copies per lane in step 1
  constexpr int kPerLane = kC / 32;                // clusters per lane in step 2
  static_assert(kVec == 8 || kVec == 4, "8 or 4 dims per thread in step 3");
  static_assert(kC % 32 == 0 && kC % kW == 0 && kRowsW <= 32 && (kRowsW * kChunks) % 32 == 0,
                "whole warps of ids and copies");
  constexpr int kRowsBuf = kHalves ? kC / 2 : kC;  // rows staged at once
  constexpr int kHalfW = kRowsW / 2;               // kHalves: rows per warp and half
  static_assert(!kHalves || (kRowsW < 32 && (kHalfW * kChunks) % 32 == 0), "kHalves: whole warps of copies");
  const EstimateParams& e = p.est;
  const int G = p.group, C = e.num_clusters, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int Gs = kHalves ? G : kMaxGroup;                   // query heads of the weight / warp-sum layouts
  uint16_t* rows = reinterpret_cast<uint16_t*>(smem);     // [kRowsBuf][D] bf16 value sums
  float* wl = reinterpret_cast<float*>(rows + kRowsBuf * D);  // [Gs][kC]: logits, then weights
  float* sz = wl + Gs * kC;                                 // [kC]: cluster sizes
  __shared__ float s_m[kMaxGroup], s_l[kMaxGroup];
  // PDL: the ids come from the selection (the logits from the score kernel before it).
  if constexpr (!kChained) grid_dependency_wait();
  if constexpr (kTrigger) grid_launch_dependents();  // after the wait: see estimate_first_kernel
  phase_first(p.phase, h, kSlotEst);
  const uint64_t t_start = p.phase != nullptr ? global_ns() : 0;
  const int begin = j * kC;
  const int cnt = e.k_estimation - begin < kC ? e.k_estimation - begin : kC;  // >= 1: j < ceil(k_e / kC)
  // 1. Ids, sizes, logits; value-sum rows by cp.async.
  // The chunk's cluster this lane loads (lane < kRowsW).
  const int ci = kHalves ? (lane / kHalfW) * (kC / 2) + warp * kHalfW + lane % kHalfW
                         : (kRowsW == 32 ? tid : warp * kRowsW + lane);
  const bool own = lane < kRowsW;
  const int c = own && ci < cnt ? est_load<kChained>(e.estimation_ids + int64_t{h} * e.k_estimation + begin + ci,
                                                     false)
                                : -1;
  const uint16_t* vsh = e.value_sums_bf16 + int64_t{h} * C * D;
  auto copy_half = [&](int hf) {  // kHalves: the warp's kHalfW rows of half hf, buffer rows w * kHalfW + r
#pragma unroll
    for (int k = 0; k < kHalfW * kChunks / 32; ++k) {
      const int q = k * 32 + lane, r = q / kChunks, col = q % kChunks;
      const int cr = __shfl_sync(0xffffffffu, c, hf * kHalfW + r);
      cp_async16_zfill(rows + (warp * kHalfW + r) * D + col * 8, vsh + int64_t{cr < 0 ? 0 : cr} * D + col * 8,
                       cr >= 0);
    }
    cp_async_commit();
  };
  if constexpr (kHalves) {
    copy_half(0);
  } else {
#pragma unroll
    for (int k = 0; k < kCopies; ++k) {  // the warp's kRowsW rows x kChunks chunks, 32 per step
      const int q = k * 32 + lane, r = q / kChunks, col = q % kChunks;
      const int cr = __shfl_sync(0xffffffffu, c, r);
      cp_async16_zfill(rows + (warp * kRowsW + r) * D + col * 8, vsh + int64_t{cr < 0 ? 0 : cr} * D + col * 8,
                       cr >= 0);
    }
    cp_async_commit();
  }
  float lg[kMaxGroup];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
    lg[g] = g < G && c >= 0 ? est_load<kChained>(e.logits + (int64_t{h} * G + g) * C + c, true) : -INFINITY;
  if (own) sz[ci] = c < 0 ? 0.0f : static_cast<float>(est_load<kChained>(e.sizes + int64_t{h} * C + c, true));
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
    if (g < G && own) wl[g * kC + ci] = lg[g];
  __syncthreads();
  // 2. Weights (-inf logits: padding, weight 0; a chunk of padding only keeps m = -inf, l = 0, o = 0).
  for (int g = warp; g < G; g += kW) {
    float x[kPerLane];
    float mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      x[k] = wl[g * kC + lane + 32 * k];
      mx = fmaxf(mx, x[k]);
    }
    mx = warp_max(mx);
    float l = 0.0f;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const float ev = x[k] == -INFINITY ? 0.0f : __expf(x[k] - mx);
      wl[g * kC + lane + 32 * k] = ev;
      l += sz[lane + 32 * k] * ev;
    }
    l = warp_sum(l);
    if (lane == 0) {
      s_m[g] = mx;
      s_l[g] = l;
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // rows landed (each thread waited for its own copies), weights written
  // 3. Numerators: thread = (row slot rs, kVec consecutive dims dc * kVec); kVec = 8 (a 16-byte chunk, run 9)
  // or 4 (8 bytes: half the accumulators, for the 64-cluster CTAs of split64).
  constexpr int kCols = D / kVec;           // dim groups per row
  constexpr int kRowSlots = kThreads / kCols;  // rows read at once by the CTA
  static_assert(32 % kCols == 0, "row slots of whole warps");
  const int dc = tid % kCols, rs = tid / kCols;
  float acc[kMaxGroup][kVec];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
#pragma unroll
    for (int k = 0; k < kVec; ++k) acc[g][k] = 0.0f;
  if constexpr (kHalves) {
    // Rows i in [i0, i1) of the chunk (step kRowSlots), row i at buffer row i - base: the loop below.
    auto add_rows = [&](int i0, int i1, int base) {
#pragma unroll 4
      for (int i = i0; i < i1; i += kRowSlots) {
        const uint2 w2 = *reinterpret_cast<const uint2*>(rows + (i - base) * D + dc * 4);
        const float2 x0 = bf16x2_to_float2(w2.x), x1 = bf16x2_to_float2(w2.y);
        const float v[4] = {x0.x, x0.y, x1.x, x1.y};
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g)
          if (g < G) {
            const float wg = wl[g * kC + i];
#pragma unroll
            for (int k = 0; k < 4; ++k) acc[g][k] += wg * v[k];
          }
      }
    };
    static_assert(kVec == 4 && (kC / 2) % kRowSlots == 0, "the second half continues each thread's row sequence");
    add_rows(rs, cnt < kC / 2 ? cnt : kC / 2, 0);
    if (cnt > kC / 2) {  // CTA-uniform
      __syncthreads();   // every read of the first half's rows is done
      copy_half(1);
      cp_async_wait<0>();
      __syncthreads();
      add_rows(rs + kC / 2, cnt, kC / 2);
    }
  } else {
#pragma unroll 4
    for (int i = rs; i < cnt; i += kRowSlots) {
      float v[kVec];
      if constexpr (kVec == 8) {
        bf16x8_to_float(*reinterpret_cast<const uint4*>(rows + i * D + dc * 8), v);
      } else {
        const uint2 w2 = *reinterpret_cast<const uint2*>(rows + i * D + dc * 4);
        const float2 x0 = bf16x2_to_float2(w2.x), x1 = bf16x2_to_float2(w2.y);
        v[0] = x0.x; v[1] = x0.y; v[2] = x1.x; v[3] = x1.y;
      }
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g)
        if (g < G) {
          const float wg = wl[g * kC + i];
#pragma unroll
          for (int k = 0; k < kVec; ++k) acc[g][k] += wg * v[k];
        }
    }
  }
#pragma unroll
  for (int off = kCols; off < 32; off <<= 1)  // the warp's row slots (lanes dc, dc + kCols, ...)
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g)
      if (g < G)
#pragma unroll
        for (int k = 0; k < kVec; ++k) acc[g][k] += __shfl_xor_sync(0xffffffffu, acc[g][k], off);
  __syncthreads();  // every read of rows and weights is done: the warp sums reuse the rows
  float* red = reinterpret_cast<float*>(smem);  // [kW][Gs][D]
  if (lane < kCols)
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g)
      if (g < G) {
        float4* dst = reinterpret_cast<float4*>(red + (warp * Gs + g) * D + dc * kVec);
#pragma unroll
        for (int k = 0; k < kVec / 4; ++k)
          dst[k] = make_float4(acc[g][4 * k], acc[g][4 * k + 1], acc[g][4 * k + 2], acc[g][4 * k + 3]);
      }
  __syncthreads();
  // 4. Partial state, then the fused merge (its first barrier ends the reads of red below).
  const int slot = e.split_offset + j;
  for (int x = tid; x < G * D; x += blockDim.x) {
    const int g = x / D, d = x % D;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kW; ++w) sum += red[(w * Gs + g) * D + d];
    const int64_t base = (int64_t{h} * p.total_splits + slot) * G + g;
    p.part_o[base * D + d] = sum;
    if (d == 0) p.part_ml[base] = make_float2(s_m[g], s_l[g]);
  }
  if (p.phase != nullptr) {
    __syncthreads();
    phase_last(p.phase, h, kSlotEst + 1);
    phase_span(p.phase, h, kSlotSpan + 4, t_start);
  }
  if (p.merge.counter != nullptr)
    merge_if_last(p.merge, p.part_ml, p.part_o, p.total_splits, G, D, h, red, p.phase);
}

}  // namespace
}  // namespace retroinfer::cuda::detail
