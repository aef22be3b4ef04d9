// Cluster scoring and zone selection (DESIGN.md §2 "Scoring"), also used for quest's page selection.
//
// score_kernel: logits[h, g, c] = scale * q_g . c_c from the bf16 centroids on the tensor cores (see
// below); -inf for empty clusters; one wave of CTAs, each a contiguous range of centroid tiles. This is the
// v1 variant (RETROINFER_SCORE=v1, the default); score_clusters dispatches stream / tma to score_stream.cu
// (the same grid, partition and math through score_common.cuh: bit-identical outputs).
// select_kernel: one CTA per flat head. Scores (sum over the group of the per-head softmax over the
// non-empty clusters), then an exact radix select (3 passes of 11-bit digits over the order-preserving
// integer image of the float scores) of the k-th best score for k = k_retrieval and k = k_retrieval +
// k_estimation, both in the same passes; ties at the threshold are taken in ascending id order, so the
// selection equals "sort by (score desc, id asc) and cut", the CPU reference's rule. The ids are written in
// ascending order, and the retrieval items are expanded into the head's exact-token list (steady zone
// first). Run 5's default; since run 6 select_bins.cu's few-barrier kernel is (RETROINFER_SELECT=radix
// restores this one). select_cluster.cu holds the dispatch and the 8-CTA version used past 40K items.
#include <cuda_runtime.h>

#include <cstdlib>

#include "kernels/common.cuh"
#include "kernels/decode_math.cuh"
#include "kernels/kernels.h"
#include "kernels/score_common.cuh"
#include "kernels/select_common.cuh"

