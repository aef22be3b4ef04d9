// Decode attention kernels: split-K flash decoding over a dense token range or a token list (steady +
// retrieval zone, quest pages), estimation-zone attention from cluster summaries, and the merge of the
// partial softmax states of all splits (include/retroinfer/softmax_state.h).
//
// decode_kernel<D, kIndirect>: one CTA per (split, flat KV head) handles every query head of the GQA
// group, so each K/V row is read once from memory. Each warp streams tiles of kDecodeTile tokens into
// shared memory with cp.async (two stages per warp, K rows padded by 16 bytes so that the per-token row
// reads of the QK step hit distinct banks), computes the tile's logits (lane = token, the two half-warps
// split the head dimension), updates its online softmax state, and accumulates P.V with lane = 4 (D=128)
// or 2 (D=64) output dimensions. The warps' states merge in shared memory at the end; the CTA writes one
// partial state per query head.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdlib>

#include "kernels/common.cuh"
#include "kernels/decode_estimate.cuh"
#include "kernels/decode_math.cuh"
#include "kernels/decode_merge.cuh"
#include "kernels/kernels.h"
#include "retroinfer/softmax_state.h"

namespace retroinfer::cuda::detail {
namespace {

constexpr int kT = kDecodeTile;
static_assert(kT == 16, "the QK mapping uses lane & 15 as the token of the tile");

template <int D, int S>
struct DecodeSmem {
  static constexpr int kRow = D + 8;  // bf16 elements per padded K / V row (16 bytes of padding)
  static constexpr size_t kWarpBytes = size_t{S} * 2 * kT * kRow * 2;  // S stages of K and V tiles
  static constexpr size_t kBytes = kW * kWarpBytes;
};

// Tensor-core flash decoding. Per warp and tile of 16 tokens:
//   S^T[16 x 16 tok] = Q[16 x D] K^T   with mma m16n8k16: A = the query rows (row g: bf16 hi part of the
//                                      scaled query of head g, row g + 8: its lo part, so s = c[g] + c[g+8]
//                                      carries the f32 query to 2^-18), B = K rows via ldmatrix;
//   online softmax on the accumulator fragments (lane: head gq, tokens 2tq, 2tq+1, 8+2tq, 9+2tq);
//   O^T += P V                          A = P straight from the S fragments (rows g / g + 8: hi / lo parts of
//                                      p, again exact to 2^-18), B = V rows via ldmatrix.trans.
// Group sizes up to 8 fill rows 0..7; rows of heads >= G are zero and never written.
// kEst (run 9, DecodeParams::est_ctas > 0): the grid's CTAs past the exact splits run estimate_cta; a kernel
// of its own (decode_est_kernel below), so run 8's kernels are the same code as before.
// kTrigger (RETROINFER_EXACT=split*, decode_exact_kernel): every CTA lets the chained estimation grid launch
// (griddepcontrol.launch_dependents) right after its PDL wait; nothing else changes.
// kIds (run 17, split64i / ri / eri): each warp loads the token ids of kIdsAhead of its tiles in one batch
// (before the first of them, then every kIdsAhead tiles), so a tile's copies wait on no L2 round trip of
// their own. kAfterEst (run 17, split64e / eri): the grid is the programmatic dependent of the estimation
// grid (estimate_first_kernel): no PDL wait before the work (that would wait for the whole estimation grid),
// the selection's outputs (count, list) read through L2, and the grid's last CTA waits at its end. Both keep
// the same tokens in the same tiles and the same math: the same partial states bit for bit.
template <int D, bool kIndirect, int S, bool kEst, bool kTrigger = false, bool kIds = false, bool kAfterEst = false>
__device__ __forceinline__ void decode_body(const DecodeParams& p) {
  constexpr int kRow = DecodeSmem<D, S>::kRow;
  constexpr int kChunks = D / 8;             // 16-byte chunks per row
  constexpr int kLoads = kT * kChunks / 32;  // chunks per lane per tile (K or V)
  constexpr int kKs = D / 16;                // QK k-steps
  constexpr int kNt = D / 8;                 // PV n-tiles (8 dims each)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gq = lane >> 2, tq = lane & 3;
  uint16_t* ks = reinterpret_cast<uint16_t*>(smem_raw + warp * DecodeSmem<D, S>::kWarpBytes);  // [S][kT][kRow]
  uint16_t* vs = ks + S * kT * kRow;                                                           // [S][kT][kRow]

  const int h = blockIdx.y, split = blockIdx.x, G = p.group;
  if constexpr (kEst && kIndirect) {  // run 9: the CTAs past the exact splits estimate (uniform per CTA)
    if (split >= p.num_splits) {
      estimate_cta<D, kEstimateFusedChunk, false>(p, split - p.num_splits, h, smem_raw);
      return;
    }
  }

  // Query A fragments (decode_math.cuh): a[ks] = {hi(row gq, k 2tq..), lo(row gq+8, k 2tq..), hi(k 2tq+8..),
  // lo(k 2tq+8..)}.
  uint32_t qa[kKs][4];
  query_fragments<D>(qa, p.q, h, G, gq, tq, p.scale);
  // PDL (p.pdl): q predates the decode; the token list and count come from the kernels just before.
  // kAfterEst: every estimation CTA passed its wait before it triggered this grid's launch.
  if constexpr (!kAfterEst) grid_dependency_wait();
  // Only after the wait: the chained estimation grid reads the selection's outputs without a wait of its own,
  // relying on every CTA of this grid having passed it (estimate_chained_kernel).
  if constexpr (kTrigger) grid_launch_dependents();
  phase_first(p.phase, h, kSlotExact);
  const uint64_t t_start = p.phase != nullptr ? global_ns() : 0;
  const int64_t count = !kIndirect ? p.num_tokens : kAfterEst ? __ldcg(p.token_count + h) : p.token_count[h];
  // p.balance (run 8): the head's actual count split evenly over the CTAs (whole tiles), not the host's
  // split of the list capacity (at 128K the lists fill ~64% of it: 8 of 12 CTAs did all the work).
  const int64_t split_len =
      p.balance ? (((count + p.num_splits - 1) / p.num_splits + kT - 1) / kT) * kT : p.split_tokens;
  const int64_t begin = int64_t{split} * split_len;
  const int64_t end = begin + split_len < count ? begin + split_len : count;

  const uint16_t* kh = p.k + int64_t{h} * p.kv_stride * D;
  const uint16_t* vh = p.v + int64_t{h} * p.kv_stride * D;
  const int* list = kIndirect ? p.token_list + int64_t{h} * p.list_stride : nullptr;
  const int ntiles = end > begin ? static_cast<int>((end - begin + kT - 1) / kT) : 0;

  // kIds: the ids of the warp's iterations [b * kIdsAhead, (b + 1) * kIdsAhead) (its tiles warp + i * kW):
  // register r, lane l holds token l & 15 of iteration b * kIdsAhead + 2r + (l >> 4) (0 past the split's end).
  constexpr int kIdsAhead = 8;
  int ids[kIds ? kIdsAhead / 2 : 1];
  auto load_ids = [&](int it0) {
#pragma unroll
    for (int r = 0; r < kIdsAhead / 2; ++r) {
      const int64_t q = begin + int64_t{warp + (it0 + 2 * r + (lane >> 4)) * kW} * kT + (lane & 15);
      ids[r] = q < end ? (kAfterEst ? __ldcg(list + q) : list[q]) : 0;
    }
  };
  // Tile t of the warp (t = warp + it * kW) into stage buf.
  auto load_tile = [&](int t, int buf) {
    const int64_t p0 = begin + int64_t{t} * kT;
    const int valid = static_cast<int>(end - p0 < kT ? end - p0 : kT);
    int tok_lane = 0, src_base = 0;  // the lane of row 0's id
    if constexpr (kIndirect && kIds) {
      const int it = (t - warp) / kW;
      if (it % kIdsAhead == 0) load_ids(it);  // warp-uniform: one batch every kIdsAhead tiles
      const int r = (it % kIdsAhead) >> 1;
      tok_lane = ids[0];
#pragma unroll
      for (int k = 1; k < kIdsAhead / 2; ++k)
        if (r == k) tok_lane = ids[k];
      src_base = (it & 1) << 4;
    } else if constexpr (kIndirect) {
      if (lane < valid) tok_lane = kAfterEst ? __ldcg(list + p0 + lane) : list[p0 + lane];
    }
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int c = lane + 32 * i;
      const int row = c / kChunks, col = c % kChunks;
      int64_t tok;
      if constexpr (kIndirect) {
        tok = __shfl_sync(0xffffffffu, tok_lane, src_base + row);
      } else {
        tok = row < valid ? p0 + row : p0;
      }
      const bool ok = row < valid;  // rows past the end are zero-filled (P is 0 there; 0 * NaN would poison)
      cp_async16_zfill(ks + (buf * kT + row) * kRow + col * 8, kh + tok * D + col * 8, ok);
      cp_async16_zfill(vs + (buf * kT + row) * kRow + col * 8, vh + tok * D + col * 8, ok);
    }
    cp_async_commit();
  };

