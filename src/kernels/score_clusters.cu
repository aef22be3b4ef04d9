// Cluster scores (docs/design.md §2 "Scoring"): logits[h, g, c] = scale * q_g . c_c for every cluster c of head h
// (-inf for empty clusters) on the tensor cores, and per CTA the softmax normaliser partial (max logit, sum
// of e^{logit - max}) of each query head; optionally the selection's scores formed by the same grid
// (ScoreParams::scores). select_kernels.h lists the kernels score_clusters chooses from.
//
// Grid (score_blocks): one wave, kScoreCtasPerSm CTAs of 4 warps per multiprocessor spread over the heads, each
// CTA a contiguous range of 16-centroid tiles, warp w the tiles tile0 + w + 4t (score_common.cuh score_tiles).
// Per tile the decode kernels' QK step with centroids for keys: logits^T = Q C^T with mma m16n8k16 over D / 16
// k-steps, A = the scaled queries split into hi (row g) and lo (row g + 8) parts, so logit = c[g] + c[g + 8]
// carries the f32 query to 2^-18 (bf16) or 2^-22 (f16 for the int8 tiles); each lane then holds query head
// gq's logits of centroids 2tq, 2tq + 1, 8 + 2tq, 9 + 2tq, writes them and folds them into an online (max,
// sum) that becomes the CTA's normaliser partial (score_common.cuh score_tile_out, score_epilogue).
//
// The centroids reach shared memory by tensor-map copies completing on mbarriers; a stage holds a tile's 16
// centroid rows and its 16 cluster sizes (and for int8 its 16 row scales):
//   sizes: where C % 4 == 0 (8188 at 128K) one cp.async.bulk of the tile's rows * 4 bytes by lane 0, counted
//   with the rows; else lanes 0..15 each issue a 4-byte cp.async of one size (zero-filled past C) and
//   cp.async.mbarrier.arrive (pending count +1 now, -1 when the lane's copies land: the phase cannot
//   complete before the sizes have), then __syncwarp;
//   lane 0 arrive.expect_tx(the stage's bytes), then D / 64 tensor-map copies of 64 dims x 16 centroids with
//   128-byte swizzle (StageLayout below), rows past C zero-filled by the copy and counted (evict-first L2
//   policy: the centroids are read once per decode, so the logits written here stay in L2 for the
//   selection and the estimation).
// Each warp owns a 2-stage ring (8 stages per CTA: the shared memory of 6 CTAs per multiprocessor, the
// one-wave grid's residency that the cooperative launch of the formation needs). Tile t of the warp uses
// stage t % 2 for the (t / 2)-th time: the warp waits for parity (t / 2) & 1. A stage is refilled (tile t + 2)
// by the warp that read it, right after reading it (ldmatrix + the sizes, then a proxy fence by every lane and
// __syncwarp: the generic reads are ordered before the async proxy's writes), so no empty barriers and no
// cross-warp waits. Both stages are issued at the start, before the query fragments are formed. The
// formation loads all of a CTA's logits (up to 512) before its grid barrier (score_common.cuh kFormRound).
//
// Why not a producer warp (decode_dense.cu's pattern): a fifth warp at 6 CTAs per multiprocessor caps the
// registers at 64 per thread (65536 / (6 x 160)), below the compute warps' ~80 (the query fragments alone
// are 32 at D = 128); 5 CTAs per multiprocessor would not hold the one-wave grid the cooperative launch
// needs, and the grid (hence the partials' bits) is fixed. With the static tile-to-warp assignment a shared
// ring of 8 stages refilled in tile order is this per-warp ring. Deeper rings do not fit either: the 8
// stages are the shared memory of 6 CTAs per multiprocessor.
//
// Int8 centroids (ScoreParams::centroids_q8): the same grid, partition, ring and epilogue with a tile of 16
// rows of D bytes (one box of D x 16 u8; D = 128: 128-byte swizzle, D = 64: none) and the tile's 16 row
// scales copied with its sizes. Lane (gq, tq) reads bytes [tq D / 4, (tq + 1) D / 4) of centroid rows gq and
// gq + 8 (16-byte loads; with the swizzle the two rows of a quarter warp hit disjoint banks), and k-step kk
// takes its 4-byte word kk: u0, u1 as the B fragment's k 2tq, 2tq + 1 and u2, u3 as 2tq + 8, 2tq + 9,
// converted exactly to f16 (0x64 as the high byte gives 1024 + u; minus 1152 gives u - 128). The query's A
// fragments follow that order (dims tq D / 4 + 4 kk + 0..3), split into f16 hi + lo rows after a per-row
// power of two 2^-e that keeps them below 2^15 (e = 0 unless |q scale| >= 2^15); the tile's logits are the
// f32 dot times the row's scale times 2^e.
//
// Wide stages (kWide, int8 only): the same tiles per warp and math with CTA-wide stages. Stage s holds the
// kScoreWarps warps' tiles of one round g (64 consecutive centroids): one 64-row box of a second tensor map (a
// CTA's last, shorter round: the 16-row boxes of its tiles) and one bulk copy each of the 64 sizes and
// scales, issued by one thread; the warp whose count makes the stage's done_count a multiple of kScoreWarps
// refills it with round g + kS (its lanes' reads fenced to the async proxy first). 3 copies per 64 centroids
// instead of 12: at 128K batch 16 160 against 169 us, batch 4 68.1 against 68.8. (bf16 tiles keep per-warp
// stages: CTA-wide ones are 0.5 us slower at 128K batch 1 and 4 and level at 16.)
//
// The query in shared memory: the head's query is copied by cp.async before the first stages are issued and
// the fragments are formed from there; loaded from global after the issue, its loads would queue behind the
// grid's first burst of centroid copies (the last CTA of 128K batch 4 has its query 6.0 us in, 9.3 from
// global). The same fragments either way, so the same bits: up to 4 query heads for bf16 centroids (6 CTAs
// per multiprocessor must still fit), 8 for int8; more, or a query base not 16-byte aligned, from global.
#include <cuda.h>  // CUtensorMap and its encoder's declaration (the encoder itself: cudaGetDriverEntryPoint)
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/async_copy.cuh"
#include "kernels/common.cuh"
#include "kernels/decode_math.cuh"
#include "kernels/kernels.h"
#include "kernels/tensor_map.h"
#include "kernels/score_common.cuh"
#include "kernels/select_common.cuh"

