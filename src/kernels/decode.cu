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
//
// A decode with an estimation zone (DecodeParams::est_ctas > 0) runs two grids: the exact splits
// (decode_exact_kernel) and, chained behind them as a programmatic dependent, the estimation CTAs
// (estimate_kernel); combine_states then merges both grids' partial states.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/row_quant.h"
#include "kernels/async_copy.cuh"
#include "kernels/common.cuh"
#include "kernels/decode_estimate.cuh"
#include "kernels/decode_math.cuh"
#include "kernels/kernels.h"
#include "retroinfer/softmax_state.h"

namespace retroinfer::cuda::detail {
namespace {

constexpr int kT = kDecodeTile;
static_assert(kT == 16, "the QK mapping uses lane & 15 as the token of the tile");
// cp.async stages per warp: two keep one tile in flight while the warp computes the other, at 68 KiB per CTA
// (D = 128), so that kDecodeCtasPerSm = 3 CTAs fit on a multiprocessor; three stages (102 KiB, two CTAs)
// gained nothing at batch 4.
constexpr int kStages = 2;

// Two int8 values of w (bytes picked by `sel` into bits 0-7 and 16-23) as a bf16 pair, exactly:
// core/row_quant.h int8_pair_bf16_terms, then one bf16x2 subtraction (a permute, two logic ops and a subtraction
// per two values; a conversion instruction per value would run at a quarter of the rate).
__device__ __forceinline__ uint32_t int8_pair_to_bf16(uint32_t w, uint32_t sel) {
  uint32_t a, b;
  int8_pair_bf16_terms(__byte_perm(w, 0u, sel), a, b);
  const __nv_bfloat162 r =
      __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}
// 16 int8 values (one 16-byte chunk) as 16 bf16 (two 16-byte chunks), exactly (|q| <= 128 has <= 8 bits).
__device__ __forceinline__ void int8_chunk_to_bf16(const uint4& in, uint4& lo, uint4& hi) {
  const uint32_t w[4] = {in.x, in.y, in.z, in.w};
  uint32_t o[8];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    o[2 * j] = int8_pair_to_bf16(w[j], 0x4140u);      // bytes 0, 1
    o[2 * j + 1] = int8_pair_to_bf16(w[j], 0x4342u);  // bytes 2, 3
  }
  lo = make_uint4(o[0], o[1], o[2], o[3]);
  hi = make_uint4(o[4], o[5], o[6], o[7]);
}

template <int D>
struct DecodeSmem {
  static constexpr int kRow = D + 8;  // bf16 elements per padded K / V row (16 bytes of padding)
  static constexpr size_t kWarpBytes = size_t{kStages} * 2 * kT * kRow * 2;  // kStages stages of K and V tiles
  static constexpr size_t kBytes = kW * kWarpBytes;
};
static_assert(size_t{kDecodeCtasPerSm} * (DecodeSmem<128>::kBytes + 1024) <= 228 * 1024,
              "kDecodeCtasPerSm CTAs fit on a multiprocessor by shared memory");

// Tensor-core flash decoding. Per warp and tile of 16 tokens:
//   S^T[16 x 16 tok] = Q[16 x D] K^T   with mma m16n8k16: A = the query rows (row g: bf16 hi part of the
//                                      scaled query of head g, row g + 8: its lo part, so s = c[g] + c[g+8]
//                                      carries the f32 query to 2^-18), B = K rows via ldmatrix;
//   online softmax on the accumulator fragments (lane: head gq, tokens 2tq, 2tq+1, 8+2tq, 9+2tq);
//   O^T += P V                          A = P straight from the S fragments (rows g / g + 8: hi / lo parts of
//                                      p, again exact to 2^-18), B = V rows via ldmatrix.trans.
// Group sizes up to 8 fill rows 0..7; rows of heads >= G are zero and never written.
// kInt8 (DecodeParams::kv8): the rows are int8 with an f32 scale each. A tile's int8 rows and scales land by
// cp.async in an int8 stage (Int8Layout: after one bf16 K and V tile per warp), the warp widens the rows to
// bf16 into that tile (exact: |q| <= 127) and runs the same MMAs; the K scale multiplies each token's logit
// after QK^T, the V scale its probability inside P V only (softmax_tile_weighted), so the result is attention
// over the rows q * s with the bf16 path's 2^-18 carries. The keys are relative to the key calibration
// (KvInt8Rows::k_mean, k_factor): the query fragments carry q * factor, and q . mean, the same for every key
// of the head, is added to each logit with the K scale (one FMA), so the logits are the model's.
// kTrigger (decode_exact_kernel): every CTA lets the chained estimation grid launch
// (griddepcontrol.launch_dependents) right after its PDL wait; nothing else changes.
// A warp's shared memory with int8 rows: one bf16 K tile and one V tile (the widened rows the MMAs read), then
// kStages int8 stages (K rows, V rows, K scales, V scales). Token lists (the indexed layers' exact grid) keep two
// stages, in the bf16 path's footprint, so that the exact and estimation grids still share a multiprocessor; a
// dense range (full attention) takes four: its CTAs run alone (two to a multiprocessor), and three tiles in
// flight per warp instead of one keep HBM busy while the warp widens and multiplies the fourth.
template <int D, bool kIndirect>
struct Int8Layout {
  static constexpr int kStages = kIndirect ? 2 : 4;
  static constexpr int kStageBytes = 2 * kT * D + 2 * kT * 4;
  static constexpr size_t kTileBytes = size_t{2} * kT * DecodeSmem<D>::kRow * 2;  // the bf16 K and V tiles
  static constexpr size_t kWarpBytes = kTileBytes + size_t{kStages} * kStageBytes;
  static constexpr size_t kBytes = kW * kWarpBytes;
  static_assert(kTileBytes % 16 == 0 && kStageBytes % 16 == 0, "16-byte cp.async destinations");
  static_assert(!kIndirect || kWarpBytes <= DecodeSmem<D>::kWarpBytes, "lists: the bf16 path's footprint");
};
// Dynamic shared memory of a decode kernel.
template <int D, bool kIndirect, bool kInt8>
constexpr size_t decode_smem_bytes() {
  if constexpr (kInt8) return Int8Layout<D, kIndirect>::kBytes;
  return DecodeSmem<D>::kBytes;
}

template <int D, bool kIndirect, bool kTrigger, bool kInt8>
__device__ __forceinline__ void decode_body(const DecodeParams& p) {
  constexpr int S = kInt8 ? Int8Layout<D, kIndirect>::kStages : kStages;
  constexpr int kRow = DecodeSmem<D>::kRow;
  constexpr int kChunks = D / 8;             // 16-byte chunks per row
  constexpr int kLoads = kT * kChunks / 32;  // chunks per lane per tile (K or V)
  constexpr int kKs = D / 16;                // QK k-steps
  constexpr int kNt = D / 8;                 // PV n-tiles (8 dims each)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gq = lane >> 2, tq = lane & 3;
  constexpr size_t kWarpBytes = kInt8 ? Int8Layout<D, kIndirect>::kWarpBytes : DecodeSmem<D>::kWarpBytes;
  uint16_t* ks = reinterpret_cast<uint16_t*>(smem_raw + warp * kWarpBytes);  // [S][kT][kRow] (kInt8: [1][kT][kRow])
  uint16_t* vs = ks + (kInt8 ? 1 : S) * kT * kRow;                           // [S][kT][kRow] (kInt8: [1][kT][kRow])

  const int h = blockIdx.y, split = blockIdx.x, G = p.group;

  // Query A fragments (decode_math.cuh): a[ks] = {hi(row gq, k 2tq..), lo(row gq+8, k 2tq..), hi(k 2tq+8..),
  // lo(k 2tq+8..)}.
  uint32_t qa[kKs][4];
  // kInt8: keys relative to the key calibration; every logit of the head gains q . mean (key_bias).
  const float key_bias =
      kInt8 ? query_fragments<D, true>(qa, p.q, h, G, gq, tq, p.scale, p.kv8.k_factor + int64_t{h} * D,
                                       p.kv8.k_mean + int64_t{h} * D)
            : query_fragments<D>(qa, p.q, h, G, gq, tq, p.scale);
  // PDL (p.pdl): q predates the decode; the token list and count come from the kernels just before.
  grid_dependency_wait();
  // Only after the wait: the chained estimation grid reads the selection's outputs without a wait of its own,
  // relying on every CTA of this grid having passed it (estimate_kernel).
  if constexpr (kTrigger) grid_launch_dependents();
  phase_first(p.phase, h, kSlotExact);
  const uint64_t t_start = p.phase != nullptr ? global_ns() : 0;
  const int64_t count = !kIndirect ? p.num_tokens : p.token_count[h];
  // p.balance: the head's actual count split evenly over the CTAs (whole tiles), not the host's split of the
  // list capacity.
  const int64_t split_len =
      p.balance ? (((count + p.num_splits - 1) / p.num_splits + kT - 1) / kT) * kT : p.split_tokens;
  const int64_t begin = int64_t{split} * split_len;
  const int64_t end = begin + split_len < count ? begin + split_len : count;

  const uint16_t* kh = kInt8 ? nullptr : p.k + int64_t{h} * p.kv_stride * D;
  const uint16_t* vh = kInt8 ? nullptr : p.v + int64_t{h} * p.kv_stride * D;
  // kInt8: the head's int8 rows and scales; int8 stage i at q8_base + i * kStageBytes (Int8Layout).
  const int8_t* kh8 = kInt8 ? p.kv8.k + int64_t{h} * p.kv_stride * D : nullptr;
  const int8_t* vh8 = kInt8 ? p.kv8.v + int64_t{h} * p.kv_stride * D : nullptr;
  const float* ksh = kInt8 ? p.kv8.k_scale + int64_t{h} * p.kv_stride : nullptr;
  const float* vsh = kInt8 ? p.kv8.v_scale + int64_t{h} * p.kv_stride : nullptr;
  unsigned char* q8_base = reinterpret_cast<unsigned char*>(vs + kT * kRow);
  constexpr int kQ8StageBytes = Int8Layout<D, kIndirect>::kStageBytes;
  const int* list = kIndirect ? p.token_list + int64_t{h} * p.list_stride : nullptr;
  const int ntiles = end > begin ? static_cast<int>((end - begin + kT - 1) / kT) : 0;

  // Tile t of the warp (t = warp + it * kW) into stage buf.
  auto load_tile = [&](int t, int buf) {
    const int64_t p0 = begin + int64_t{t} * kT;
    const int valid = static_cast<int>(end - p0 < kT ? end - p0 : kT);
    int tok_lane = 0;  // the id of row `lane` (kIndirect), shuffled to the lanes that copy the row
    if constexpr (kIndirect) {
      if (lane < valid) tok_lane = list[p0 + lane];
    }
    auto token = [&](int row) -> int64_t {
      if constexpr (kIndirect) return __shfl_sync(0xffffffffu, tok_lane, row);
      return row < valid ? p0 + row : p0;
    };
    if constexpr (kInt8) {
      constexpr int kChunks8 = D / 16;              // 16-byte chunks per int8 row
      constexpr int kLoads8 = kT * kChunks8 / 32;   // per lane per tile (K or V)
      unsigned char* st8 = q8_base + buf * kQ8StageBytes;
#pragma unroll
      for (int i = 0; i < kLoads8; ++i) {
        const int c = lane + 32 * i;
        const int row = c / kChunks8, col = c % kChunks8;
        const int64_t tok = token(row);
        const bool ok = row < valid;
        cp_async16_zfill(st8 + row * D + col * 16, kh8 + tok * D + col * 16, ok);
        cp_async16_zfill(st8 + kT * D + row * D + col * 16, vh8 + tok * D + col * 16, ok);
      }
      const int row = lane & (kT - 1);
      const int64_t tok = token(row);
      const bool v_half = lane >= kT;
      cp_async4_zfill(st8 + 2 * kT * D + (v_half ? kT * 4 : 0) + row * 4, (v_half ? vsh : ksh) + tok, row < valid);
    } else {
#pragma unroll
      for (int i = 0; i < kLoads; ++i) {
        const int c = lane + 32 * i;
        const int row = c / kChunks, col = c % kChunks;
        const int64_t tok = token(row);
        const bool ok = row < valid;  // rows past the end are zero-filled (P is 0 there; 0 * NaN would poison)
        cp_async16_zfill(ks + (buf * kT + row) * kRow + col * 8, kh + tok * D + col * 8, ok);
        cp_async16_zfill(vs + (buf * kT + row) * kRow + col * 8, vh + tok * D + col * 8, ok);
      }
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
    const int buf = kInt8 ? 0 : it % S;  // kInt8: the rows widened into the one bf16 tile
    if (t + (S - 1) * kW < ntiles) load_tile(t + (S - 1) * kW, (it + S - 1) % S);
    else cp_async_commit();
    cp_async_wait<S - 1>();
    __syncwarp();
    const int64_t p0 = begin + int64_t{t} * kT;
    const int valid = static_cast<int>(end - p0 < kT ? end - p0 : kT);
    float k_scale[4] = {1, 1, 1, 1}, v_scale[4] = {1, 1, 1, 1};
    if constexpr (kInt8) {
      const unsigned char* st8 = q8_base + (it % S) * kQ8StageBytes;
      constexpr int kChunks8 = D / 16;
#pragma unroll
      for (int i = 0; i < 2 * kT * kChunks8 / 32; ++i) {  // K then V rows: 16 int8 -> 16 bf16 per chunk
        const int c = lane + 32 * i;
        const int kv = c / (kT * kChunks8), row = (c / kChunks8) % kT, col = c % kChunks8;
        const uint4 w = *reinterpret_cast<const uint4*>(st8 + (kv * kT + row) * D + col * 16);
        uint4 lo, hi;
        int8_chunk_to_bf16(w, lo, hi);
        uint16_t* dst = (kv == 0 ? ks : vs) + row * kRow + col * 16;
        *reinterpret_cast<uint4*>(dst) = lo;
        *reinterpret_cast<uint4*>(dst + 8) = hi;
      }
      const float* scl = reinterpret_cast<const float*>(st8 + 2 * kT * D);
      const int tk[4] = {2 * tq, 2 * tq + 1, 8 + 2 * tq, 9 + 2 * tq};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        k_scale[j] = scl[tk[j]];
        v_scale[j] = scl[kT + tk[j]];
      }
      __syncwarp();
    }

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
    if constexpr (kInt8) {
#pragma unroll
      for (int j = 0; j < 4; ++j) s[j] = fmaf(s[j], k_scale[j], key_bias);
    }
    const int tok[4] = {2 * tq, 2 * tq + 1, 8 + 2 * tq, 9 + 2 * tq};
    uint32_t pa[4];  // P's A fragments (decode_math.cuh: masked online softmax, m / l / o updated)
    softmax_tile_weighted<kNt>(s, tok, valid, m, l, o, pa, v_scale);
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
}

template <int D, bool kIndirect, bool kInt8>
__global__ void __launch_bounds__(kW * 32) decode_kernel(const DecodeParams p) {
  decode_body<D, kIndirect, false, kInt8>(p);
}

// The two grids of a decode with an estimation zone (DecodeParams::est_ctas > 0):
//   decode_exact_kernel  the exact splits over the token list, a programmatic dependent of the selection when
//                        p.pdl; each CTA triggers the launch of the estimation grid right after its PDL wait.
//                        __launch_bounds__(128, 4) caps it at 128 registers: three exact CTAs (3 x 16,384 of a
//                        multiprocessor's 65,536 registers) then leave room for a 64-register estimation CTA,
//                        which shared memory also admits (228 KiB - 3 x (68 KiB + 1 KiB reserved + static)
//                        leaves 20.9 KiB; an estimation CTA takes 18.25 KiB + 0.1 KiB static + 1 KiB). Without
//                        the cap it holds ~155 registers, and the estimation grid would run mostly after the
//                        exact grid instead of beside it;
//   estimate_kernel      the estimation CTAs (estimate_cta, kEstimateChunk clusters each), launched right after
//                        it as a programmatic dependent (p.chain_pdl): its CTAs start once every exact CTA has
//                        started and passed its wait, and fill the multiprocessors beside them (8 to a
//                        multiprocessor without exact CTAs). Without p.chain_pdl the grids run one after the
//                        other (stream order).
// Both grids write their own slots of the partial states; combine_states merges them.
template <int D, bool kInt8>
__global__ void __launch_bounds__(kW * 32, 4) decode_exact_kernel(const DecodeParams p) {
  decode_body<D, true, true, kInt8>(p);
}
// The grid's last CTA (in launch order) waits for the exact grid after its own work: a grid that never
// waited could complete before the grid it depends on, and whatever follows on the stream (or waits on this
// grid as its own PDL prerequisite) would then start while exact CTAs still run, read their partial states
// before they are written, or reuse the token lists under them. With this one wait, this grid completes only
// after the exact grid has completed and flushed its writes. One CTA slot is held meanwhile.
template <int D>
__global__ void __launch_bounds__(kW * 32, 8) estimate_kernel(const DecodeParams p) {
  extern __shared__ __align__(16) unsigned char est_smem[];
  estimate_cta<D>(p, blockIdx.x, blockIdx.y, est_smem);
  if (blockIdx.x == gridDim.x - 1 && blockIdx.y == gridDim.y - 1) grid_dependency_wait();
}

// CTA = one query head (flat head h, member g); warp w merges splits w, w + 8, ... (lane = 4 dims per
// 128, loads of 8 splits issued together: up to 64 states in one round of loads, e.g. the 8 exact + 30
// estimation states of the retro step at 128K batch 4), then the 8 warp states merge in shared memory in warp
// order.
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

template <int D, bool kIndirect, bool kInt8>
cudaError_t launch_decode(const DecodeParams& p, cudaStream_t s) {
  constexpr size_t bytes = decode_smem_bytes<D, kIndirect, kInt8>();
  static_assert(DecodeSmem<D>::kWarpBytes * kW >= size_t{kW} * kMaxGroup * D * 4 + kW * kMaxGroup * 8,
                "the warp-merge staging must fit in the tile buffers");
  static bool attr_set = false;  // once per instantiation (host-side; the layers are single-threaded)
  if (!attr_set) {
    const cudaError_t e = cudaFuncSetAttribute(decode_kernel<D, kIndirect, kInt8>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    if (e != cudaSuccess) return e;
    attr_set = true;
  }
  return launch_maybe_pdl(decode_kernel<D, kIndirect, kInt8>, dim3(p.num_splits, p.num_heads), dim3(kW * 32), bytes, s,
                          p.pdl, p);
}

// Sets a kernel's dynamic shared memory limit and asks for the largest shared-memory carveout (so that the
// chained grids' CTAs can share a multiprocessor: CTAs of different carveouts cannot), once per kernel.
template <typename K>
cudaError_t set_chained_attributes(K kernel, size_t bytes, bool& done) {
  if (done) return cudaSuccess;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  done = e == cudaSuccess;
  return e;
}

// The exact grid, then the estimation grid chained behind it (decode_exact_kernel, estimate_kernel).
template <int D, bool kInt8>
cudaError_t launch_exact_and_estimate(const DecodeParams& p, cudaStream_t s) {
  constexpr size_t exact_bytes = DecodeSmem<D>::kBytes, est_bytes = EstSmem<D>::kBytes;
  static bool exact_set = false, est_set = false;
  cudaError_t e = set_chained_attributes(decode_exact_kernel<D, kInt8>, exact_bytes, exact_set);
  if (e != cudaSuccess) return e;
  e = launch_maybe_pdl(decode_exact_kernel<D, kInt8>, dim3(p.num_splits, p.num_heads), dim3(kW * 32), exact_bytes, s, p.pdl,
                       p);
  if (e != cudaSuccess) return e;
  e = set_chained_attributes(estimate_kernel<D>, est_bytes, est_set);
  if (e != cudaSuccess) return e;
  return launch_maybe_pdl(estimate_kernel<D>, dim3(p.est_ctas, p.num_heads), dim3(kW * 32), est_bytes, s, p.chain_pdl,
                          p);
}

template <int D, bool kInt8>
cudaError_t launch_decode_kv(const DecodeParams& p, cudaStream_t s) {
  if (p.token_list == nullptr) return launch_decode<D, false, kInt8>(p, s);
  return p.est_ctas > 0 ? launch_exact_and_estimate<D, kInt8>(p, s) : launch_decode<D, true, kInt8>(p, s);
}
template <int D>
cudaError_t launch_decode_dim(const DecodeParams& p, cudaStream_t s) {
  return p.kv8.on() ? launch_decode_kv<D, true>(p, s) : launch_decode_kv<D, false>(p, s);
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
template <int D>
cudaError_t footprint_of(ExactGridFootprint& f) {
  const cudaError_t e = kernel_footprint(decode_exact_kernel<D, false>, DecodeSmem<D>::kBytes, f.exact_regs, f.exact_smem);
  if (e != cudaSuccess) return e;
  return kernel_footprint(estimate_kernel<D>, EstSmem<D>::kBytes, f.est_regs, f.est_smem);
}

}  // namespace

cudaError_t exact_grid_footprint(int head_dim, int group, ExactGridFootprint* out) {
  if (out == nullptr || group < 1 || group > kMaxGroup) return cudaErrorInvalidValue;
  int dev = 0, regs = 0, smem = 0, reserved = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&regs, cudaDevAttrMaxRegistersPerMultiprocessor, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev);
  if (e != cudaSuccess) return e;
  out->sm_regs = regs;
  out->sm_smem = static_cast<size_t>(smem);
  out->cta_reserved = static_cast<size_t>(reserved);
  if (head_dim == 128) return footprint_of<128>(*out);
  if (head_dim == 64) return footprint_of<64>(*out);
  return cudaErrorInvalidValue;
}

cudaError_t decode_attention(const DecodeParams& p, cudaStream_t s) {
  const bool indirect = p.token_list != nullptr;
  if (p.est_ctas < 0 || (p.est_ctas > 0 && !indirect)) return cudaErrorInvalidValue;  // estimation: lists only
  if (p.est_ctas > 0 && (int64_t{p.est_ctas} * kEstimateChunk < p.est.k_estimation ||
                         int64_t{p.est_ctas - 1} * kEstimateChunk >= p.est.k_estimation ||
                         p.est.split_offset + p.est_ctas > p.total_splits))
    return cudaErrorInvalidValue;  // every estimation CTA must own >= 1 cluster and a slot
  if (p.kv8.on() ? (p.kv8.v == nullptr || p.kv8.k_scale == nullptr || p.kv8.v_scale == nullptr ||
                    p.kv8.k_mean == nullptr || p.kv8.k_factor == nullptr || p.k != nullptr)
                 : (p.k == nullptr || p.v == nullptr))
    return cudaErrorInvalidValue;  // one kind of rows, complete
  if (p.head_dim == 128) return launch_decode_dim<128>(p, s);
  if (p.head_dim == 64) return launch_decode_dim<64>(p, s);
  return cudaErrorInvalidValue;
}

cudaError_t combine_states(const CombineParams& p, cudaStream_t s) {
  return launch_maybe_pdl(combine_kernel, dim3(p.num_heads, p.group), dim3(kCombineThreads), 0, s, p.pdl, p);
}

}  // namespace retroinfer::cuda::detail