  float m = -INFINITY, l = 0.0f;  // head gq; l is this lane's partial sum
  float o[kNt][4];
#pragma unroll
  for (int j = 0; j < kNt; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

  // ldmatrix row addresses: matrix mi = lane >> 3, row ri = lane & 7.
  const int mi = lane >> 3, ri = lane & 7;
  // Prologue: the warp's first S - 1 tiles, one commit group each (empty groups past the end keep the
  // count uniform, so wait_group<S - 1> after the next commit always means "tile t has landed").
#pragma unroll
  for (int i = 0; i < S - 1; ++i) {
    if (warp + i * kW < ntiles) load_tile(warp + i * kW, i);
    else cp_async_commit();
  }
  for (int it = 0;; ++it) {
    const int t = warp + it * kW;
    if (t >= ntiles) break;
    const int buf = it % S;
    if (t + (S - 1) * kW < ntiles) load_tile(t + (S - 1) * kW, (it + S - 1) % S);
    else cp_async_commit();
    cp_async_wait<S - 1>();
    __syncwarp();
    const int64_t p0 = begin + int64_t{t} * kT;
    const int valid = static_cast<int>(end - p0 < kT ? end - p0 : kT);

    // S^T: n-tile 0 = tokens 0..7, n-tile 1 = tokens 8..15. Matrices: (tok 0-7, k lo), (tok 0-7, k hi),
    // (tok 8-15, k lo), (tok 8-15, k hi).
    float c0[4] = {0, 0, 0, 0}, c1[4] = {0, 0, 0, 0};
    const uint16_t* kb = ks + (buf * kT + (mi >> 1) * 8 + ri) * kRow + (mi & 1) * 8;
#pragma unroll
    for (int k = 0; k < kKs; ++k) {
      uint32_t b[4];
      ldmatrix_x4(b, kb + k * 16);
      mma_bf16_16816(c0, qa[k], b[0], b[1]);
      mma_bf16_16816(c1, qa[k], b[2], b[3]);
    }
    float s[4] = {c0[0] + c0[2], c0[1] + c0[3], c1[0] + c1[2], c1[1] + c1[3]};
    const int tok[4] = {2 * tq, 2 * tq + 1, 8 + 2 * tq, 9 + 2 * tq};
    uint32_t pa[4];  // P's A fragments (decode_math.cuh: masked online softmax, m / l / o updated)
    softmax_tile<kNt>(s, tok, valid, m, l, o, pa);
    // O += P V. Matrices: (tok 0-7, dims d0..), (tok 8-15, dims d0..), (tok 0-7, d0+8..), (tok 8-15, d0+8..).
    const uint16_t* vb = vs + (buf * kT + (mi & 1) * 8 + ri) * kRow + (mi >> 1) * 8;
#pragma unroll
    for (int jj = 0; jj < kNt / 2; ++jj) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, vb + jj * 16);
      mma_bf16_16816(o[2 * jj], pa, b[0], b[1]);
      mma_bf16_16816(o[2 * jj + 1], pa, b[2], b[3]);
    }
    __syncwarp();
  }
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);

  // Merge the warps' states: stage them in shared memory (reusing the tile buffers), then one thread per
  // (query head, dimension) merges over warps in warp order.
  __syncthreads();
  float* stage_o = reinterpret_cast<float*>(smem_raw);                         // [kW, kMaxGroup, D]
  float2* stage_ml = reinterpret_cast<float2*>(stage_o + kW * kMaxGroup * D);  // [kW, kMaxGroup]
  if (gq < G) stage_warp_state<D>(stage_o, stage_ml, o, m, l, warp, gq, tq);
  __syncthreads();
  const int slot = p.split_offset + split;
  merge_warp_states<D, kW>(stage_o, stage_ml, G, int64_t{h} * p.total_splits + slot, p.part_ml, p.part_o);
  if (p.phase != nullptr) {
    __syncthreads();
    phase_last(p.phase, h, kSlotExact + 1);
    phase_span(p.phase, h, kSlotSpan, t_start);
  }
  if (p.merge.counter != nullptr)  // the staging above is read; the merge weights go after it
    merge_if_last(p.merge, p.part_ml, p.part_o, p.total_splits, G, D, h,
                  reinterpret_cast<float*>(stage_ml + kW * kMaxGroup), p.phase);
  // kAfterEst: the grid's last CTA (launch order) waits for the estimation grid, so that this grid completes
  // only after it (see estimate_chained_kernel for why a grid that never waits must not be the last one).
  if constexpr (kAfterEst)
    if (blockIdx.x == gridDim.x - 1 && blockIdx.y == gridDim.y - 1) grid_dependency_wait();
}