namespace retroinfer::cuda::detail {

int sm_count();  // layer_common.h

namespace {

// Logits on the tensor cores, the decode kernel's QK step with centroids for keys: per warp and tile of
// 16 centroids (cp.async double buffer, rows padded by 16 bytes), logits^T = Q C^T with mma m16n8k16,
// A = the scaled queries split into bf16 hi (row g) and lo (row g + 8) parts, so logit = c[g] + c[g+8]
// carries the f32 query to 2^-18; B = centroid rows via ldmatrix. Each lane then holds head gq's logits
// of centroids 2tq, 2tq+1, 8+2tq, 9+2tq, writes them and folds them into an online (max, sum) that
// becomes this CTA's normaliser partial.
//
// kForm (run 10, ScoreParams::scores set; cooperative launch, every CTA resident): after its partial, each
// CTA waits at a grid-wide barrier, merges its head's normaliser partials and forms the selection's scores
// of its own clusters exactly as form_scores_kernel (select_scores.cu) does, so no form_scores grid and no
// kernel boundary follow the score kernel. The body is shared by two kernels (below) whose launch bounds
// differ: run 9's as before, run 10's keeping the 6 CTAs per multiprocessor of the one-wave grid (<= 85
// registers), which the cooperative launch needs.
template <int D, bool kEarly, bool kForm>
__device__ __forceinline__ void score_body(const ScoreParams& p) {
  constexpr int kRow = D + 8, kChunks = D / 8, kLoads = kScoreTile * kChunks / 32, kKs = D / 16;
  __shared__ __align__(16) uint16_t cs[kScoreWarps][2][kScoreTile * kRow];
  __shared__ float2 red[kScoreWarps][kMaxGroup];
  const int h = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, G = p.group, C = p.num_clusters;
  const int gq = lane >> 2, tq = lane & 3, mi = lane >> 3, ri = lane & 7;
  phase_first(p.phase, h, 0);
  grid_launch_dependents();  // a selection launched with PDL may start its CTAs (they wait for this grid)
  const uint16_t* ch = p.centroids_bf16 + int64_t{h} * C * D;
  const int* sz = p.sizes + int64_t{h} * C;
  float* lg = p.logits + (int64_t{h} * G + (gq < G ? gq : 0)) * C;
  // This CTA's tiles [tile0, tile1) of 16 centroids; warp w takes tiles tile0 + w, tile0 + w + 4, ...
  const ScoreTiles tiles = score_tiles(C, warp);
  const int tile0 = tiles.tile0, ntiles = tiles.ntiles;
  // kEarly (run 8): the centroids are streamed once per decode (67 MB at 128K batch 4, more than L2), so
  // their lines are marked evict-first: the logits this kernel writes stay in L2 for the selection and
  // the estimation.
  const uint64_t pol = kEarly ? l2_evict_first_policy() : 0;
  auto load_tile = [&](int t, int buf) {
    const int c0 = (tile0 + t * kScoreWarps + warp) * kScoreTile;
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int e = lane + 32 * i, row = e / kChunks, col = e % kChunks;
      const bool ok = c0 + row < C;
      uint16_t* dst = &cs[warp][buf][row * kRow + col * 8];
      const uint16_t* src = ch + int64_t{ok ? c0 + row : 0} * D + col * 8;
      if constexpr (kEarly) cp_async16_zfill_hint(dst, src, ok, pol);
      else cp_async16_zfill(dst, src, ok);
    }
    cp_async_commit();
  };
  // kEarly (run 8): the cluster sizes of this lane's 4 centroids of tile t, loaded into registers one
  // tile ahead (run 6 reads them after the tile's MMAs, a dependent global load per tile); 0 past C.
  auto load_sizes = [&](int t, int* dst) {
    const int c0 = (tile0 + t * kScoreWarps + warp) * kScoreTile;
    const int cc[4] = {c0 + 2 * tq, c0 + 2 * tq + 1, c0 + 8 + 2 * tq, c0 + 9 + 2 * tq};
#pragma unroll
    for (int j = 0; j < 4; ++j) dst[j] = cc[j] < C ? __ldg(sz + cc[j]) : 0;
  };
  int szc[4] = {0, 0, 0, 0}, szn[4] = {0, 0, 0, 0};
  if constexpr (kEarly) {  // the first tile's copy is in flight while the query fragments are formed
    if (ntiles > 0) {
      load_tile(0, 0);
      load_sizes(0, szc);
    }
  }
  uint32_t qa[kKs][4];  // the query's A fragments (decode_math.cuh, as the decode kernels')
  query_fragments<D>(qa, p.q, h, G, gq, tq, p.scale);
  float nm = -INFINITY, ns = 0.0f;
  if constexpr (!kEarly) {
    if (ntiles > 0) load_tile(0, 0);
  }
  for (int t = 0; t < ntiles; ++t) {
    const int buf = t & 1;
    if (t + 1 < ntiles) {
      load_tile(t + 1, buf ^ 1);
      if constexpr (kEarly) load_sizes(t + 1, szn);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncwarp();
    const int c0 = (tile0 + t * kScoreWarps + warp) * kScoreTile;
    float a0[4] = {0, 0, 0, 0}, a1[4] = {0, 0, 0, 0};
    const uint16_t* kb = &cs[warp][buf][((mi >> 1) * 8 + ri) * kRow + (mi & 1) * 8];
#pragma unroll
    for (int k = 0; k < kKs; ++k) {
      uint32_t b[4];
      ldmatrix_x4(b, kb + k * 16);
      mma_bf16_16816(a0, qa[k], b[0], b[1]);
      mma_bf16_16816(a1, qa[k], b[2], b[3]);
    }
    const float s[4] = {a0[0] + a0[2], a0[1] + a0[3], a1[0] + a1[2], a1[1] + a1[3]};
    const int cc[4] = {c0 + 2 * tq, c0 + 2 * tq + 1, c0 + 8 + 2 * tq, c0 + 9 + 2 * tq};
    int size[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) size[j] = kEarly ? szc[j] : sz[cc[j] < C ? cc[j] : 0];
    if constexpr (kEarly) {
#pragma unroll
      for (int j = 0; j < 4; ++j) szc[j] = szn[j];
    }
    score_tile_out(s, size, c0, tq, gq, G, C, lg, nm, ns);  // the stream kernels' tile epilogue (score_common.cuh)
    __syncwarp();
  }
  // Normaliser partial of head gq: the quad's lanes, then the warps (score_common.cuh, shared with the
  // stream kernel); run 10's formation with kForm.
  score_epilogue<kForm, 2>(p, nm, ns, gq, tq, tiles, red);
}

template <int D, bool kEarly>
__global__ void __launch_bounds__(kScoreWarps * 32) score_kernel(const ScoreParams p) {
  score_body<D, kEarly, false>(p);
}

// Run 10 (cooperative launch only: its grid barrier needs every CTA resident).
template <int D>
__global__ void __launch_bounds__(kScoreWarps * 32, 6) score_form_kernel(const ScoreParams p) {
  score_body<D, true, true>(p);
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
    const int warp = threadIdx.x >> 5;
    if (warp < G) merge_head_normaliser(p.norm_partial + (int64_t{h} * G + warp) * p.norm_parts, p.norm_parts, warp, gmax, ginv);
    __syncthreads();
    const float* lgh = p.logits + int64_t{h} * G * N;
    for (int i0 = threadIdx.x; i0 < N; i0 += 4 * blockDim.x) {
      float lv[4][kMaxGroup];  // the loads of 4 items are issued together
      load_logits<4, false>(lv, lgh, N, G, i0, blockDim.x, N);
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int i = i0 + b * blockDim.x;
        if (i >= N) break;
        const float s = form_head_score(lv[b], G, gmax, ginv);
        gsc[i] = s;
        if (scores_in_smem) sc[i] = s;
      }
    }
    __syncthreads();
  } else if (scores_in_smem) {
    for (int i = threadIdx.x; i < N; i += blockDim.x) sc[i] = gsc[i];
    __syncthreads();
  }
  // Thresholds (the first pass also counts the finite items: k1 = min(k_retrieval, finite), ...).
  const int budget[2] = {p.k_retrieval, p.k_retrieval + p.k_estimation};
  int kk[2], take[2];
  uint32_t thr[2];
  radix_select2(sc, N, budget, sm, kk, thr, take);
  const int k1 = kk[0], k2 = kk[1];
  const uint32_t t1 = thr[0], t2 = thr[1];  // k2 == k1 gives t2 == t1 and take2 == take1
  const int take1 = take[0], take2 = take[1];