namespace retroinfer::cuda::detail {

namespace {

// Tile stages per warp (8 per CTA; the wide stages: per CTA). The int8 tiles are half as large, so 4 would fit
// the same shared memory, but 4 are slower than 2 at 128K batch 4 (71.7 against 68.5 us), and so are 4 CTA-wide
// int8 stages.
constexpr int kStages = 2;
// Launch bounds: 6 CTAs of 128 threads per multiprocessor (<= 85 registers), the one-wave grid of
// score_blocks and the cooperative launch's residency.
constexpr int kScoreCtasPerSm = 6;

// The centroids' tensor maps: [H][C][D] bf16, boxes of 64 dims x 16 centroids x 1 head, 128-byte swizzle,
// zero fill past C (int8: [H][C][D] u8, boxes of D x 16 x 1). Wide stages (int8 only): `wide`, a second map
// of the same tensor with boxes of kScoreWarps x 16 = 64 centroids (one CTA stage); `map` (16 centroids) then
// copies the tail stages.
struct ScoreMap {
  CUtensorMap map;
  CUtensorMap wide;
};

// A stage's layout: D / 64 boxes of 16 rows x 128 bytes (box b holds dims 64b..64b+63), the 16-byte chunk c
// of box row r at chunk c ^ (r % 8) (128-byte swizzle; boxes 1024-byte aligned): the 8 rows of an ldmatrix
// matrix (8 consecutive centroids at one logical chunk) sit at 8 different chunks, conflict-free.
// kQ8: one box of 16 rows x D bytes.
template <int D, bool kQ8 = false>
struct StageLayout {
  static constexpr int kBoxBytes = kScoreTile * 128;  // one bf16 box
  // Wide stages (int8): a CTA stage = the kScoreWarps tiles of one tile group, one box of 64 rows x D bytes;
  // tile w of the group at w * kStageBytes (1024-byte aligned, so the 128-byte swizzle's pattern is the
  // narrow one's).
  static constexpr int kStageBytes = kQ8 ? kScoreTile * D : D / 64 * kBoxBytes;
  static constexpr int kAlign = 1024;  // the swizzle's alignment
  static_assert(kStageBytes % kAlign == 0, "stages keep the 1 KiB alignment");
};

// D += A B, m16n8k16, f16 inputs, f32 accumulators.
__device__ __forceinline__ void mma_f16_16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Bytes (sel & 0xf) and (sel >> 8 & 0xf) of w (each u in 0..255) as f16x2 (u - 128), exactly.
template <uint32_t kSel>
__device__ __forceinline__ uint32_t u8x2_to_f16x2(uint32_t w) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(w), "r"(0x64646464u), "n"(kSel));
  const __half2 h = __hsub2(*reinterpret_cast<const __half2*>(&r), __halves2half2(__ushort_as_half(0x6480),
                                                                                   __ushort_as_half(0x6480)));
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
// The int8 path's query A fragments (file comment): k-step kk's k 2tq, 2tq + 1, 2tq + 8, 2tq + 9 are dims
// tq D / 4 + 4 kk + 0..3 of x = q scale 2^-e, rows gq (f16 hi) and gq + 8 (f16 lo = x - hi); returns 2^e.
// The quad's lanes (one query head) call it together. Rows of heads >= G are zero.
template <int D>
__device__ __forceinline__ float query_fragments_q8(uint32_t (&qa)[D / 16][4], const float* q, int h, int G, int gq,
                                                    int tq, float scale) {
  const bool on = gq < G;
  const float* qh = q + (int64_t{h} * G + (on ? gq : 0)) * D + tq * (D / 4);
  // Two passes over the lane's D / 4 query values (the second from L1), so that no array of them stays live
  // next to the fragments.
  auto load = [&](int kk, float (&x)[4]) {
    const float4 u = on ? *reinterpret_cast<const float4*>(qh + 4 * kk) : make_float4(0, 0, 0, 0);
    x[0] = u.x * scale; x[1] = u.y * scale; x[2] = u.z * scale; x[3] = u.w * scale;
  };
  float mx = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    float x[4];
    load(kk, x);
#pragma unroll
    for (int j = 0; j < 4; ++j) mx = fmaxf(mx, fabsf(x[j]));
  }
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  int ex = 0;
  frexpf(mx, &ex);  // mx < 2^ex
  const int e = ex > 15 ? ex - 15 : 0;
  const float down = exp2f(static_cast<float>(-e));
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    float x[4], hi[4], lo[4];
    load(kk, x);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float v = x[j] * down;
      hi[j] = __half2float(__float2half_rn(v));
      lo[j] = v - hi[j];
    }
    qa[kk][0] = pack_f16(hi[0], hi[1]);
    qa[kk][1] = pack_f16(lo[0], lo[1]);
    qa[kk][2] = pack_f16(hi[2], hi[3]);
    qa[kk][3] = pack_f16(lo[2], lo[3]);
  }
  return exp2f(static_cast<float>(e));
}