template <int D, bool kIndirect, int S>
__global__ void __launch_bounds__(kW * 32) decode_kernel(const DecodeParams p) {
  decode_body<D, kIndirect, S, false>(p);
}
// Run 9's grid: the exact splits plus the estimation CTAs. estimate_cta's accumulators raise the register
// count (ptxas, D=128, two stages: ~166 against ~128), so the bound keeps the CTAs per multiprocessor that
// shared memory allows (3 with two stages: at most 168 registers; 2 with three).
template <int D, int S>
__global__ void __launch_bounds__(kW * 32, S == 2 ? 3 : 2) decode_est_kernel(const DecodeParams p) {
  decode_body<D, true, S, true>(p);
}

// RETROINFER_EXACT=split / split64 (kernels.h ExactVariant): run 9's grid as two grids, so that the
// estimation CTAs no longer carry the exact role's registers (166 at D = 128, 3 CTAs per multiprocessor)
// and shared memory (68 KiB):
//   decode_exact_kernel      the exact splits only (run 8's list kernel plus the trigger below), launched as
//                            run 9's grid was (a programmatic dependent of the selection when p.pdl); each
//                            CTA triggers the launch of the next grid right after its PDL wait;
//   estimate_chained_kernel  the estimation CTAs (estimate_cta, kC clusters each), launched right after it as
//                            a programmatic dependent (p.chain_pdl): its CTAs start once every exact CTA has
//                            started and passed its wait, and fill the multiprocessors beside them (EstSmem:
//                            36.5 KiB at kC = 128; 18.3 KiB and 64 registers at kC = 64, which fits next to 3
//                            exact CTAs of 68 KiB and 128 registers, and 8 to a multiprocessor without them).
// The estimation grid's CTAs must not call griddepcontrol.wait before their work (that would wait for the
// whole exact grid; only its last CTA waits, at its end, see below). Their inputs: the ids (selection) and
// logits (score kernel) were complete and flushed when the first exact CTA passed its wait, which every
// exact CTA did before the trigger; they are read through L2 (__ldcg, est_load) so that no line an earlier
// kernel left in L1 can be stale; the value sums by cp.async.cg (L2). Without
// p.chain_pdl the grids run one after the other (stream order). Both grids' CTAs count into the same fused
// merge (total_splits = num_splits + est_ctas). The math is estimate_cta's and decode_body's: with kC = 128
// the partial states are run 9's bit for bit (so the merged output), with kC = 64 the chunks differ (run 8's
// estimation chunking: within rounding of run 9, decode_path_test_util.h).
template <int D, int S>
__global__ void __launch_bounds__(kW * 32) decode_exact_kernel(const DecodeParams p) {
  decode_body<D, true, S, false, true>(p);
}
// kC = 64 (split64): 4 dims per thread in step 3 (32 accumulators at G = 8) and at most 64 registers, so 8
// CTAs fit on a multiprocessor once the exact CTAs have left (shared memory would allow 11).
// The grid's last CTA (in launch order) waits for the exact grid after its own work: a grid that never
// waited could complete before the grid it depends on, and whatever follows on the stream (or waits on this
// grid as its own PDL prerequisite) would then start while exact CTAs still run, read the merged output
// before the merge, or reuse the token lists and partial states under them. With this one wait, this grid
// completes only after the exact grid has completed and flushed its writes. One CTA slot is held meanwhile.
// kHalves (run 17, split64rh / rih): estimate_cta's half-staged rows (est_half_bytes of shared memory).
template <int D, int kC, bool kHalves = false>
__global__ void __launch_bounds__(kW * 32, kC == kEstimateChunk ? 8 : 1) estimate_chained_kernel(const DecodeParams p) {
  extern __shared__ __align__(16) unsigned char est_smem[];
  estimate_cta<D, kC, true, kC == kEstimateChunk ? 4 : 8, false, kHalves>(p, blockIdx.x, blockIdx.y, est_smem);
  if (blockIdx.x == gridDim.x - 1 && blockIdx.y == gridDim.y - 1) grid_dependency_wait();
}

