// Pieces of the cluster-score kernels (score_clusters.cu) apart from how a tile reaches shared memory: the
// CTA's and warp's share of the centroid tiles, a tile's epilogue, the normaliser partial's epilogue and the
// formation of the selection's scores after the grid barrier. Included only from .cu files.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/kernels.h"
#include "kernels/select_common.cuh"

namespace retroinfer::cuda::detail {
namespace {

constexpr int kScoreWarps = 4;   // warps per CTA (no producer warp: see score_clusters.cu)
constexpr int kScoreTile = 16;   // centroids per warp tile

// This CTA's tiles [tile0, tile1) of 16 centroids of its head (gridDim.x CTAs per head, contiguous ranges
// of per_cta tiles); warp w takes tiles tile0 + w, tile0 + w + kScoreWarps, ..., ntiles of them.
struct ScoreTiles {
  int tile0 = 0, tile1 = 0, ntiles = 0;
  // First centroid of the warp's t-th tile.
  __device__ __forceinline__ int first(int t, int warp) const { return (tile0 + t * kScoreWarps + warp) * kScoreTile; }
};
__device__ __forceinline__ ScoreTiles score_tiles(int num_clusters, int warp) {
  ScoreTiles r;
  const int tiles_all = (num_clusters + kScoreTile - 1) / kScoreTile;
  const int per_cta = (tiles_all + gridDim.x - 1) / gridDim.x;
  r.tile0 = blockIdx.x * per_cta;
  r.tile1 = min(tiles_all, r.tile0 + per_cta);
  r.ntiles = r.tile0 + warp < r.tile1 ? (r.tile1 - r.tile0 - warp + kScoreWarps - 1) / kScoreWarps : 0;
  return r;
}

// Items per thread per round of form_own_scores (kFormRound * G loads in flight): 4 x 128 threads >= the 352
// clusters of a CTA at 128K batch 4, so every logit the CTA forms is loaded before the grid barrier and no L2
// round trip follows it.
constexpr int kFormRound = 4;

// The tail of the score kernels with kForm (ScoreParams::scores set; cooperative launch): a grid-wide barrier
// (all partials written), then the scores of clusters [c_begin, c_end) of head h, bit-identical to
// form_scores_kernel: query head g's (M_g, 1 / L_g) merged from the gridDim.x partials by one warp
// (select_common.cuh merge_head_normaliser; warp w takes g = w, w + kScoreWarps, ...: the same per-g
// computation as form_scores' warp g), then each score by the same form_head_score. Everything read here was
// written by this grid: L2 loads (__ldcg), never the non-coherent path.
__device__ __forceinline__ void form_own_scores(const ScoreParams& p, int h, int c_begin, int c_end) {
  constexpr int kB = kFormRound;
  __shared__ float gmax[kMaxGroup], ginv[kMaxGroup];
  const int warp = threadIdx.x >> 5, G = p.group, C = p.num_clusters;
  const int parts = static_cast<int>(gridDim.x);
  const float* lgh = p.logits + int64_t{h} * G * C;
  float* sch = p.scores + int64_t{h} * C;
  float lv[kB][kMaxGroup];
  auto load = [&](int i0) { load_logits<kB, true>(lv, lgh, C, G, i0, blockDim.x, c_end); };
  // The first round's logits were written by this CTA (visible since the score kernel's barrier before
  // the partials): in flight across the grid barrier.
  const int first = c_begin + static_cast<int>(threadIdx.x);
  if (first < c_end) load(first);
  cooperative_groups::this_grid().sync();
  phase_last(p.phase, h, kSlotScore + 3);  // diagnostics: past the grid barrier
  for (int g = warp; g < G; g += kScoreWarps)
    merge_head_normaliser(p.norm_partial + (int64_t{h} * G + g) * parts, parts, g, gmax, ginv);
  __syncthreads();
  for (int i0 = first; i0 < c_end; i0 += kB * blockDim.x) {
    if (i0 != first) load(i0);
#pragma unroll
    for (int b = 0; b < kB; ++b) {
      const int i = i0 + b * blockDim.x;
      if (i >= c_end) break;
      sch[i] = form_head_score(lv[b], G, gmax, ginv);  // form_scores_kernel's, bit for bit
    }
  }
}

// The end of the score kernels: the lane's online (max, sum) nm / ns of query head gq merged over the quad's
// lanes, then over the warps (red: [kScoreWarps][kMaxGroup], in warp order) into this CTA's normaliser
// partial of each query head; with kForm, the formation of the CTA's own clusters' scores; the phase stamp.
// Every thread of the CTA calls it.
template <bool kForm>
__device__ __forceinline__ void score_epilogue(const ScoreParams& p, float nm, float ns, int gq, int tq,
                                               const ScoreTiles& tiles, float2 (&red)[kScoreWarps][kMaxGroup]) {
  const int h = blockIdx.y, warp = threadIdx.x >> 5, G = p.group, C = p.num_clusters;
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, nm, off), s2 = __shfl_xor_sync(0xffffffffu, ns, off);
    ms_merge(nm, ns, m2, s2);
  }
  if (tq == 0 && gq < G) red[warp][gq] = make_float2(nm, ns);
  __syncthreads();
  phase_first(p.phase, h, kSlotScore + 1);  // diagnostics: this CTA's tile loops are done
  phase_last(p.phase, h, kSlotScore + 2);
  if (threadIdx.x < G) {
    float m = -INFINITY, sum = 0.0f;
    for (int w = 0; w < kScoreWarps; ++w) ms_merge(m, sum, red[w][threadIdx.x].x, red[w][threadIdx.x].y);
    p.norm_partial[(int64_t{h} * G + threadIdx.x) * gridDim.x + blockIdx.x] = make_float2(m, sum);
  }
  if constexpr (kForm) form_own_scores(p, h, tiles.tile0 * kScoreTile, min(C, tiles.tile1 * kScoreTile));
  phase_last(p.phase, h, 1);
}

// One tile's epilogue: the lane's kN logits s (kN = 4: centroids c0 + 2tq, c0 + 2tq + 1, c0 + 8 + 2tq,
// c0 + 9 + 2tq; kN = 2, a half tile of the wide stages' last group: the first two, c0 the half's first
// centroid), masked to -inf past C and for empty clusters (size[j] <= 0), written to lg (query head gq's
// logits row) and folded into the lane's online (max, sum) nm / ns.
template <int kN>
__device__ __forceinline__ void score_tile_out(const float (&s)[kN], const int (&size)[kN], int c0, int tq, int gq,
                                               int G, int C, float* lg, float& nm, float& ns) {
  static_assert(kN == 2 || kN == 4, "a tile's 4 logits per lane or a half tile's 2");
  int cc[kN];
  float out[kN], tm = -INFINITY;
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    cc[j] = c0 + (j >> 1) * 8 + 2 * tq + (j & 1);
    out[j] = cc[j] < C && size[j] > 0 ? s[j] : -INFINITY;
    tm = fmaxf(tm, out[j]);
  }
  if (gq < G) {
#pragma unroll
    for (int j = 0; j < kN; ++j)
      if (cc[j] < C) lg[cc[j]] = out[j];
    if (tm != -INFINITY) {
      float ts = 0.0f;
#pragma unroll
      for (int j = 0; j < kN; ++j) ts += out[j] == -INFINITY ? 0.0f : __expf(out[j] - tm);
      ms_merge(nm, ns, tm, ts);
    }
  }
}

}  // namespace
}  // namespace retroinfer::cuda::detail
