// The per-warp tensor-core math of flash decoding shared by the decode kernels (decode.cu decode_kernel,
// decode_dense.cu's streaming kernels, select.cu's score kernel for the query fragments): one warp, lane
// (gq = lane / 4, tq = lane % 4) of the mma m16n8k16 fragment layouts, query head gq of the GQA group in
// A rows gq (bf16 hi part) and gq + 8 (lo part), so that S^T = Q K^T carries the f32 query to ~2^-18
// relative (the row pair's products are summed: s = c[0] + c[2], ...); P is split the same way for
// O^T += P V. One copy serves every kernel, so that they all compute the same expressions in the same
// order. Included only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/kernels.h"
#include "retroinfer/softmax_state.h"

namespace retroinfer::cuda::detail {

// Query A fragments of the QK MMAs, k-steps k = 0..D/16-1: qa[k] = {hi(row gq, k 2tq..), lo(row gq+8,
// k 2tq..), hi(k 2tq+8..), lo(k 2tq+8..)} of query head gq of flat head h, times scale; rows of heads
// >= G are zero. q: [H, G, D] f32.
// kCalibrated (int8 keys relative to a key calibration, decode_kernels.h KvInt8Rows): channel i also times
// factor[i], and the return value is the quad's sum of x_i * mean[i] over x = q * scale (the logit every key
// shares; each lane holds D / 4 channels, summed by two shuffles); factor, mean: the flat head's [D] rows.
// Without it the return value is 0.
template <int D, bool kCalibrated = false>
__device__ __forceinline__ float query_fragments(uint32_t (&qa)[D / 16][4], const float* q, int h, int G, int gq,
                                                 int tq, float scale, const float* factor = nullptr,
                                                 const float* mean = nullptr) {
  const bool on = gq < G;
  const float* qh = q + (int64_t{h} * G + (on ? gq : 0)) * D;
  float bias = 0.0f;
#pragma unroll
  for (int k = 0; k < D / 16; ++k) {
    float x[4] = {0, 0, 0, 0};
    if (on) {
      const float2 u = *reinterpret_cast<const float2*>(qh + k * 16 + 2 * tq);
      const float2 w = *reinterpret_cast<const float2*>(qh + k * 16 + 2 * tq + 8);
      x[0] = u.x * scale; x[1] = u.y * scale; x[2] = w.x * scale; x[3] = w.y * scale;
      if constexpr (kCalibrated) {
        const int c[4] = {k * 16 + 2 * tq, k * 16 + 2 * tq + 1, k * 16 + 2 * tq + 8, k * 16 + 2 * tq + 9};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          bias = fmaf(x[j], mean[c[j]], bias);
          x[j] *= factor[c[j]];
        }
      }
    }
    float hi[4], lo[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) split_bf16(x[j], hi[j], lo[j]);
    qa[k][0] = pack_bf16(hi[0], hi[1]);
    qa[k][1] = pack_bf16(lo[0], lo[1]);
    qa[k][2] = pack_bf16(hi[2], hi[3]);
    qa[k][3] = pack_bf16(lo[2], lo[3]);
  }
  if constexpr (kCalibrated) {
    bias += __shfl_xor_sync(0xffffffffu, bias, 1);
    bias += __shfl_xor_sync(0xffffffffu, bias, 2);
  }
  return bias;
}