// Run 17 exact-grid variants (RETROINFER_EXACT=split64r / i / ri / rh / rih / e / eri; kernels.h ExactVariant). The run
// 17 profile of split64 at 128K batch 4: decode_exact_kernel<128, 2> holds 155 registers (3 x 20,480 of the
// 65,536 of a multiprocessor), so no 64-register estimation CTA (8,192) fits beside three exact CTAs and the
// estimation grid ran mostly after the exact grid (~9.6 us of it after the last exact CTA).
//   decode_exact_capped_kernel  (r) the exact kernel under __launch_bounds__(128, 4): at most 128 registers,
//                               3 x 16,384 + 8,192 <= 65,536. Shared memory then admits one estimation CTA:
//                               228 KiB - 3 x (68 KiB + 1 KiB reserved + static) leaves 20.9 KiB, an
//                               estimation CTA takes 18.25 KiB + 0.1 KiB static + 1 KiB (two would need
//                               <= 9.4 KiB each).
//   kIds                        (i) decode_body's ids ahead (8 tiles per warp per batch).
//   estimate_chained_kernel     (h, with r) the estimation CTAs with half-staged rows and G-sized layouts
//   <D, 64, true>               (estimate_cta kHalves, est_half_bytes: 9,472 bytes at D = 128, G = 4), so that
//                               two fit beside three capped exact CTAs: 3 x (69,632 + 48 static + 1,024) +
//                               2 x (9,472 + 112 static + 1,024) = 233,328 <= 233,472 bytes, and 3 x 16,384 +
//                               2 x 8,192 = 65,536 registers (at G <= 4; at G = 8 one fits). The price: a
//                               second round trip per estimation CTA (the second half's rows).
//   estimate_first_kernel +     (e) the estimation grid first: its CTAs wait for the selection (PDL) and then
//   kAfterEst                   trigger; the exact grid, their programmatic dependent (p.chain_pdl), starts
//                               once every estimation CTA has passed its wait and takes the room they leave
//                               (8 estimation CTAs fill a multiprocessor's registers; 960 at 128K batch 4 fit
//                               in one wave). The exact CTAs do not wait (their inputs were complete when the
//                               first estimation CTA passed its wait) and read the count and list through L2;
//                               the exact grid's last CTA waits at its end, so the exact grid, the last on
//                               the stream, completes only after the estimation grid.
// Each variant's partial states are split64's bit for bit: the same chunks, tiles and operations (loads and
// launch bounds differ, not the arithmetic), and the fused merge sums the states in slot order whichever CTA
// counts last.
template <int D, int S, bool kIds, bool kAfterEst>
__global__ void __launch_bounds__(kW * 32) decode_exact_x_kernel(const DecodeParams p) {
  decode_body<D, true, S, false, !kAfterEst, kIds, kAfterEst>(p);
}
template <int D, int S, bool kIds, bool kAfterEst>
__global__ void __launch_bounds__(kW * 32, 4) decode_exact_capped_kernel(const DecodeParams p) {
  decode_body<D, true, S, false, !kAfterEst, kIds, kAfterEst>(p);
}
template <int D>
__global__ void __launch_bounds__(kW * 32, 8) estimate_first_kernel(const DecodeParams p) {
  extern __shared__ __align__(16) unsigned char est_smem[];
  estimate_cta<D, kEstimateChunk, false, 4, true>(p, blockIdx.x, blockIdx.y, est_smem);
}

// Run 17 pre-merge (RETROINFER_EXACT=split64ep / erp; kernels.h EstPremerge). The lead's phase stamps of split64e at
// 128K batch 4 (12 exact + 30 estimation states per head): the estimation grid ends at 55.1 us, the exact grid at
// 70.4, and the fused merge by the last exact CTA of each head over 42 states ends at 76.5. Here the estimation
// states are merged into one while the exact grid still runs, so the final merge reads num_splits + 1 states:
//   estimate_premerge_kernel  estimate_first_kernel's CTA (the same estimate_cta, the same partial state), then
//                             premerge_if_last (decode_merge.cuh): the head's last estimation CTA (per-head
//                             counter EstPremerge::counter, reset by it) merges the head's est_ctas states in
//                             slot order into one unnormalised state and counts into the main merge counter;
//   the exact grid            split64e's / split64eri's kernels without ids (decode_exact_x_kernel /
//                             decode_exact_capped_kernel <D, S, false, true>), unchanged: its CTAs count into the
//                             main counter as before, whose total is now num_splits + 1.
// Partial-state layout (launch_premerged): the host sizes total_splits = num_splits + 1 + est_ctas slots per head;
// decode.cu uses the [H, total, G] (m, l) / [H, total, G, D] buffers as two head-major regions, the final merge's
// states [H, num_splits + 1, G] (exact slots 0 .. num_splits - 1, the pre-merged estimation state in slot
// num_splits), then the estimation chunk states [H, est_ctas, G] (slot j = estimation CTA j). So the exact kernels
// and merge_if_last keep one stride per region and run unchanged. The final merge adds the exact states and then
// the pre-merged one in slot order, whichever CTA counts last: deterministic, bit-identical run to run and across
// graph replays. Against split64 (every state against one global max) the estimation weights are e^{m_s - M_e}
// e^{M_e - M} instead of e^{m_s - M} and the sums are taken in another order: within rounding (the reordering
// bounds of decode_path_test_util.h).
template <int D>
__global__ void __launch_bounds__(kW * 32, 8) estimate_premerge_kernel(const DecodeParams p) {
  extern __shared__ __align__(16) unsigned char est_smem[];
  estimate_cta<D, kEstimateChunk, false, 4, true>(p, blockIdx.x, blockIdx.y, est_smem);  // p.merge.counter: null
  premerge_if_last(p.premerge, p.part_ml, p.part_o, p.total_splits, p.group, D, blockIdx.y,
                   reinterpret_cast<float*>(est_smem), p.phase);
}