template <int D, bool kForm, bool kQ8 = false, bool kWide = false>
__device__ __forceinline__ void score_body(const ScoreParams& p, const ScoreMap* maps) {
  static_assert(kQ8 || !kWide, "wide stages: the int8 tiles only");
  using L = StageLayout<D, kQ8>;
  constexpr int kKs = D / 16;
  constexpr int kS = kStages;
  // All stages of the CTA plus the slack to align them (static shared memory is only 16-byte aligned).
  __shared__ __align__(128) unsigned char stage_raw[kScoreWarps * kS * L::kStageBytes + L::kAlign];
  // Per warp (kWide: per CTA, one row of the kScoreWarps tiles of a group) the stages' sizes, scales (kQ8)
  // and barriers.
  constexpr int kOwners = kWide ? 1 : kScoreWarps, kRows = kWide ? kScoreWarps * kScoreTile : kScoreTile;
  __shared__ __align__(16) int ssz[kOwners][kS][kRows];
  __shared__ __align__(16) float sscl[kQ8 ? kOwners : 1][kS][kRows];  // kQ8: row scales
  __shared__ __align__(8) uint64_t full[kOwners][kS];
  __shared__ unsigned done_count[kS];  // kWide: warps done with each stage (monotonic)
  __shared__ float2 red[kScoreWarps][kMaxGroup];
  const CUtensorMap* map = &maps->map;
  const int h = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, G = p.group, C = p.num_clusters;
  const int gq = lane >> 2, tq = lane & 3, mi = lane >> 3, ri = lane & 7;
  phase_first(p.phase, h, 0);
  phase_last(p.phase, h, kSlotScoreStart);  // diagnostics: the launch ramp of the one-wave grid
  grid_launch_dependents();  // a selection launched with PDL may start its CTAs (they wait for this grid)
  // This warp's stages (kWide: the CTA's), L::kAlign aligned.
  unsigned char* stages = stage_raw + ((L::kAlign - (smem_u32(stage_raw) & (L::kAlign - 1))) & (L::kAlign - 1)) +
                          (kWide ? 0 : warp * kS * L::kStageBytes);
  constexpr int kStageStride = kWide ? kScoreWarps * L::kStageBytes : L::kStageBytes;
  const int own = kWide ? 0 : warp;                         // the stage owner's index
  const int tile_at = kWide ? warp * L::kStageBytes : 0;    // this warp's tile within a stage's box
  const int row_at = kWide ? warp * kScoreTile : 0;         // its rows within a stage's sizes / scales
  const int* sz = p.sizes + int64_t{h} * C;
  float* lg = p.logits + (int64_t{h} * G + (gq < G ? gq : 0)) * C;
  const ScoreTiles tiles = score_tiles(C, warp);
  const int ntiles = tiles.ntiles;
  uint64_t* bar = full[own];
  if (kWide ? threadIdx.x == 0 : lane == 0) {
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      mbar_init(&bar[s], 1);
      if constexpr (kWide) done_count[s] = 0;
    }
    mbar_init_fence();
  }
  if constexpr (!kWide) __syncwarp();
  // The centroids are read once per decode (67 MB at 128K batch 4, more than L2): evict-first, so the
  // logits written here stay in L2 for the selection and the estimation.
  const uint64_t pol = l2_evict_first_policy();
  // Fills stage t % kS with the warp's tile t (all lanes call; see the file comment for the protocol).
  // The tile's sizes by one bulk copy with the rows (no L1 path at all) when they are 16-byte aligned for
  // every tile: C % 4 == 0 (tile starts at multiples of 16 clusters, head rows at multiples of 4) and an
  // aligned base; then a tail tile's rows * 4 bytes are a multiple of 16 too. Entries past C stay stale:
  // score_tile_out masks cc >= C before it looks at a size. Else 4-byte cp.async per lane (zero-filled).
  const bool sizes_bulk = (C & 3) == 0 && (reinterpret_cast<uintptr_t>(p.sizes) & 15) == 0 &&
                          (!kQ8 || (reinterpret_cast<uintptr_t>(p.centroid_scale) & 15) == 0);
  const float* scl = kQ8 ? p.centroid_scale + int64_t{h} * C : nullptr;
  auto issue = [&](int t) {
    const int s = t % kS;
    const int c0 = tiles.first(t, warp);
    const int rows = min(kScoreTile, C - c0);  // >= 1: the tile starts below C
    unsigned char* st = stages + s * L::kStageBytes;
    const uint32_t size_bytes = sizes_bulk ? static_cast<uint32_t>(rows) * 4u : 0u;
    if (!sizes_bulk) {
      if (lane < kScoreTile) {
        const bool ok = lane < rows;
        cp_async4_zfill(&ssz[warp][s][lane], sz + (ok ? c0 + lane : 0), ok);
        if constexpr (kQ8) cp_async4_zfill(&sscl[warp][s][lane], scl + (ok ? c0 + lane : 0), ok);
        cp_async_mbar_arrive(&bar[s]);
      }
      __syncwarp();  // the 16 pending-count raises before lane 0's arrive
    }
    if (lane == 0) {  // whole boxes: rows past C are zero-filled and counted
      mbar_arrive_expect_tx(&bar[s], static_cast<uint32_t>(L::kStageBytes) + (kQ8 ? 2 : 1) * size_bytes);
      if (sizes_bulk) bulk_copy_g2s(&ssz[warp][s][0], sz + c0, size_bytes, &bar[s], pol);
      if constexpr (kQ8) {
        if (sizes_bulk) bulk_copy_g2s(&sscl[warp][s][0], scl + c0, size_bytes, &bar[s], pol);
        tma_load_3d(st, map, 0, c0, h, &bar[s], pol);
      } else {
#pragma unroll
        for (int bx = 0; bx < D / 64; ++bx) tma_load_3d(st + bx * L::kBoxBytes, map, 64 * bx, c0, h, &bar[s], pol);
      }
    }
  };
  // kWide (sizes_bulk only, checked at the launch): tile group g (the warps' g-th tiles, rows
  // [(tile0 + kScoreWarps g) 16, + 64) in global memory) into CTA stage g % kS by one thread: the sizes and
  // scales by one bulk copy each, the rows by one box of 64 rows, or for a group of fewer than kScoreWarps
  // tiles (the CTA's last) by the narrow box of each tile.
  const int groups = (tiles.tile1 - tiles.tile0 + kScoreWarps - 1) / kScoreWarps;
  auto issue_group = [&](int g) {
    const int s = g % kS;
    const int c0 = (tiles.tile0 + g * kScoreWarps) * kScoreTile;
    const int nt = min(kScoreWarps, tiles.tile1 - tiles.tile0 - g * kScoreWarps);
    const int rows = min(nt * kScoreTile, C - c0);
    unsigned char* st = stages + s * kStageStride;
    const uint32_t size_bytes = static_cast<uint32_t>(rows) * 4u;
    mbar_arrive_expect_tx(&bar[s], static_cast<uint32_t>(nt * L::kStageBytes) + 2 * size_bytes);
    bulk_copy_g2s(&ssz[0][s][0], sz + c0, size_bytes, &bar[s], pol);
    bulk_copy_g2s(&sscl[0][s][0], scl + c0, size_bytes, &bar[s], pol);
    if (nt == kScoreWarps) {
      tma_load_3d(st, &maps->wide, 0, c0, h, &bar[s], pol);
    } else {
      for (int i = 0; i < nt; ++i) tma_load_3d(st + i * L::kStageBytes, map, 0, c0 + i * kScoreTile, h, &bar[s], pol);
    }
  };
  // The head's query [G][D] f32 copied into shared memory by cp.async before the first stages are issued, the
  // fragments formed from there after the issue (query_fragments / _q8 on the same values: the same fragments;
  // file comment). Up to kQRows query heads (bf16: 4, so that 6 CTAs still fit a multiprocessor's shared
  // memory; int8: kMaxGroup) and a 16-byte aligned base (G D floats per head: every head's rows stay
  // aligned); else from global.
  constexpr int kQRows = kQ8 ? kMaxGroup : 4;
  __shared__ __align__(16) float qs[kQRows * D];
  const bool q_smem = G <= kQRows && (reinterpret_cast<uintptr_t>(p.q) & 15) == 0;  // CTA-uniform
  if (q_smem) {
    const float* qh = p.q + int64_t{h} * G * D;
    for (int i = 4 * static_cast<int>(threadIdx.x); i < G * D; i += 4 * static_cast<int>(blockDim.x))
      cp_async16(qs + i, qh + i);
    cp_async_commit();
  }
  uint32_t qa[kKs][4];  // the query's A fragments (decode_math.cuh, as the decode kernels')
  float qe = 1.0f;      // kQ8: the query row's 2^e
  auto form_query = [&](const float* q, int head) {
    if constexpr (kQ8) qe = query_fragments_q8<D>(qa, q, head, G, gq, tq, p.scale);
    else query_fragments<D>(qa, q, head, G, gq, tq, p.scale);
  };
  if constexpr (kWide) {
    if (threadIdx.x == 0)
      for (int g = 0; g < kS && g < groups; ++g) issue_group(g);
    __syncthreads();  // the barriers' initialisation before any wait
  } else {
#pragma unroll
    for (int t = 0; t < kS; ++t)
      if (t < ntiles) issue(t);
  }
  phase_last(p.phase, h, kSlotScoreIssued);  // diagnostics: the first stages issued
  if (q_smem) {
    cp_async_wait<0>();
    __syncthreads();  // every thread's copies of the query
    form_query(qs, 0);
  } else {
    form_query(p.q, h);
  }
  phase_first(p.phase, h, kSlotScoreQ);  // diagnostics: the query fragments formed
  phase_last(p.phase, h, kSlotScoreQ + 1);
  float nm = -INFINITY, ns = 0.0f;
  // ldmatrix: matrix mi = lane >> 3 (centroid half mi >> 1, k half mi & 1), row ri = lane & 7, i.e. centroid
  // row 8 (mi >> 1) + ri and 16-byte column 2k + (mi & 1) at k-step k. Byte offsets in a stage:
  const int row = (mi >> 1) * 8 + ri;
  auto at = [&](int k) { return (k >> 2) * L::kBoxBytes + row * 128 + ((((2 * k) & 7) | (mi & 1)) ^ ri) * 16; };
  // kWide: a last group of fewer than kScoreWarps tiles is taken in half tiles (8 centroids) by every warp, so
  // that the warps of the CTA end together (at 128K batch 4 each CTA has 22 tiles: whole tiles would give warps
  // 0-1 six and warps 2-3 five, waiting for them at the CTA barrier). The logits are the same bits (the same
  // MMA per row); the normaliser partials sum in another order.
  const int nt_last = kWide ? (tiles.tile1 - tiles.tile0) - (groups - 1) * kScoreWarps : kScoreWarps;
  const bool half_tail = kWide && groups > 0 && nt_last < kScoreWarps;  // CTA-uniform
  const int full_iters = half_tail ? groups - 1 : ntiles;
  for (int t = 0; t < full_iters; ++t) {
    const int s = t % kS;
    mbar_wait(&bar[s], static_cast<uint32_t>(t / kS) & 1u);
    if (t == 0) {  // diagnostics (thread 0 only): when the CTA's first tile landed
      phase_last(p.phase, h, kSlotScore);
      phase_first(p.phase, h, kSlotScore + 4);
    }
    const int c0 = tiles.first(t, warp);
    float a0[4] = {0, 0, 0, 0}, a1[4] = {0, 0, 0, 0};
    const unsigned char* st = stages + s * kStageStride + tile_at;
    float sv[4];
    if constexpr (kQ8) {
      // Rows gq, gq + 8 of the tile, 16-byte chunks c of the lane's D / 64: chunk (tq D / 64 + c), swizzled
      // (D = 128: chunk ^ row % 8) or not (D = 64).
      auto ld = [&](int r, int c) {
        const int ch = tq * (D / 64) + c;
        return *reinterpret_cast<const uint4*>(st + r * D + (D == 128 ? (ch ^ (r & 7)) : ch) * 16);
      };
#pragma unroll
      for (int c = 0; c < D / 64; ++c) {
        const uint4 w0 = ld(gq, c), w1 = ld(gq + 8, c);
        const uint32_t u0[4] = {w0.x, w0.y, w0.z, w0.w}, u1[4] = {w1.x, w1.y, w1.z, w1.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          mma_f16_16816(a0, qa[4 * c + j], u8x2_to_f16x2<0x4140>(u0[j]), u8x2_to_f16x2<0x4342>(u0[j]));
          mma_f16_16816(a1, qa[4 * c + j], u8x2_to_f16x2<0x4140>(u1[j]), u8x2_to_f16x2<0x4342>(u1[j]));
        }
      }
      const float* zc = &sscl[kQ8 ? own : 0][s][row_at];
      sv[0] = (a0[0] + a0[2]) * zc[2 * tq] * qe;
      sv[1] = (a0[1] + a0[3]) * zc[2 * tq + 1] * qe;
      sv[2] = (a1[0] + a1[2]) * zc[8 + 2 * tq] * qe;
      sv[3] = (a1[1] + a1[3]) * zc[9 + 2 * tq] * qe;
    } else {
#pragma unroll
      for (int k = 0; k < kKs; ++k) {
        uint32_t b[4];
        ldmatrix_x4(b, st + at(k));
        mma_bf16_16816(a0, qa[k], b[0], b[1]);
        mma_bf16_16816(a1, qa[k], b[2], b[3]);
      }
      sv[0] = a0[0] + a0[2]; sv[1] = a0[1] + a0[3]; sv[2] = a1[0] + a1[2]; sv[3] = a1[1] + a1[3];
    }
    const int* zs = &ssz[own][s][row_at];
    const int size[4] = {zs[2 * tq], zs[2 * tq + 1], zs[8 + 2 * tq], zs[9 + 2 * tq]};
    if constexpr (kWide) {
      // Group t + kS exists: then group t was whole, read by all kScoreWarps warps, and the last of them to
      // finish (the fourth count of this use of the stage) refills it. Each warp's reads (generic proxy)
      // before the copy's writes: a proxy fence by every lane, the warp barrier, then the count (CTA-scope
      // release / acquire).
      if (t + kS < groups) {
        fence_proxy_async_smem();
        __syncwarp();
        if (lane == 0) {
          __threadfence_block();
          const unsigned old = atomicAdd(&done_count[s], 1u);
          if ((old & (kScoreWarps - 1)) == kScoreWarps - 1) {
            __threadfence_block();
            issue_group(t + kS);
          }
        }
      }
    } else if (t + kS < ntiles) {
      // Every lane's reads of stage s (ldmatrix, the sizes: generic proxy) ordered before the refill's
      // writes (async proxy for the bulk copies): a proxy fence by each reader, then the warp barrier.
      fence_proxy_async_smem();
      __syncwarp();
      issue(t + kS);
    }
    score_tile_out(sv, size, c0, tq, gq, G, C, lg, nm, ns);
  }
  if constexpr (kWide) {
    if (half_tail) {  // the last group (no refill follows): half tile hf = tile hf / 2, rows 8 (hf % 2) + 0..7
      const int t = groups - 1, s = t % kS;
      mbar_wait(&bar[s], static_cast<uint32_t>(t / kS) & 1u);
      if (t == 0) {
        phase_last(p.phase, h, kSlotScore);
        phase_first(p.phase, h, kSlotScore + 4);
      }
      for (int hf = warp; hf < 2 * nt_last; hf += kScoreWarps) {
        const int ti = hf >> 1, r0 = 8 * (hf & 1);
        const unsigned char* st = stages + s * kStageStride + ti * L::kStageBytes;
        float a0[4] = {0, 0, 0, 0};
#pragma unroll
        for (int c = 0; c < D / 64; ++c) {
          const int ch = tq * (D / 64) + c, r = r0 + gq;
          const uint4 w0 = *reinterpret_cast<const uint4*>(st + r * D + (D == 128 ? (ch ^ (r & 7)) : ch) * 16);
          const uint32_t u0[4] = {w0.x, w0.y, w0.z, w0.w};
#pragma unroll
          for (int j = 0; j < 4; ++j)
            mma_f16_16816(a0, qa[4 * c + j], u8x2_to_f16x2<0x4140>(u0[j]), u8x2_to_f16x2<0x4342>(u0[j]));
        }
        const int at = ti * kScoreTile + r0;  // the half's first row in the stage's sizes / scales
        const float* zc = &sscl[0][s][at];
        const int* zs = &ssz[0][s][at];
        const float sv[2] = {(a0[0] + a0[2]) * zc[2 * tq] * qe, (a0[1] + a0[3]) * zc[2 * tq + 1] * qe};
        const int size[2] = {zs[2 * tq], zs[2 * tq + 1]};
        score_tile_out<2>(sv, size, (tiles.tile0 + t * kScoreWarps + ti) * kScoreTile + r0, tq, gq, G, C, lg, nm, ns);
      }
    }
  }
  score_epilogue<kForm>(p, nm, ns, gq, tq, tiles, red);
}

