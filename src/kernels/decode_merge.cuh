// The fused merge of split-K decode attention (kernels.h FusedMerge), taken by the dense decode kernels of
// decode_dense.cu. Included only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace retroinfer::cuda::detail {
namespace {

// The pieces of the merge below (all threads of the CTA call each, uniform control flow).

// Counts this CTA into counter[h] after its partial-state stores (release fence, one atomic by thread 0)
// and tells the CTA that counted last (total CTAs of head h count), which resets the counter for the next
// decode and, after an acquire fence, reads the other CTAs' states.
__device__ __forceinline__ bool count_last(int* counter, int h, int total) {
  __shared__ int s_last;
  __threadfence();  // release: this thread's partial-state stores before the CTA's count
  __syncthreads();
  if (threadIdx.x == 0) {
    const int done = atomicAdd(counter + h, 1);
    s_last = done == total - 1;
    if (done == total - 1) counter[h] = 0;  // every CTA of head h has counted: ready for the next decode
  }
  __syncthreads();
  if (!s_last) return false;
  __threadfence();  // acquire: the other CTAs' states (read through L2)
  return true;
}

// Per query head g of n states ml [n, G] (m, l): M = max m_s, weights w_s = e^{m_s - M} (0 for empty states)
// into wts [n, G], L = sum_s l_s w_s (warp g, lanes over the states, a fixed-order shuffle reduction); then
// out(g, M, L) by lane 0 of warp g. A barrier follows.
template <class Out>
__device__ __forceinline__ void merge_weights(const float2* ml, int n, int G, float* wts, Out&& out) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  for (int g = warp; g < G; g += nw) {
    float M = -INFINITY;
    for (int s = lane; s < n; s += 32) M = fmaxf(M, __ldcg(&ml[int64_t{s} * G + g]).x);
    M = warp_max(M);
    float L = 0.0f;
    for (int s = lane; s < n; s += 32) {
      const float2 v = __ldcg(&ml[int64_t{s} * G + g]);
      const float w = v.x == -INFINITY ? 0.0f : expf(v.x - M);  // M = -inf only when every m is
      wts[s * G + g] = w;
      L += v.y * w;
    }
    L = warp_sum(L);
    if (lane == 0) out(g, M, L);
  }
  __syncthreads();
}

// Numerators sum_s w_s o_s of the n states po [n, G, D] in slot order, thread = 4 consecutive dims of one query
// head (column c of G D / 4), the states' 16-byte loads independent (L2); out(c, g, d, acc) per column.
template <class Out>
__device__ __forceinline__ void merge_numerators(const float* po, int n, int G, int D, const float* wts, Out&& out) {
  const int cols = G * D / 4;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const int g = (4 * c) / D, d = (4 * c) % D;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
    for (int s = 0; s < n; ++s) {
      const float w = wts[s * G + g];
      const float4 o = __ldcg(reinterpret_cast<const float4*>(po + (int64_t{s} * G + g) * D + d));
      acc.x += w * o.x;
      acc.y += w * o.y;
      acc.z += w * o.z;
      acc.w += w * o.w;
    }
    out(g, d, acc);
  }
}

// Fused merge (kernels.h FusedMerge), called by every CTA of a dense decode kernel after it has written its
// partial states (all threads, uniform control flow). The CTA that counts last for head h
// merges the head's total splits: per query head g the max M over the splits' m, weights w_s = e^{m_s - M}
// (0 for empty states), L = sum_s l_s w_s (warp g, lanes over the splits, a fixed-order shuffle
// reduction), then out = sum_s w_s o_s / L with thread = 4 consecutive dims of one query head and the
// splits' 16-byte loads independent (L2: __ldcg, the states were written by other multiprocessors).
// Equal to combine_states' pairwise softmax_merge up to f32 rounding (the same terms, rescaled once
// instead of step by step); deterministic (no floating-point atomics). wts: >= kMergeMaxStates floats of
// shared memory this CTA no longer uses.
__device__ void merge_if_last(const FusedMerge& fm, const float2* part_ml, const float* part_o, int total,
                              int G, int D, int h, float* wts, uint64_t* phase) {
  __shared__ float s_inv[kMaxGroup];
  if (!count_last(fm.counter, h, total)) return;
  merge_weights(part_ml + int64_t{h} * total * G, total, G, wts, [&](int g, float, float L) {
    s_inv[g] = L > 0.0f ? 1.0f / L : 0.0f;  // the empty state gives zeros (softmax_finish)
  });
  merge_numerators(part_o + int64_t{h} * total * G * D, total, G, D, wts, [&](int g, int d, const float4& acc) {
    const float inv = s_inv[g];
    *reinterpret_cast<float4*>(fm.out + (int64_t{h} * G + g) * D + d) =
        make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
  });
  if (phase != nullptr) {
    __syncthreads();
    phase_last(phase, h, kSlotMerge);
  }
}

}  // namespace
}  // namespace retroinfer::cuda::detail
