// The fused merge of split-K decode attention (kernels.h FusedMerge), shared by the decode kernels of
// decode.cu and the dense decode kernels of decode_dense.cu. Included only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace retroinfer::cuda::detail {
namespace {

// Fused merge (kernels.h FusedMerge), called by every CTA of the decode and estimate kernels after it has
// written its partial states (all threads, uniform control flow). The CTA that counts last for head h
// merges the head's total splits: per query head g the max M over the splits' m, weights w_s = e^{m_s - M}
// (0 for empty states), L = sum_s l_s w_s (warp g, lanes over the splits, a fixed-order shuffle
// reduction), then out = sum_s w_s o_s / L with thread = 4 consecutive dims of one query head and the
// splits' 16-byte loads independent (L2: __ldcg, the states were written by other multiprocessors).
// Equal to combine_states' pairwise softmax_merge up to f32 rounding (the same terms, rescaled once
// instead of step by step); deterministic (no floating-point atomics). wts: >= kMergeMaxStates floats of
// shared memory this CTA no longer uses.
__device__ void merge_if_last(const FusedMerge& fm, const float2* part_ml, const float* part_o, int total,
                              int G, int D, int h, float* wts, uint64_t* phase) {
  __shared__ int s_last;
  __shared__ float s_inv[kMaxGroup];
  __threadfence();  // release: this thread's partial-state stores before the CTA's count
  __syncthreads();
  if (threadIdx.x == 0) {
    const int done = atomicAdd(fm.counter + h, 1);
    s_last = done == total - 1;
    if (done == total - 1) fm.counter[h] = 0;  // every CTA of head h has counted: ready for the next decode
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();  // acquire: the other CTAs' states (read through L2 below)
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  const float2* ml = part_ml + int64_t{h} * total * G;  // [total, G]
  for (int g = warp; g < G; g += nw) {
    float M = -INFINITY;
    for (int s = lane; s < total; s += 32) M = fmaxf(M, __ldcg(&ml[int64_t{s} * G + g]).x);
    M = warp_max(M);
    float L = 0.0f;
    for (int s = lane; s < total; s += 32) {
      const float2 v = __ldcg(&ml[int64_t{s} * G + g]);
      const float w = v.x == -INFINITY ? 0.0f : expf(v.x - M);  // M = -inf only when every m is
      wts[s * G + g] = w;
      L += v.y * w;
    }
    L = warp_sum(L);
    if (lane == 0) s_inv[g] = L > 0.0f ? 1.0f / L : 0.0f;  // the empty state gives zeros (softmax_finish)
  }
  __syncthreads();
  const int cols = G * D / 4;
  const float* po = part_o + int64_t{h} * total * G * D;  // [total, G, D]
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const int g = (4 * c) / D, d = (4 * c) % D;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
    for (int s = 0; s < total; ++s) {
      const float w = wts[s * G + g];
      const float4 o = __ldcg(reinterpret_cast<const float4*>(po + (int64_t{s} * G + g) * D + d));
      acc.x += w * o.x;
      acc.y += w * o.y;
      acc.z += w * o.z;
      acc.w += w * o.w;
    }
    const float inv = s_inv[g];
    *reinterpret_cast<float4*>(fm.out + (int64_t{h} * G + g) * D + d) =
        make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
  }
  if (phase != nullptr) {
    __syncthreads();
    phase_last(phase, h, kSlotMerge);
  }
}

// Wide fused merge (RETROINFER_EXACT=split64m / split64w; the dense path keeps merge_if_last): the same
// result as merge_if_last bit for bit (the same weights from the same per-lane and shuffle order, the same
// numerator sums in split order), with fewer dependent L2 round trips in the last CTA (run 16: 5.3 us from
// the last partial state to the merged output at 128K batch 4, 42 states per head):
//   - each thread issues the loads of its first kB numerators (16-byte, its first column) right after the
//     acquire fence, before the (m, l) pairs are read, so they fly while the weights form;
//   - each lane loads its splits' (m, l) pairs once (registers for the first 32 * kMl splits; merge_if_last
//     reads them twice: once for the max, once for l and the weights);
//   - the numerators go in batches of kB independent loads (merge_if_last: unroll 8, so ceil(total / 8)
//     round trips; here ceil(total / kB), the first overlapping the weights);
//   - one fence per CTA on each side instead of one per thread (cooperative groups' grid-barrier pattern:
//     the CTA's stores ordered before thread 0 by the barrier, thread 0's fence then its atomic as the
//     release; the atomic, then its fence, then the barrier as the acquire), and the counter's reset
//     store at the end, so that the acquire fence has no store of its own to wait for.
// count: how many partial states this CTA wrote (split64w's estimation CTAs write two); the CTA whose count
// completes total merges. kB: numerators per batch (16: 64 registers; the callers' bounds allow 96-128).
template <int kB>
__device__ void merge_if_last_wide(const FusedMerge& fm, const float2* part_ml, const float* part_o, int total,
                                   int G, int D, int h, int count, float* wts, uint64_t* phase) {
  constexpr int kMl = 2;  // (m, l) pairs per lane kept in registers: totals up to 64 read once
  __shared__ int s_last_w;
  __shared__ float s_inv_w[kMaxGroup];
  __syncthreads();  // every thread's partial-state stores before thread 0's fence
  if (threadIdx.x == 0) {
    __threadfence();  // release: the CTA's stores before its count
    const int done = atomicAdd(fm.counter + h, count) + count;
    s_last_w = done == total;
    if (done == total) __threadfence();  // acquire: the other CTAs' states (read through L2 below)
  }
  __syncthreads();
  if (!s_last_w) return;
  const int tid = threadIdx.x, nt = blockDim.x, warp = tid >> 5, lane = tid & 31, nw = nt >> 5;
  const int cols = G * D / 4;
  const float2* ml = part_ml + int64_t{h} * total * G;  // [total, G]
  const float* po = part_o + int64_t{h} * total * G * D;  // [total, G, D]
  // 1. The first kB numerators of this thread's first column (none past cols or total).
  float4 ob[kB];
  {
    const int g = (4 * tid) / D, d = (4 * tid) % D;
#pragma unroll
    for (int j = 0; j < kB; ++j)
      ob[j] = tid < cols && j < total ? __ldcg(reinterpret_cast<const float4*>(po + (int64_t{j} * G + g) * D + d))
                                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  // 2. Weights: warp g, lanes over the splits, as merge_if_last (fmaxf is exact in any order; l summed per
  // lane in split order, then warp_sum).
  for (int g = warp; g < G; g += nw) {
    float2 v[kMl];
#pragma unroll
    for (int k = 0; k < kMl; ++k) {
      const int s = lane + 32 * k;
      v[k] = s < total ? __ldcg(&ml[int64_t{s} * G + g]) : make_float2(-INFINITY, 0.0f);
    }
    float M = -INFINITY;
#pragma unroll
    for (int k = 0; k < kMl; ++k)
      if (lane + 32 * k < total) M = fmaxf(M, v[k].x);
    for (int s = lane + 32 * kMl; s < total; s += 32) M = fmaxf(M, __ldcg(&ml[int64_t{s} * G + g]).x);
    M = warp_max(M);
    float L = 0.0f;
#pragma unroll
    for (int k = 0; k < kMl; ++k) {
      const int s = lane + 32 * k;
      if (s < total) {
        const float w = v[k].x == -INFINITY ? 0.0f : expf(v[k].x - M);  // M = -inf only when every m is
        wts[s * G + g] = w;
        L += v[k].y * w;
      }
    }
    for (int s = lane + 32 * kMl; s < total; s += 32) {
      const float2 x = __ldcg(&ml[int64_t{s} * G + g]);
      const float w = x.x == -INFINITY ? 0.0f : expf(x.x - M);
      wts[s * G + g] = w;
      L += x.y * w;
    }
    L = warp_sum(L);
    if (lane == 0) s_inv_w[g] = L > 0.0f ? 1.0f / L : 0.0f;  // the empty state gives zeros (softmax_finish)
  }
  __syncthreads();
  // 3. Numerators: thread = 4 consecutive dims of one query head, splits in order, kB loads per batch.
  for (int c = tid; c < cols; c += nt) {
    const int g = (4 * c) / D, d = (4 * c) % D;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s0 = 0; s0 < total; s0 += kB) {
      if (s0 > 0 || c != tid) {
#pragma unroll
        for (int j = 0; j < kB; ++j)
          ob[j] = s0 + j < total
                      ? __ldcg(reinterpret_cast<const float4*>(po + (int64_t{s0 + j} * G + g) * D + d))
                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int j = 0; j < kB; ++j)
        if (s0 + j < total) {
          const float w = wts[(s0 + j) * G + g];
          acc.x += w * ob[j].x;
          acc.y += w * ob[j].y;
          acc.z += w * ob[j].z;
          acc.w += w * ob[j].w;
        }
    }
    const float inv = s_inv_w[g];
    *reinterpret_cast<float4*>(fm.out + (int64_t{h} * G + g) * D + d) =
        make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
  }
  // Every CTA of head h has counted: ready for the next decode (whose CTAs count only after this grid has
  // completed: stream order, or their PDL wait).
  if (tid == 0) fm.counter[h] = 0;
  if (phase != nullptr) {
    __syncthreads();
    phase_last(phase, h, kSlotMerge);
  }
}

}  // namespace
}  // namespace retroinfer::cuda::detail