  // Ascending-id compaction, kPer consecutive items per thread. An item is in the top k when its key beats
  // the threshold or ties it with fewer than `take` lower-id ties before it.
  constexpr int kPer = 8;  // chunk of 8192 items: the packed 16-bit counters cannot overflow
  int* ret = p.retrieval_ids + int64_t{h} * p.k_retrieval;
  int* est = p.k_estimation > 0 ? p.estimation_ids + int64_t{h} * p.k_estimation : nullptr;
  int ties1 = 0, ties2 = 0, out1 = 0, out2 = 0;
  for (int base = 0; base < N; base += blockDim.x * kPer) {
    const int i0 = base + threadIdx.x * kPer;
    CompactChunk<kPer> ch;
    const int e12 = ch.load(sc, i0, N, k1, k2, t1, t2);
    int tot;
    const int eq_pre = block_exclusive_scan(e12, sm, &tot);
    const int r1 = ties1 + (eq_pre & 0xffff), r2 = ties2 + (eq_pre >> 16);
    ties1 += tot & 0xffff;
    ties2 += tot >> 16;
    bool in1[kPer], ine[kPer];
    const int c12 = ch.mark(k1, k2, t1, t2, take1, take2, true, r1, r2, in1, ine);
    int tot2;
    const int pos = block_exclusive_scan(c12, sm, &tot2);
    int w1 = out1 + (pos & 0xffff), w2 = out2 + (pos >> 16);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (in1[j]) ret[w1++] = i0 + j;
      if (ine[j]) est[w2++] = i0 + j;
    }
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

int score_blocks(int num_clusters, int head_dim, int num_heads) {
  // One wave: kScoreCtasPerSm CTAs per multiprocessor (34 KiB of shared memory each), spread over the
  // heads, each CTA streaming a contiguous range of tiles (run 3: 256 centroids per CTA, 1.3 waves at
  // 128K batch 4, the last one mostly idle). At least one tile per warp.
  // RETROINFER_SCORE_RUN3=1 selects run 3's grid (4 tiles per warp; A/B comparisons).
  (void)head_dim;
  static const bool run3 = [] {
    const char* e = std::getenv("RETROINFER_SCORE_RUN3");
    return e != nullptr && e[0] == '1';
  }();
  constexpr int kScoreCtasPerSm = 6;
  const int tiles = (num_clusters + kScoreTile - 1) / kScoreTile;
  const int most = (tiles + kScoreWarps - 1) / kScoreWarps;
  if (run3) return most > 4 ? (most + 3) / 4 : 1;
  const int want = kScoreCtasPerSm * sm_count() / (num_heads > 0 ? num_heads : 1);
  const int b = want < most ? want : most;
  return b > 0 ? b : 1;
}

namespace {

// Run 10: the cooperative launch of score_form_kernel<D> (its grid barrier needs every CTA resident).
template <int D>
cudaError_t launch_score_form(const ScoreParams& p, dim3 grid, dim3 block, cudaStream_t s) {
  return launch_cooperative(score_form_kernel<D>, grid, block, 0, s, p);
}

template <int D>
int score_form_ctas_per_sm() {
  static const int n = max_ctas_per_sm(score_form_kernel<D>, kScoreWarps * 32);
  return n;
}

}  // namespace

bool score_form_fits(int num_clusters, int head_dim, int num_heads, int variant) {
  const int v = variant == kScoreVariantEnv ? score_variant_from_env() : variant;
  int per_sm = 0;
  if (score_variant_streams(v)) per_sm = score_stream_form_ctas_per_sm(v, head_dim);
  else if (v == kScoreV1)
    per_sm = head_dim == 128 ? score_form_ctas_per_sm<128>() : (head_dim == 64 ? score_form_ctas_per_sm<64>() : 0);
  const int64_t ctas = int64_t{score_blocks(num_clusters, head_dim, num_heads)} * num_heads;
  return num_heads > 0 && num_heads <= 65535 && ctas <= int64_t{per_sm} * sm_count();
}

cudaError_t score_clusters(const ScoreParams& p, cudaStream_t s) {
  const int variant = p.variant == kScoreVariantEnv ? score_variant_from_env() : p.variant;
  if (score_variant_streams(variant)) {
    if (p.scores != nullptr && (!p.early_loads || !score_form_fits(p.num_clusters, p.head_dim, p.num_heads, variant)))
      return cudaErrorInvalidValue;
    return score_clusters_stream(p, variant, s);
  }
  if (variant != kScoreV1) return cudaErrorInvalidValue;
  if (p.centroids_bf16 == nullptr && p.num_clusters > 0) return cudaErrorNotSupported;  // v1 reads bf16 only
  const dim3 grid(score_blocks(p.num_clusters, p.head_dim, p.num_heads), p.num_heads);
  const dim3 block(kScoreWarps * 32);
  if (p.scores != nullptr) {  // run 10: the scores formed in the same (cooperative) grid
    if (!p.early_loads || !score_form_fits(p.num_clusters, p.head_dim, p.num_heads, kScoreV1))
      return cudaErrorInvalidValue;
    if (p.head_dim == 128) return launch_score_form<128>(p, grid, block, s);
    if (p.head_dim == 64) return launch_score_form<64>(p, grid, block, s);
    return cudaErrorInvalidValue;
  }
  if (p.head_dim == 128) {
    if (p.early_loads) score_kernel<128, true><<<grid, block, 0, s>>>(p);
    else score_kernel<128, false><<<grid, block, 0, s>>>(p);
  } else if (p.head_dim == 64) {
    if (p.early_loads) score_kernel<64, true><<<grid, block, 0, s>>>(p);
    else score_kernel<64, false><<<grid, block, 0, s>>>(p);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

// The one-CTA-per-head selection (run 3); select_cluster.cu's select_and_expand replaces it by default.
cudaError_t select_and_expand_single_cta(const SelectParams& p, cudaStream_t s) {
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