// Estimation zone (DESIGN.md §2): CTA = kEstChunk estimated clusters of one flat head, thread = one
// output dimension. Cluster j contributes weight size_j * e^{logit_j} to the denominator and
// e^{logit_j} * VS_j to the numerator (softmax_push with weight = size and value = the value sum); the
// chunk's state is formed relative to its max logit per query head, with the value-sum rows read by
// independent loads (no dependent chain per cluster).
constexpr int kEstChunk = kEstimateChunk;

template <int D>
__global__ void __launch_bounds__(128) estimate_kernel(const EstimateParams p) {
  __shared__ float w[kMaxGroup][kEstChunk];  // logits, then e^{logit - max}
  __shared__ float sz[kEstChunk];
  __shared__ int cid[kEstChunk];
  __shared__ float gm[kMaxGroup], gl[kMaxGroup];
  const int h = blockIdx.y, split = blockIdx.x, G = p.group;
  phase_first(p.phase, h, kSlotEst);
  const int begin = split * kEstChunk;
  const int cnt = p.k_estimation - begin < kEstChunk ? p.k_estimation - begin : kEstChunk;
  const int* ids = p.estimation_ids + int64_t{h} * p.k_estimation + begin;
  for (int i = threadIdx.x; i < kEstChunk; i += blockDim.x) {
    const int c = i < cnt ? ids[i] : -1;  // -1: padding (fewer non-empty clusters than the budget)
    cid[i] = c;
    const int64_t hc = int64_t{h} * p.num_clusters + (c < 0 ? 0 : c);
    sz[i] = c < 0 ? 0.0f : static_cast<float>(p.sizes[hc]);
    for (int g = 0; g < G; ++g)
      w[g][i] = c < 0 ? -INFINITY : p.logits[(int64_t{h} * G + g) * p.num_clusters + (c < 0 ? 0 : c)];
  }
  __syncthreads();
  if (threadIdx.x < G) {
    const int g = threadIdx.x;
    float m = -INFINITY, l = 0.0f;
    for (int i = 0; i < kEstChunk; ++i) m = fmaxf(m, w[g][i]);
    if (m != -INFINITY)
      for (int i = 0; i < kEstChunk; ++i)
        if (w[g][i] != -INFINITY) l += sz[i] * __expf(w[g][i] - m);
    gm[g] = m;
    gl[g] = l;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * kEstChunk; i += blockDim.x) {
    const int g = i / kEstChunk, j = i % kEstChunk;
    w[g][j] = w[g][j] == -INFINITY ? 0.0f : __expf(w[g][j] - gm[g]);
  }
  __syncthreads();
  // Thread = (cluster group cg, 4 dims): value-sum rows read 8 bytes per lane, clusters cg, cg + kGroups,
  // ...; the groups' partial numerators then add in shared memory.
  constexpr int kDl = 4, kLanes = D / kDl, kGroups = 128 / kLanes;
  __shared__ float red[kGroups][kMaxGroup][D];
  const int cg = threadIdx.x / kLanes, dl0 = (threadIdx.x % kLanes) * kDl;
  float o[kMaxGroup][kDl];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
#pragma unroll
    for (int k = 0; k < kDl; ++k) o[g][k] = 0.0f;
  const uint16_t* vsh = p.value_sums_bf16 + int64_t{h} * p.num_clusters * D + dl0;
#pragma unroll 4
  for (int i = cg; i < kEstChunk; i += kGroups) {
    const int c = cid[i];
    float v[kDl] = {0, 0, 0, 0};
    if (c >= 0) {
      const uint2 w2 = *reinterpret_cast<const uint2*>(vsh + int64_t{c} * D);
      const float2 a = bf16x2_to_float2(w2.x), b = bf16x2_to_float2(w2.y);
      v[0] = a.x; v[1] = a.y; v[2] = b.x; v[3] = b.y;
    }
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g)
      if (g < G)
#pragma unroll
        for (int k = 0; k < kDl; ++k) o[g][k] += w[g][i] * v[k];
  }
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
    if (g < G)
#pragma unroll
      for (int k = 0; k < kDl; ++k) red[cg][g][dl0 + k] = o[g][k];
  __syncthreads();
  const int slot = p.split_offset + split;
  for (int e = threadIdx.x; e < G * D; e += blockDim.x) {
    const int g = e / D, dd = e % D;
    float sum = 0.0f;
    for (int q = 0; q < kGroups; ++q) sum += red[q][g][dd];
    const int64_t base = (int64_t{h} * p.total_splits + slot) * G + g;
    p.part_o[base * D + dd] = sum;
    if (dd == 0) p.part_ml[base] = make_float2(gm[g], gl[g]);
  }
  if (p.phase != nullptr) {
    __syncthreads();
    phase_last(p.phase, h, kSlotEst + 1);
  }
  static_assert(sizeof(red) >= kMergeMaxStates * sizeof(float), "the merge weights reuse red");
  if (p.merge.counter != nullptr)  // merge_if_last's first barrier ends the reads of red above
    merge_if_last(p.merge, p.part_ml, p.part_o, p.total_splits, G, D, h, &red[0][0][0], p.phase);
}

// CTA = one query head (flat head h, member g); warp w merges splits w, w + 8, ... (lane = 4 dims per
// 128, loads of 8 splits issued together: up to 64 states in one round of loads, e.g. the 8 exact + 30
// estimation + 1 states of the retro step at 128K batch 4; run 18, before: 4, the same merge order), then the
// 8 warp states merge in shared memory in warp order.
constexpr int kCombineThreads = 256;
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const CombineParams p) {
  constexpr int kWarps = kCombineThreads / 32, kBatch = 8, kMaxDl = 4;
  __shared__ float stage_o[kWarps][128];
  __shared__ float2 stage_ml[kWarps];
  const int h = blockIdx.x, g = blockIdx.y, D = p.head_dim, G = p.group;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, dl = D / 32;
  grid_dependency_wait();  // p.pdl: the partial states come from the grids before (a no-op without PDL)
  SoftmaxScalars st;
  float acc[kMaxDl] = {0, 0, 0, 0};
  for (int s0 = warp; s0 < p.total_splits; s0 += kWarps * kBatch) {
    float2 ml[kBatch];
    float ob[kBatch][kMaxDl];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int sp = s0 + j * kWarps;
      const int64_t base = (int64_t{h} * p.total_splits + sp) * G + g;
      const bool ok = sp < p.total_splits;
      ml[j] = ok ? p.part_ml[base] : make_float2(-INFINITY, 0.0f);
#pragma unroll
      for (int k = 0; k < kMaxDl; ++k) ob[j][k] = ok && k < dl ? p.part_o[base * D + lane * dl + k] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      SoftmaxScalars b;
      b.m = ml[j].x;
      b.l = ml[j].y;
      softmax_merge(st, acc, b, ob[j], kMaxDl);
    }
  }