// The wide kernel at D = 64 held to 72 registers (7 CTAs per multiprocessor; the half-tile tail would take it
// to 76 and 6 CTAs).
template <int D, bool kWide>
inline constexpr int kScoreMinCtas = D == 64 && kWide ? 7 : kScoreCtasPerSm;

template <int D, bool kQ8 = false, bool kWide = false>
__global__ void __launch_bounds__(kScoreWarps * 32, kScoreMinCtas<D, kWide>)
    score_kernel(const ScoreParams p, const __grid_constant__ ScoreMap m) {
  score_body<D, false, kQ8, kWide>(p, &m);
}

// The scores formed in the same grid (cooperative launch only: its grid barrier needs every CTA resident).
template <int D, bool kQ8 = false, bool kWide = false>
__global__ void __launch_bounds__(kScoreWarps * 32, kScoreMinCtas<D, kWide>)
    score_form_kernel(const ScoreParams p, const __grid_constant__ ScoreMap m) {
  score_body<D, true, kQ8, kWide>(p, &m);
}

// The centroids' tensor map ([H][C][D] bf16, boxes 64 dims x 16 centroids x 1 head, 128-byte swizzle, zero
// fill past C), encoded by the driver's cuTensorMapEncodeTiled obtained once through the runtime (no link
// against libcuda), as decode_dense.cu's; cached per thread by (centroids, H, C, D), which a layer keeps from
// one decode to the next.
// q8: the int8 centroids' map ([H][C][D] u8, boxes of D x 16 x 1: D = 128 with the 128-byte swizzle, 64
// without).
// rows: the box's centroids (kScoreTile, or kScoreWarps x kScoreTile for the wide map).
cudaError_t encode_score_map(const ScoreParams& p, bool q8, uint32_t rows, CUtensorMap* m) {
  const TensorMapEncode encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t es = q8 ? 1 : 2;  // bytes per element
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(p.head_dim), static_cast<cuuint64_t>(p.num_clusters),
                              static_cast<cuuint64_t>(p.num_heads)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(p.head_dim) * es,
                                 static_cast<cuuint64_t>(p.num_clusters) * p.head_dim * es};  // bytes, dims 1, 2
  const cuuint32_t box[3] = {q8 ? static_cast<cuuint32_t>(p.head_dim) : 64u, rows, 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  void* base = q8 ? static_cast<void*>(const_cast<uint8_t*>(p.centroids_q8))
                  : static_cast<void*>(const_cast<uint16_t*>(p.centroids_bf16));
  const CUresult r = encode(m, q8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, base,
                            dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            q8 && p.head_dim != 128 ? CU_TENSOR_MAP_SWIZZLE_NONE : CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// encode_score_map through a per-thread cache (tensor_map.h TensorMapCache).
// (wide: both maps, the narrow one for the tail groups.)
struct MapKey {
  const void* centroids = nullptr;
  int num_heads = 0, num_clusters = 0, head_dim = 0;
  bool q8 = false, wide = false;
  bool operator==(const MapKey&) const = default;
};
cudaError_t cached_score_map(const ScoreParams& p, bool q8, bool wide, ScoreMap* m) {
  thread_local TensorMapCache<MapKey, ScoreMap> cache;
  const void* c = q8 ? static_cast<const void*>(p.centroids_q8) : static_cast<const void*>(p.centroids_bf16);
  return cache.get(MapKey{c, p.num_heads, p.num_clusters, p.head_dim, q8, wide}, m, [&](ScoreMap* out) {
    const cudaError_t e = encode_score_map(p, q8, kScoreTile, &out->map);
    return e != cudaSuccess || !wide ? e : encode_score_map(p, q8, kScoreWarps * kScoreTile, &out->wide);
  });
}

template <int D, bool kQ8 = false, bool kWide = false>
cudaError_t launch_score(const ScoreParams& p, const ScoreMap& m, dim3 grid, dim3 block, cudaStream_t s) {
  if (p.scores == nullptr) {
    score_kernel<D, kQ8, kWide><<<grid, block, 0, s>>>(p, m);
    return cudaGetLastError();
  }
  return launch_cooperative(score_form_kernel<D, kQ8, kWide>, grid, block, 0, s, p, m);
}

// The CTAs per multiprocessor of the formation that score_clusters may launch at head dimension D: the fewest
// of the bf16, int8 and wide int8 kernels' (the same 6, or 7 for wide at D = 64).
template <int D>
int form_ctas_per_sm() {
  static const int n = [] {
    const int b = max_ctas_per_sm(score_form_kernel<D>, kScoreWarps * 32);
    const int q = max_ctas_per_sm(score_form_kernel<D, true>, kScoreWarps * 32);
    const int w = max_ctas_per_sm(score_form_kernel<D, true, true>, kScoreWarps * 32);
    return std::min(b, std::min(q, w));
  }();
  return n;
}

}  // namespace

int score_blocks(int num_clusters, int head_dim, int num_heads) {
  // One wave: kScoreCtasPerSm CTAs per multiprocessor (34 KiB of shared memory each), spread over the heads,
  // each CTA streaming a contiguous range of tiles (a grid of 256 centroids per CTA takes 1.3 waves at 128K
  // batch 4, the last one mostly idle). At least one tile per warp.
  (void)head_dim;
  const int tiles = (num_clusters + kScoreTile - 1) / kScoreTile;
  const int most = (tiles + kScoreWarps - 1) / kScoreWarps;
  const int want = kScoreCtasPerSm * sm_count() / (num_heads > 0 ? num_heads : 1);
  const int b = want < most ? want : most;
  return b > 0 ? b : 1;
}

bool score_form_fits(int num_clusters, int head_dim, int num_heads) {
  const int per_sm = head_dim == 128 ? form_ctas_per_sm<128>() : (head_dim == 64 ? form_ctas_per_sm<64>() : 0);
  const int64_t ctas = int64_t{score_blocks(num_clusters, head_dim, num_heads)} * num_heads;
  return num_heads > 0 && num_heads <= 65535 && ctas <= int64_t{per_sm} * sm_count();
}

cudaError_t score_clusters(const ScoreParams& p, cudaStream_t s) {
  auto aligned16 = [](const void* x) { return reinterpret_cast<uintptr_t>(x) % 16 == 0; };
  // Bulk copies need 16-byte aligned rows: the base (cudaMalloc gives 256) and 2D-byte rows (D = 64, 128).
  if (!aligned16(p.centroids_bf16) || (p.head_dim != 64 && p.head_dim != 128) ||
      (p.centroids_q8 == nullptr) != (p.centroid_scale == nullptr))
    return cudaErrorInvalidValue;
  if (p.scores != nullptr && !score_form_fits(p.num_clusters, p.head_dim, p.num_heads)) return cudaErrorInvalidValue;
  const dim3 grid(score_blocks(p.num_clusters, p.head_dim, p.num_heads), p.num_heads);
  const dim3 block(kScoreWarps * 32);
  ScoreMap m;
  std::memset(&m, 0, sizeof(m));
  // The int8 copies where given (and 16-byte aligned); else the bf16 centroids below. Their query fragments
  // are read as float4 (a 16-byte aligned query).
  const bool q8 = p.centroids_q8 != nullptr && p.num_clusters > 0 && aligned16(p.centroids_q8);
  if (q8 && !aligned16(p.q)) return cudaErrorInvalidValue;
  // Wide stages copy a stage's sizes and scales by one bulk copy each, so C % 4 == 0 and 16-byte aligned
  // bases; else per-warp stages (the same logits).
  const bool wide = q8 && (p.num_clusters & 3) == 0 && aligned16(p.sizes) && aligned16(p.centroid_scale);
  if (q8 && cached_score_map(p, true, wide, &m) == cudaSuccess) {
    if (wide)
      return p.head_dim == 128 ? launch_score<128, true, true>(p, m, grid, block, s)
                               : launch_score<64, true, true>(p, m, grid, block, s);
    return p.head_dim == 128 ? launch_score<128, true>(p, m, grid, block, s)
                             : launch_score<64, true>(p, m, grid, block, s);
  }
  if (p.num_clusters > 0) {
    // Only int8 copies (a RetroLayer with int8 scoring keeps no bf16 centroids) but no map of them, or no map
    // of the bf16 centroids: no kernel can read them.
    if (p.centroids_bf16 == nullptr || cached_score_map(p, false, false, &m) != cudaSuccess)
      return cudaErrorNotSupported;
  }
  // (No clusters: the grid only writes its empty normaliser partials and never reads the map.)
  return p.head_dim == 128 ? launch_score<128>(p, m, grid, block, s) : launch_score<64>(p, m, grid, block, s);
}

namespace {
// One warp per row: s = max |c| / 127, u = rint(c / s) + 128 (IEEE division, so the host can repeat it bit
// for bit); a zero row: s = 0, u = 128.
__global__ void quantize_centroids_kernel(const uint16_t* c, int64_t rows, int D, uint8_t* q8, float* scale) {
  const int64_t r = int64_t{blockIdx.x} * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const uint16_t* row = c + r * D;
  float mx = 0.0f;
  for (int i = lane; i < D; i += 32) mx = fmaxf(mx, fabsf(__uint_as_float(uint32_t{row[i]} << 16)));
  mx = warp_max(mx);
  const float s = __fdiv_rn(mx, 127.0f);
  for (int i = lane; i < D; i += 32) {
    const float v = __uint_as_float(uint32_t{row[i]} << 16);
    const float x = s > 0.0f ? fminf(127.0f, fmaxf(-127.0f, rintf(__fdiv_rn(v, s)))) : 0.0f;
    q8[r * D + i] = static_cast<uint8_t>(static_cast<int>(x) + 128);
  }
  if (lane == 0) scale[r] = s;
}
}  // namespace

cudaError_t quantize_centroids(const uint16_t* centroids_bf16, int64_t rows, int head_dim, uint8_t* q8, float* scale,
                               cudaStream_t s) {
  if (rows < 0 || head_dim <= 0 || head_dim % 8 != 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  constexpr int kWarps = 8;
  quantize_centroids_kernel<<<static_cast<unsigned>((rows + kWarps - 1) / kWarps), kWarps * 32, 0, s>>>(
      centroids_bf16, rows, head_dim, q8, scale);
  return cudaGetLastError();
}

}  // namespace retroinfer::cuda::detail