// One tile's online-softmax step of the lane's query head: s = the lane's 4 logits of tokens tok[0..3]
// (tile positions; those >= valid are masked: a select, so stale K rows holding NaN cannot leak), m / l
// the running max and this lane's partial sum, o [kNt][4] the P.V accumulators. Updates m, l (l rescaled
// then plus this tile's 4 probabilities), rescales o, and returns P's A fragments pa (hi / lo split as the
// query's) for O += P V. The quad's lanes (same query head) must call it together (max by shuffles).
// v_weight[j]: token tok[j]'s factor in P V only (an int8 V row's scale; 1 for bf16 rows): pa carries
// p_j * v_weight[j] while l sums the p_j.
template <int kNt>
__device__ __forceinline__ void softmax_tile_weighted(float (&s)[4], const int (&tok)[4], int valid, float& m, float& l,
                                                      float (&o)[kNt][4], uint32_t (&pa)[4],
                                                      const float (&v_weight)[4]) {
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    s[j] = tok[j] < valid ? s[j] : -INFINITY;
    mx = fmaxf(mx, s[j]);
  }
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float m_new = fmaxf(m, mx);
  const float alpha = softmax_rescale(m, m_new);
  m = m_new;
  float pr[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) pr[j] = tok[j] < valid ? __expf(s[j] - m_new) : 0.0f;
  l = l * alpha + (pr[0] + pr[1] + pr[2] + pr[3]);
#pragma unroll
  for (int j = 0; j < kNt; ++j) {
    o[j][0] *= alpha; o[j][1] *= alpha; o[j][2] *= alpha; o[j][3] *= alpha;
  }
  float ph[4], pl[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) split_bf16(pr[j] * v_weight[j], ph[j], pl[j]);
  pa[0] = pack_bf16(ph[0], ph[1]);
  pa[1] = pack_bf16(pl[0], pl[1]);
  pa[2] = pack_bf16(ph[2], ph[3]);
  pa[3] = pack_bf16(pl[2], pl[3]);
}
// softmax_tile_weighted with every weight 1 (bf16 V rows; x * 1.0f is x, so the results are unchanged).
template <int kNt>
__device__ __forceinline__ void softmax_tile(float (&s)[4], const int (&tok)[4], int valid, float& m, float& l,
                                             float (&o)[kNt][4], uint32_t (&pa)[4]) {
  const float ones[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  softmax_tile_weighted<kNt>(s, tok, valid, m, l, o, pa, ones);
}

// The CTA's merge of its warps' states (after the token loop, l already summed over the quad): each warp
// stages its state in shared memory, then one thread per (query head, dimension) merges the kW warps'
// states in warp order into one partial state. stage_o: [kW, kMaxGroup, D] f32, stage_ml: [kW, kMaxGroup]
// (m, l). Call stage_warp_state for query heads gq < G only, then a CTA barrier, then merge_warp_states
// from every thread.
template <int D>
__device__ __forceinline__ void stage_warp_state(float* stage_o, float2* stage_ml, const float (&o)[D / 8][4],
                                                 float m, float l, int warp, int gq, int tq) {
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    float* dst = stage_o + (warp * kMaxGroup + gq) * D + j * 8 + 2 * tq;
    dst[0] = o[j][0] + o[j][2];
    dst[1] = o[j][1] + o[j][3];
  }
  if (tq == 0) stage_ml[warp * kMaxGroup + gq] = make_float2(m, l);
}
// Writes the merged state of query head g into partial row (row0 * G + g): part_ml [.., G] (m, l) and
// part_o [.., G, D] un-normalised numerators (row0 = flat head * total slots + the CTA's slot).
template <int D, int kW>
__device__ __forceinline__ void merge_warp_states(const float* stage_o, const float2* stage_ml, int G, int64_t row0,
                                                  float2* part_ml, float* part_o) {
  for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
    const int g = i / D, d = i % D;
    SoftmaxScalars st;
    float acc_o = 0.0f;
    for (int w = 0; w < kW; ++w) {
      const float2 ml = stage_ml[w * kMaxGroup + g];
      SoftmaxScalars b;
      b.m = ml.x;
      b.l = ml.y;
      const float ob = stage_o[(w * kMaxGroup + g) * D + d];
      softmax_merge(st, &acc_o, b, &ob, 1);
    }
    const int64_t base = row0 * G + g;
    part_o[base * D + d] = acc_o;
    if (d == 0) part_ml[base] = make_float2(st.m, st.l);
  }
}

}  // namespace retroinfer::cuda::detail