#pragma unroll
  for (int k = 0; k < kMaxDl; ++k)
    if (k < dl) stage_o[warp][lane * dl + k] = acc[k];
  if (lane == 0) stage_ml[warp] = make_float2(st.m, st.l);
  __syncthreads();
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    SoftmaxScalars m;
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      SoftmaxScalars b;
      b.m = stage_ml[w].x;
      b.l = stage_ml[w].y;
      softmax_merge(m, &o, b, &stage_o[w][d], 1);
    }
    softmax_finish(m, &o, p.out + (int64_t{h} * G + g) * D + d, 1);
  }
  if (p.phase != nullptr) {
    __syncthreads();
    phase_last(p.phase, h, kSlotMerge);
  }
}

template <int D, bool kIndirect, int S, bool kEst>
cudaError_t launch_decode(const DecodeParams& p, cudaStream_t s) {
  constexpr size_t bytes = DecodeSmem<D, S>::kBytes;
  static_assert(DecodeSmem<D, S>::kWarpBytes * kW >=
                    size_t{kW} * kMaxGroup * D * 4 + kW * kMaxGroup * 8 + size_t{kMergeMaxStates} * 4,
                "the warp-merge staging and the fused merge's weights must fit in the tile buffers");
  static_assert(DecodeSmem<D, S>::kBytes >= EstSmem<D, kEstimateFusedChunk>::kBytes,
                "run 9's estimation CTAs keep their chunk's rows, weights and sizes in the tile buffers");
  void (*kernel)(const DecodeParams);
  if constexpr (kEst) kernel = decode_est_kernel<D, S>;
  else kernel = decode_kernel<D, kIndirect, S>;
  static bool attr_set = false;  // once per instantiation (host-side; the layers are single-threaded)
  if (!attr_set) {
    const cudaError_t e = cudaFuncSetAttribute(kernel,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    if (e != cudaSuccess) return e;
    attr_set = true;
  }
  return launch_maybe_pdl(kernel, dim3(p.num_splits + p.est_ctas, p.num_heads), dim3(kW * 32), bytes, s, p.pdl, p);
}

// Sets a kernel's dynamic shared memory limit and asks for the largest shared-memory carveout (so that the
// chained grids' CTAs can share a multiprocessor: CTAs of different carveouts cannot), once per kernel.
template <typename K>
cudaError_t set_split_attributes(K kernel, size_t bytes, bool& done) {
  if (done) return cudaSuccess;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  done = e == cudaSuccess;
  return e;
}

// RETROINFER_EXACT=split*: the exact grid, then the chained estimation grid (decode_exact_kernel).
// kHalves: the dynamic shared memory of the launch is est_half_bytes (<= EstSmem's kBytes, the attribute).
template <int D, int kC, bool kHalves = false>
cudaError_t launch_est_chained(const DecodeParams& p, cudaStream_t s) {
  constexpr size_t most = EstSmem<D, kC>::kBytes;
  const size_t bytes = kHalves ? est_half_bytes<D, kC>(p.group, p.total_splits) : most;
  if (bytes > most) return cudaErrorInvalidValue;  // total * G > kMergeMaxStates: the host checks it before
  static bool attr_set = false;
  const cudaError_t e = set_split_attributes(estimate_chained_kernel<D, kC, kHalves>, most, attr_set);
  if (e != cudaSuccess) return e;
  return launch_maybe_pdl(estimate_chained_kernel<D, kC, kHalves>, dim3(p.est_ctas, p.num_heads), dim3(kW * 32),
                          bytes, s, p.chain_pdl, p);
}
template <int D, int S>
cudaError_t launch_split(const DecodeParams& p, cudaStream_t s) {
  constexpr size_t bytes = DecodeSmem<D, S>::kBytes;
  static_assert(DecodeSmem<D, S>::kWarpBytes * kW >=
                    size_t{kW} * kMaxGroup * D * 4 + kW * kMaxGroup * 8 + size_t{kMergeMaxStates} * 4,
                "the warp-merge staging and the fused merge's weights must fit in the tile buffers");
  static bool attr_set = false;
  cudaError_t e = set_split_attributes(decode_exact_kernel<D, S>, bytes, attr_set);
  if (e != cudaSuccess) return e;
  e = launch_maybe_pdl(decode_exact_kernel<D, S>, dim3(p.num_splits, p.num_heads), dim3(kW * 32), bytes, s, p.pdl, p);
  if (e != cudaSuccess) return e;
  return exact_est_chunk(p.exact_variant) == kEstimateChunk ? launch_est_chained<D, kEstimateChunk>(p, s)
                                                             : launch_est_chained<D, kEstimateFusedChunk>(p, s);
}

// Run 17: the exact grid of a variant (K: decode_exact_x_kernel or decode_exact_capped_kernel), launched as a
// programmatic dependent when pdl.
template <int D, int S, typename K>
cudaError_t launch_exact_grid(K kernel, const DecodeParams& p, cudaStream_t s, bool pdl, bool& attr_set) {
  constexpr size_t bytes = DecodeSmem<D, S>::kBytes;
  const cudaError_t e = set_split_attributes(kernel, bytes, attr_set);
  if (e != cudaSuccess) return e;
  return launch_maybe_pdl(kernel, dim3(p.num_splits, p.num_heads), dim3(kW * 32), bytes, s, pdl, p);
}
template <int D, int S, bool kIds, bool kAfterEst>
cudaError_t launch_exact_variant(const DecodeParams& p, cudaStream_t s, bool pdl) {
  static bool x_set = false, capped_set = false;
  return exact_caps_registers(p.exact_variant)
             ? launch_exact_grid<D, S>(decode_exact_capped_kernel<D, S, kIds, kAfterEst>, p, s, pdl, capped_set)
             : launch_exact_grid<D, S>(decode_exact_x_kernel<D, S, kIds, kAfterEst>, p, s, pdl, x_set);
}
// Whether a decode runs the pre-merge (decode_attention has checked the layout then).
bool premerge_on(const DecodeParams& p) {
  return exact_premerges(p.exact_variant) && p.premerge.counter != nullptr && p.merge.counter != nullptr;
}
// split64ep / erp with the pre-merge: the estimation grid (estimate_premerge_kernel) over the estimation region, then
// the exact grid chained behind it over the final merge's region (see estimate_premerge_kernel for the layout).
template <int D, int S>
cudaError_t launch_premerged(const DecodeParams& p, cudaStream_t s) {
  DecodeParams px = p;  // the exact grid: the final merge's states [H, num_splits + 1, G]
  px.total_splits = p.num_splits + 1;
  DecodeParams pe = p;  // the estimation grid: its chunk states [H, est_ctas, G] after that region
  const int64_t final_states = int64_t{p.num_heads} * px.total_splits * p.group;
  pe.part_ml = p.part_ml + final_states;
  pe.part_o = p.part_o + final_states * D;
  pe.total_splits = p.est_ctas;
  pe.est.split_offset = 0;
  pe.merge.counter = nullptr;  // no final merge of its own: premerge_if_last counts into the main counter
  pe.premerge.part_ml = p.part_ml;
  pe.premerge.part_o = p.part_o;
  pe.premerge.total = px.total_splits;
  pe.premerge.slot = p.num_splits;
  pe.premerge.merge = p.merge;
  constexpr size_t est_bytes = EstSmem<D, kEstimateChunk>::kBytes;
  static bool est_set = false;
  cudaError_t e = set_split_attributes(estimate_premerge_kernel<D>, est_bytes, est_set);
  if (e != cudaSuccess) return e;
  e = launch_maybe_pdl(estimate_premerge_kernel<D>, dim3(p.est_ctas, p.num_heads), dim3(kW * 32), est_bytes, s,
                       pe.pdl, pe);
  if (e != cudaSuccess) return e;
  return launch_exact_variant<D, S, false, true>(px, s, px.chain_pdl);
}

// split64r / i / ri / rh / rih: the exact grid as split64's (a dependent of the selection when p.pdl), then split64's
// estimation grid chained behind it; split64e / eri: the estimation grid first (estimate_first_kernel, a
// dependent of the selection when p.pdl), then the exact grid chained behind it (p.chain_pdl);
// split64ep / erp: launch_premerged when premerge_on, else as split64e / its capped form.
template <int D, int S>
cudaError_t launch_run17(const DecodeParams& p, cudaStream_t s) {
  if (premerge_on(p)) return launch_premerged<D, S>(p, s);
  const bool ids = exact_ids_ahead(p.exact_variant);
  if (!exact_est_first(p.exact_variant)) {
    const cudaError_t e = ids ? launch_exact_variant<D, S, true, false>(p, s, p.pdl)
                              : launch_exact_variant<D, S, false, false>(p, s, p.pdl);
    if (e != cudaSuccess) return e;
    return exact_est_halves(p.exact_variant) ? launch_est_chained<D, kEstimateChunk, true>(p, s)
                                             : launch_est_chained<D, kEstimateChunk>(p, s);
  }
  constexpr size_t est_bytes = EstSmem<D, kEstimateChunk>::kBytes;
  static bool est_set = false;
  cudaError_t e = set_split_attributes(estimate_first_kernel<D>, est_bytes, est_set);
  if (e != cudaSuccess) return e;
  e = launch_maybe_pdl(estimate_first_kernel<D>, dim3(p.est_ctas, p.num_heads), dim3(kW * 32), est_bytes, s, p.pdl, p);
  if (e != cudaSuccess) return e;
  return ids ? launch_exact_variant<D, S, true, true>(p, s, p.chain_pdl)
             : launch_exact_variant<D, S, false, true>(p, s, p.chain_pdl);
}

template <int D, bool kIndirect>
cudaError_t launch_decode_stages(const DecodeParams& p, cudaStream_t s) {
  if constexpr (kIndirect) {
    if (p.est_ctas > 0 && p.exact_variant != kExactV1)
      return p.exact_variant == kExactSplit || p.exact_variant == kExactSplit64
                 ? (decode_stages() == 3 ? launch_split<D, 3>(p, s) : launch_split<D, 2>(p, s))
                 : (decode_stages() == 3 ? launch_run17<D, 3>(p, s) : launch_run17<D, 2>(p, s));
    if (p.est_ctas > 0)
      return decode_stages() == 3 ? launch_decode<D, true, 3, true>(p, s) : launch_decode<D, true, 2, true>(p, s);
  }
  return decode_stages() == 3 ? launch_decode<D, kIndirect, 3, false>(p, s)
                              : launch_decode<D, kIndirect, 2, false>(p, s);
}

// exact_grid_footprint: the attributes of one kernel.
template <typename K>
cudaError_t kernel_footprint(K kernel, size_t dynamic_bytes, int& regs, size_t& smem) {
  cudaFuncAttributes a{};
  const cudaError_t e = cudaFuncGetAttributes(&a, kernel);
  if (e != cudaSuccess) return e;
  regs = a.numRegs;
  smem = dynamic_bytes + a.sharedSizeBytes;
  return cudaSuccess;
}
template <int D, int S>
cudaError_t footprint_of(int v, int group, int total, ExactGridFootprint& f) {
  constexpr size_t xb = DecodeSmem<D, S>::kBytes;
  const bool ids = exact_ids_ahead(v), first = exact_est_first(v);
  auto exact_fp = [&](void (*k)(const DecodeParams)) { return kernel_footprint(k, xb, f.exact_regs, f.exact_smem); };
  cudaError_t e;
  if (v == kExactSplit || v == kExactSplit64)
    e = exact_fp(decode_exact_kernel<D, S>);
  else if (exact_caps_registers(v))
    e = ids ? (first ? exact_fp(decode_exact_capped_kernel<D, S, true, true>)
                     : exact_fp(decode_exact_capped_kernel<D, S, true, false>))
            : (first ? exact_fp(decode_exact_capped_kernel<D, S, false, true>)
                     : exact_fp(decode_exact_capped_kernel<D, S, false, false>));
  else
    e = ids ? (first ? exact_fp(decode_exact_x_kernel<D, S, true, true>)
                     : exact_fp(decode_exact_x_kernel<D, S, true, false>))
            : (first ? exact_fp(decode_exact_x_kernel<D, S, false, true>)
                     : exact_fp(decode_exact_x_kernel<D, S, false, false>));
  if (e != cudaSuccess) return e;
  constexpr size_t eb = EstSmem<D, kEstimateChunk>::kBytes;
  if (v == kExactSplit)
    return kernel_footprint(estimate_chained_kernel<D, kEstimateFusedChunk>, EstSmem<D, kEstimateFusedChunk>::kBytes,
                            f.est_regs, f.est_smem);
  if (exact_premerges(v)) return kernel_footprint(estimate_premerge_kernel<D>, eb, f.est_regs, f.est_smem);
  if (first) return kernel_footprint(estimate_first_kernel<D>, eb, f.est_regs, f.est_smem);
  if (exact_est_halves(v))
    return kernel_footprint(estimate_chained_kernel<D, kEstimateChunk, true>,
                            est_half_bytes<D, kEstimateChunk>(group, total), f.est_regs, f.est_smem);
  return kernel_footprint(estimate_chained_kernel<D, kEstimateChunk>, eb, f.est_regs, f.est_smem);
}

}  // namespace

