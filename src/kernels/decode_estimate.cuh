// The estimation CTA of a decode (decode.cu estimate_kernel): estimate_cta and its shared memory. Included only
// from decode.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/decode_math.cuh"
#include "kernels/kernels.h"

namespace retroinfer::cuda::detail {
namespace {

constexpr int kW = kDecodeWarps;  // warps per CTA (decode.cu's kernels use it too)
constexpr int kEstC = kEstimateChunk;

// Shared memory of an estimation CTA (estimate_cta): the value-sum rows [kEstC][D] bf16, the weights
// [kMaxGroup][kEstC] f32 and the sizes [kEstC] f32 while loading; afterwards the warp sums [kW][kMaxGroup][D]
// f32 reuse the buffer from its start (written only after a barrier that ends every read of the rows, weights
// and sizes).
template <int D>
struct EstSmem {
  static constexpr size_t kLoad = size_t{kEstC} * D * 2 + size_t{kMaxGroup} * kEstC * 4 + size_t{kEstC} * 4;
  static constexpr size_t kRed = size_t{kW} * kMaxGroup * D * 4;
  static constexpr size_t kBytes = kLoad > kRed ? kLoad : kRed;
};

// Estimation CTA j of flat head h: estimated clusters [j * kEstC, min(k_e, (j + 1) * kEstC)). Its partial state
// (chunk max m_g of the logits, l_g = sum size e^{l - m_g}, o_g = sum e^{l - m_g} VS) is formed so that the whole
// chunk is in flight at once:
//   1. lane l < kEstC / kW of warp w loads id w * kEstC / kW + l of the chunk (-1: padding) and the cluster's
//      size and G logits (independent loads); each warp copies its kEstC / kW clusters' value-sum rows into
//      shared memory by cp.async, lanes over consecutive 16-byte chunks (the ids by shuffle; padding rows
//      zero-filled, so 0 * row never meets stale shared memory);
//   2. warp w forms the weights of query heads w, w + 4 (max, e^{l - m}, the size-weighted sum) by shuffles
//      while the copies fly;
//   3. thread = (row slot, 4 consecutive dims of the row: 8 bytes, so 32 accumulators at G = 8 and the CTA
//      stays at 64 registers): sum over its rows of w_g[i] * VS_i for every g of the group (each row read from
//      shared memory once for all G query heads), the row slots of a warp added by shuffles, the 4 warps' sums
//      in shared memory in warp order;
//   4. the partial state into slot est.split_offset + j.
// The CTA does not wait for the exact grid it is chained to (that would wait for the whole grid; see
// estimate_kernel): its inputs, the ids (selection) and logits (score kernel), were complete and flushed
// when the first exact CTA passed its own wait. They are read through L2 (__ldcg) so that no line an earlier
// kernel left in L1 can be stale; the value sums by cp.async.cg (L2).
template <int D>
__device__ void estimate_cta(const DecodeParams& p, int j, int h, unsigned char* smem) {
  constexpr int kVec = 4;                          // dims per thread in step 3
  constexpr int kThreads = kW * 32;
  constexpr int kChunks = D / 8;                   // 16-byte chunks per value-sum row
  constexpr int kRowsW = kEstC / kW;               // clusters (rows) loaded by each warp
  constexpr int kCopies = kRowsW * kChunks / 32;   // 16-byte copies per lane in step 1
  constexpr int kPerLane = kEstC / 32;             // clusters per lane in step 2
  static_assert(kEstC % 32 == 0 && kEstC % kW == 0 && kRowsW <= 32 && (kRowsW * kChunks) % 32 == 0,
                "whole warps of ids and copies");
  const EstimationZone& e = p.est;
  const int G = p.group, C = e.num_clusters, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  constexpr int Gs = kMaxGroup;                             // query heads of the weight / warp-sum layouts
  uint16_t* rows = reinterpret_cast<uint16_t*>(smem);     // [kEstC][D] bf16 value sums
  float* wl = reinterpret_cast<float*>(rows + kEstC * D);  // [Gs][kEstC]: logits, then weights
  float* sz = wl + Gs * kEstC;                              // [kEstC]: cluster sizes
  __shared__ float s_m[kMaxGroup], s_l[kMaxGroup];
  phase_first(p.phase, h, kSlotEst);
  const uint64_t t_start = p.phase != nullptr ? global_ns() : 0;
  const int begin = j * kEstC;
  const int cnt = e.k_estimation - begin < kEstC ? e.k_estimation - begin : kEstC;  // >= 1: j < ceil(k_e / kEstC)
  // 1. Ids, sizes, logits; value-sum rows by cp.async.
  // The chunk's cluster this lane loads (lane < kRowsW).
  const int ci = kRowsW == 32 ? tid : warp * kRowsW + lane;
  const bool own = lane < kRowsW;
  const int c = own && ci < cnt ? __ldcg(e.estimation_ids + int64_t{h} * e.k_estimation + begin + ci) : -1;
  const uint16_t* vsh = e.value_sums_bf16 + int64_t{h} * C * D;
#pragma unroll
  for (int k = 0; k < kCopies; ++k) {  // the warp's kRowsW rows x kChunks chunks, 32 per step
    const int q = k * 32 + lane, r = q / kChunks, col = q % kChunks;
    const int cr = __shfl_sync(0xffffffffu, c, r);
    cp_async16_zfill(rows + (warp * kRowsW + r) * D + col * 8, vsh + int64_t{cr < 0 ? 0 : cr} * D + col * 8,
                     cr >= 0);
  }
  cp_async_commit();
  float lg[kMaxGroup];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) lg[g] = g < G && c >= 0 ? __ldcg(e.logits + (int64_t{h} * G + g) * C + c) : -INFINITY;
  if (own) sz[ci] = c < 0 ? 0.0f : static_cast<float>(__ldcg(e.sizes + int64_t{h} * C + c));
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
    if (g < G && own) wl[g * kEstC + ci] = lg[g];
  __syncthreads();
  // 2. Weights (-inf logits: padding, weight 0; a chunk of padding only keeps m = -inf, l = 0, o = 0).
  for (int g = warp; g < G; g += kW) {
    float x[kPerLane];
    float mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      x[k] = wl[g * kEstC + lane + 32 * k];
      mx = fmaxf(mx, x[k]);
    }
    mx = warp_max(mx);
    float l = 0.0f;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const float ev = x[k] == -INFINITY ? 0.0f : __expf(x[k] - mx);
      wl[g * kEstC + lane + 32 * k] = ev;
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
  // 3. Numerators: thread = (row slot rs, kVec consecutive dims dc * kVec).
  constexpr int kCols = D / kVec;           // dim groups per row
  constexpr int kRowSlots = kThreads / kCols;  // rows read at once by the CTA
  static_assert(32 % kCols == 0, "row slots of whole warps");
  const int dc = tid % kCols, rs = tid / kCols;
  float acc[kMaxGroup][kVec];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
#pragma unroll
    for (int k = 0; k < kVec; ++k) acc[g][k] = 0.0f;
#pragma unroll 4
  for (int i = rs; i < cnt; i += kRowSlots) {
    float v[kVec];
    const uint2 w2 = *reinterpret_cast<const uint2*>(rows + i * D + dc * 4);
    const float2 x0 = bf16x2_to_float2(w2.x), x1 = bf16x2_to_float2(w2.y);
    v[0] = x0.x; v[1] = x0.y; v[2] = x1.x; v[3] = x1.y;
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g)
      if (g < G) {
        const float wg = wl[g * kEstC + i];
#pragma unroll
        for (int k = 0; k < kVec; ++k) acc[g][k] += wg * v[k];
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
  // 4. Partial state.
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
}

}  // namespace
}  // namespace retroinfer::cuda::detail
