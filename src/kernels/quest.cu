// Quest baseline (per-page key bounds, docs/design.md §4): page min / max keys at build time, and the upper
// bound of each page's logit at decode time. The selection and the exact attention reuse
// select_and_expand (pages as items) and decode_attention.
#include <cuda_runtime.h>

#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace retroinfer::cuda::detail {
namespace {

// One thread per (flat head, page, dimension): element-wise min and max over the page's keys. The
// extremes of bf16 values are bf16 values, so the bounds are exact.
__global__ void pages_kernel(const QuestParams p) {
  const int D = p.head_dim;
  const int64_t total = int64_t{p.num_heads} * p.num_pages * D;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const int d = static_cast<int>(e % D);
    const int64_t hp = e / D, h = hp / p.num_pages, pg = hp % p.num_pages;
    const int64_t t0 = pg * p.page_tokens;
    const int64_t t1 = t0 + p.page_tokens < p.n_idx ? t0 + p.page_tokens : p.n_idx;
    float lo = INFINITY, hi = -INFINITY;
    for (int64_t t = t0; t < t1; ++t) {
      const float k = bf16_to_f32(p.keys[(h * p.kv_stride + p.idx_begin + t) * D + d]);
      lo = fminf(lo, k);
      hi = fmaxf(hi, k);
    }
    p.page_min[e] = f32_to_bf16(lo);
    p.page_max[e] = f32_to_bf16(hi);
  }
}

// Page score = max over the group's query heads of sum_d max(q_d * max_d, q_d * min_d), an upper bound of
// the page's best logit for every head of the group. D/8 lanes per page.
template <int D>
__global__ void __launch_bounds__(256) page_score_kernel(const QuestParams p) {
  constexpr int kLpp = D / 8, kPpp = 32 / kLpp;
  const int h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, G = p.group;
  const int sub = lane % kLpp, slot = lane / kLpp;
  float qr[kMaxGroup][8];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
#pragma unroll
    for (int j = 0; j < 8; ++j) qr[g][j] = g < G ? p.q[(int64_t{h} * G + g) * D + sub * 8 + j] : 0.0f;
  const int stride = gridDim.x * 8;
  for (int pass = blockIdx.x * 8 + warp; pass * kPpp < p.num_pages; pass += stride) {
    const int pg = pass * kPpp + slot;
    float mn[8], mx[8];
    if (pg < p.num_pages) {
      const int64_t at = (int64_t{h} * p.num_pages + pg) * D + sub * 8;
      bf16x8_to_float(__ldg(reinterpret_cast<const uint4*>(p.page_min + at)), mn);
      bf16x8_to_float(__ldg(reinterpret_cast<const uint4*>(p.page_max + at)), mx);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) mn[j] = mx[j] = 0.0f;
    }
    float best = -INFINITY;
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g < G) {
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) acc += fmaxf(qr[g][j] * mn[j], qr[g][j] * mx[j]);
#pragma unroll
        for (int off = kLpp / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
        best = fmaxf(best, acc);
      }
    }
    if (sub == 0 && pg < p.num_pages) p.scores[int64_t{h} * p.num_pages + pg] = best;
  }
}

}  // namespace

cudaError_t quest_pages(const QuestParams& p, cudaStream_t s) {
  const int64_t total = int64_t{p.num_heads} * p.num_pages * p.head_dim;
  const int blocks = static_cast<int>(total / 256 + 1 < 16384 ? total / 256 + 1 : 16384);
  pages_kernel<<<blocks, 256, 0, s>>>(p);
  return cudaGetLastError();
}

cudaError_t quest_score(const QuestParams& p, cudaStream_t s) {
  const int ppp = 32 / (p.head_dim / 8);
  const int64_t passes = (int64_t{p.num_pages} + ppp - 1) / ppp;
  const int bx = static_cast<int>((passes + 8 * 4 - 1) / (8 * 4));
  const dim3 grid(bx > 0 ? bx : 1, p.num_heads);
  if (p.head_dim == 128) page_score_kernel<128><<<grid, 256, 0, s>>>(p);
  else if (p.head_dim == 64) page_score_kernel<64><<<grid, 256, 0, s>>>(p);
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}

}  // namespace retroinfer::cuda::detail