cudaError_t exact_grid_footprint(int variant, int head_dim, int group, int total_splits, ExactGridFootprint* out) {
  if (out == nullptr || variant <= kExactV1 || variant >= kExactVariants || group < 1 || group > kMaxGroup ||
      total_splits < 1 || int64_t{total_splits} * group > kMergeMaxStates)
    return cudaErrorInvalidValue;
  int dev = 0, regs = 0, smem = 0, reserved = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&regs, cudaDevAttrMaxRegistersPerMultiprocessor, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev);
  if (e != cudaSuccess) return e;
  out->sm_regs = regs;
  out->sm_smem = static_cast<size_t>(smem);
  out->cta_reserved = static_cast<size_t>(reserved);
  const bool three = decode_stages() == 3;
  if (head_dim == 128)
    return three ? footprint_of<128, 3>(variant, group, total_splits, *out)
                 : footprint_of<128, 2>(variant, group, total_splits, *out);
  if (head_dim == 64)
    return three ? footprint_of<64, 3>(variant, group, total_splits, *out)
                 : footprint_of<64, 2>(variant, group, total_splits, *out);
  return cudaErrorInvalidValue;
}

int decode_stages() {
  static const int stages = [] {
    const char* e = std::getenv("RETROINFER_DECODE_STAGES");
    return e != nullptr && e[0] == '3' ? 3 : 2;
  }();
  return stages;
}

int decode_ctas_per_sm() { return decode_stages() == 2 ? 3 : 2; }  // 228 KiB / (kBytes + 1 KiB reserved)

cudaError_t decode_attention(const DecodeParams& p, cudaStream_t s) {
  const bool indirect = p.token_list != nullptr;
  if (p.est_ctas < 0 || (p.est_ctas > 0 && !indirect)) return cudaErrorInvalidValue;  // run 9: list path only
  if (p.exact_variant < 0 || p.exact_variant >= kExactVariants) return cudaErrorInvalidValue;
  const int chunk = exact_est_chunk(p.exact_variant);  // clusters per estimation CTA
  if (p.est_ctas > 0 && (int64_t{p.est_ctas} * chunk < p.est.k_estimation ||
                         int64_t{p.est_ctas - 1} * chunk >= p.est.k_estimation ||
                         p.est.split_offset + p.est_ctas > p.total_splits || p.est.head_dim != p.head_dim))
    return cudaErrorInvalidValue;  // every estimation CTA must own >= 1 cluster and a slot
  if (premerge_on(p) && (p.est_ctas < 1 || p.total_splits != p.num_splits + 1 + p.est_ctas ||
                         p.est.split_offset != p.num_splits + 1 ||
                         int64_t{p.total_splits} * p.group > kMergeMaxStates))
    return cudaErrorInvalidValue;  // the pre-merge's layout (estimate_premerge_kernel)
  if (p.head_dim == 128) return indirect ? launch_decode_stages<128, true>(p, s) : launch_decode_stages<128, false>(p, s);
  if (p.head_dim == 64) return indirect ? launch_decode_stages<64, true>(p, s) : launch_decode_stages<64, false>(p, s);
  return cudaErrorInvalidValue;
}

cudaError_t estimate_attention(const EstimateParams& p, cudaStream_t s) {
  if (p.num_splits * kEstChunk < p.k_estimation) return cudaErrorInvalidValue;  // see kEstimateChunk
  const dim3 grid(p.num_splits, p.num_heads);
  if (p.head_dim == 128) estimate_kernel<128><<<grid, 128, 0, s>>>(p);
  else if (p.head_dim == 64) estimate_kernel<64><<<grid, 128, 0, s>>>(p);
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t combine_states(const CombineParams& p, cudaStream_t s) {
  return launch_maybe_pdl(combine_kernel, dim3(p.num_heads, p.group), dim3(kCombineThreads), 0, s, p.pdl, p);
}

}  // namespace retroinfer::cuda::detail
