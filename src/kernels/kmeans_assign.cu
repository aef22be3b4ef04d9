// The k-means assignment kernels (kernels.h KMeansAssignVariant): argmax over the centroids of [cb, ce),
// ties to the lowest cluster id. q8 (the default since run 26, at the end of this file) scores int8 copies
// exactly in integers. v1 (run 9's kernel, the reference) and a (the default of runs 15-25) score
// bf16(key - mean) . bf16(centroid) and give the same result bit for bit: every score is the same chain of
// mma.sync m16n8k16 (bf16 operands, f32 accumulation, k-steps 0..D/16-1 in ascending order on the same A
// and B fragments), and the argmax keeps the first strict maximum in ascending cluster order.
//
// Why v1 is slow (Nsight Compute, 128K: ~333 TFLOP/s, sm throughput 51%): in v1's program order the two
// k-steps of one accumulator are adjacent (for k2: for q: for mt: mma(ks), mma(ks + 1)), so a warp waits a
// full mma latency every other MMA unless ptxas reorders; with 4 warps per scheduler that caps the
// tensor pipe. a: every k-step first issues the MMAs of all kNp x kMt independent accumulators, then the
// next k-step (run 15: 421 TFLOP/s in the global pass); one barrier per chunk (v1: two); the column guards
// only in a chunk that crosses the range end. Run 15 also measured variants b-f (deeper rings of larger
// chunks, a max-tree argmax, more n- or m-tiles per step): none was faster than a (docs/cuda-kernels.md).
#include <cuda_runtime.h>

#include <cstdlib>
#include <type_traits>

#include "kernels/async_copy.cuh"
#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace retroinfer::cuda::detail {
namespace {

constexpr int kWarps = 8;                   // warps per CTA
constexpr int kMt = 2;                      // 16-key m-tiles per warp (share each centroid fragment)
constexpr int kKeys = kWarps * 16 * kMt;    // keys per CTA
constexpr int kChunk = 64;                  // centroids staged in shared memory at a time
// Variant a: kNpA n-tiles (8 centroids each) per step, a kStagesA-deep ring of kChunk-centroid chunks in
// dynamic shared memory (rows padded by 16 bytes: conflict-free ldmatrix; 34 KiB at D 128), at least
// kMinBlocksA CTAs per multiprocessor.
constexpr int kNpA = 2, kStagesA = 2, kMinBlocksA = 2;
template <int D>
constexpr int smem_bytes_a() {
  return kStagesA * kChunk * (D + 8) * 2;
}

// The CTA's keys and clusters: the key range ends at te, the CTA's kKeys keys start at k0 (k0 >= te: none,
// the CTA returns at once); cluster range [cb, ce). Segment blockIdx.y's ranges, or all (global).
struct AssignRange {
  int64_t k0, te;
  int cb, ce;
};
__device__ __forceinline__ AssignRange assign_range(const KMeansParams& p, bool global, int keys_per_cta = kKeys) {
  AssignRange r;
  int64_t tb;
  if (global) {
    tb = 0; r.te = p.n_idx; r.cb = 0; r.ce = p.num_clusters;
  } else {
    tb = p.seg_token_begin[blockIdx.y]; r.te = p.seg_token_begin[blockIdx.y + 1];
    r.cb = p.seg_cluster_begin[blockIdx.y]; r.ce = p.seg_cluster_begin[blockIdx.y + 1];
  }
  r.k0 = tb + int64_t{blockIdx.x} * keys_per_cta;
  return r;
}

// The A fragments (PTX m16n8k16 layout) of one 16-key m-tile, all k-steps, for lane tq: rows lo (keys of
// fragment c0 / c1) and hi = lo + 8 (c2 / c3) of the centred keys, zero where not valid (past the range).
template <int D>
__device__ __forceinline__ void load_key_fragments(uint32_t (&a)[D / 16][4], const uint16_t* lo, const uint16_t* hi,
                                                   bool v_lo, bool v_hi, int tq) {
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const int col = ks * 16 + 2 * tq;
    a[ks][0] = v_lo ? *reinterpret_cast<const uint32_t*>(lo + col) : 0u;
    a[ks][1] = v_hi ? *reinterpret_cast<const uint32_t*>(hi + col) : 0u;
    a[ks][2] = v_lo ? *reinterpret_cast<const uint32_t*>(lo + col + 8) : 0u;
    a[ks][3] = v_hi ? *reinterpret_cast<const uint32_t*>(hi + col + 8) : 0u;
  }
}

// The best (score, id) over the 4 lanes of a quad (one row's interleaved columns); ties -> lower id.
__device__ __forceinline__ void quad_argmax(float& best, int& idx) {
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, off);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, off);
    if (ob > best || (ob == best && oi < idx)) { best = ob; idx = oi; }
  }
}

// The end of a warp's assignment (variants a and q8): each row's best over its quad, written by lane tq 0
// as the token's cluster and sort key (h * C + cluster); m-tile mt holds rows mt_row(mt) and mt_row(mt) + 8
// of the CTA's keys from k0 (rows valid ones).
template <int kMt, typename RowOf>
__device__ __forceinline__ void write_assignments(const KMeansParams& p, int h, int64_t k0, int rows, int tq,
                                                  float (&best)[kMt][2], int (&idx)[kMt][2], RowOf mt_row) {
  const int64_t base = int64_t{h} * p.n_idx + k0;
  const uint32_t hbase = static_cast<uint32_t>(h) * static_cast<uint32_t>(p.num_clusters);
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      quad_argmax(best[mt][hf], idx[mt][hf]);
      const int r = mt_row(mt) + 8 * hf;
      if (tq == 0 && r < rows) {
        p.assignment[base + r] = idx[mt][hf];
        p.sort_keys[base + r] = hbase + idx[mt][hf];
      }
    }
}

// Assignment: argmax over the centroids of [cb, ce) of bf16(key - mean) . bf16(centroid), ties to the
// lowest cluster id. Warp = 32 keys (A fragments held in registers); centroid chunks double-buffered in
// shared memory by cp.async (rows padded by 16 bytes so the ldmatrix row reads hit distinct banks).
//
// kNp n-tiles of 8 centroids are multiplied per step with independent accumulators: each accumulator is a
// chain of D/16 dependent mma.sync, so kNp = 2 doubles the MMAs in flight per warp (run 3 used kNp = 1
// with `unroll 2`, whose early exit at the chunk's end kept the two tiles' chains apart). Rows past the
// cluster range are zero-filled in shared memory and masked out of the argmax, so every step is whole.
template <int D, int kNp>
__global__ void __launch_bounds__(kWarps * 32) assign_v1_kernel(const KMeansParams p, bool global) {
  constexpr int kRow = D + 8;
  __shared__ __align__(16) uint16_t cs[2][kChunk * kRow];
  const int h = blockIdx.z, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gq = lane >> 2, tq = lane & 3, mi = lane >> 3, ri = lane & 7;
  const AssignRange rg = assign_range(p, global);
  const int64_t te = rg.te, k0 = rg.k0;
  const int cb = rg.cb, ce = rg.ce;
  if (k0 >= te) return;
  const uint16_t* xh = p.centred + int64_t{h} * p.n_idx * D;
  uint32_t a[kMt][D / 16][4];
  int64_t r_lo[kMt], r_hi[kMt];
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
    r_lo[mt] = k0 + (warp * kMt + mt) * 16 + gq;
    r_hi[mt] = r_lo[mt] + 8;
    load_key_fragments<D>(a[mt], xh + r_lo[mt] * D, xh + r_hi[mt] * D, r_lo[mt] < te, r_hi[mt] < te, tq);
  }
  float best_lo[kMt], best_hi[kMt];
  int idx_lo[kMt], idx_hi[kMt];
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
    best_lo[mt] = best_hi[mt] = -INFINITY;
    idx_lo[mt] = idx_hi[mt] = cb;
  }
  const uint16_t* ch = p.centroids_bf16 + int64_t{h} * p.num_clusters * D;
  auto stage = [&](int cc, int buf) {
    for (int e = threadIdx.x; e < kChunk * (D / 8); e += blockDim.x) {
      const int r = e / (D / 8), col = e % (D / 8);
      const bool ok = cc + r < ce;
      cp_async16_zfill(&cs[buf][r * kRow + col * 8], ch + int64_t{ok ? cc + r : cb} * D + col * 8, ok);
    }
    cp_async_commit();
  };
  stage(cb, 0);
  for (int cc = cb, it = 0; cc < ce; cc += kChunk, ++it) {
    const int buf = it & 1;
    if (cc + kChunk < ce) {
      stage(cc + kChunk, buf ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int nt_end = (ce - cc + 7) / 8 < kChunk / 8 ? (ce - cc + 7) / 8 : kChunk / 8;
    for (int nt0 = 0; nt0 < nt_end; nt0 += kNp) {
      float acc[kNp][kMt][4];
#pragma unroll
      for (int q = 0; q < kNp; ++q)
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) acc[q][mt][0] = acc[q][mt][1] = acc[q][mt][2] = acc[q][mt][3] = 0.0f;
#pragma unroll
      for (int k2 = 0; k2 < D / 32; ++k2) {
#pragma unroll
        for (int q = 0; q < kNp; ++q) {
          uint32_t b[4];  // k-step 2 k2: (b0, b1); k-step 2 k2 + 1: (b2, b3)
          ldmatrix_x4(b, &cs[buf][((nt0 + q) * 8 + ri) * kRow + mi * 8 + k2 * 32]);
#pragma unroll
          for (int mt = 0; mt < kMt; ++mt) {
            mma_bf16_16816(acc[q][mt], a[mt][2 * k2], b[0], b[1]);
            mma_bf16_16816(acc[q][mt], a[mt][2 * k2 + 1], b[2], b[3]);
          }
        }
      }
#pragma unroll
      for (int q = 0; q < kNp; ++q) {  // ascending columns: ties keep the lower id
        const int col0 = cc + (nt0 + q) * 8 + 2 * tq;
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) {
          if (col0 < ce) {
            if (acc[q][mt][0] > best_lo[mt]) { best_lo[mt] = acc[q][mt][0]; idx_lo[mt] = col0; }
            if (acc[q][mt][2] > best_hi[mt]) { best_hi[mt] = acc[q][mt][2]; idx_hi[mt] = col0; }
          }
          if (col0 + 1 < ce) {
            if (acc[q][mt][1] > best_lo[mt]) { best_lo[mt] = acc[q][mt][1]; idx_lo[mt] = col0 + 1; }
            if (acc[q][mt][3] > best_hi[mt]) { best_hi[mt] = acc[q][mt][3]; idx_hi[mt] = col0 + 1; }
          }
        }
      }
    }
    __syncthreads();  // the next iteration's stage() overwrites this buffer
  }
  const int64_t base = int64_t{h} * p.n_idx;
  const uint32_t hbase = static_cast<uint32_t>(h) * static_cast<uint32_t>(p.num_clusters);
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
    quad_argmax(best_lo[mt], idx_lo[mt]);  // the two rows' reductions are independent
    quad_argmax(best_hi[mt], idx_hi[mt]);
    if (tq == 0) {
      if (r_lo[mt] < te) {
        p.assignment[base + r_lo[mt]] = idx_lo[mt];
        p.sort_keys[base + r_lo[mt]] = hbase + idx_lo[mt];
      }
      if (r_hi[mt] < te) {
        p.assignment[base + r_hi[mt]] = idx_hi[mt];
        p.sort_keys[base + r_hi[mt]] = hbase + idx_hi[mt];
      }
    }
  }
}


// One step: kNp n-tiles (8 centroids each) from shared row `nt0 * 8` of `cbuf` against the warp's
// kMt m-tiles. acc is zeroed here.
template <int D, int kNp, int kMt>
__device__ __forceinline__ void step_mma(float (&acc)[kNp][kMt][4], const uint32_t (&a)[kMt][D / 16][4],
                                         const uint16_t* cbuf, int nt0, int mi, int ri) {
  constexpr int kRow = D + 8;
#pragma unroll
  for (int q = 0; q < kNp; ++q)
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) acc[q][mt][0] = acc[q][mt][1] = acc[q][mt][2] = acc[q][mt][3] = 0.0f;
#pragma unroll
  for (int k2 = 0; k2 < D / 32; ++k2) {
    uint32_t b[kNp][4];  // k-step 2 k2: (b0, b1); k-step 2 k2 + 1: (b2, b3)
#pragma unroll
    for (int q = 0; q < kNp; ++q) ldmatrix_x4(b[q], cbuf + ((nt0 + q) * 8 + ri) * kRow + mi * 8 + k2 * 32);
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int q = 0; q < kNp; ++q)
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt)
          mma_bf16_16816(acc[q][mt], a[mt][2 * k2 + half], b[q][2 * half], b[q][2 * half + 1]);
  }
}

// Variant a's epilogue: every score compared in ascending column order (strict >: the first maximum stays),
// as v1's.
template <int kNp, int kMt, bool kFull>
__device__ __forceinline__ void argmax_plain(const float (&acc)[kNp][kMt][4], int col_base, int ce,
                                             float (&best)[kMt][2], int (&idx)[kMt][2]) {
#pragma unroll
  for (int q = 0; q < kNp; ++q) {
    const int col0 = col_base + q * 8;
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {  // hf 0: row gq (c0, c1); 1: row gq + 8 (c2, c3)
        if (kFull || col0 < ce) {
          if (acc[q][mt][2 * hf] > best[mt][hf]) { best[mt][hf] = acc[q][mt][2 * hf]; idx[mt][hf] = col0; }
        }
        if (kFull || col0 + 1 < ce) {
          if (acc[q][mt][2 * hf + 1] > best[mt][hf]) { best[mt][hf] = acc[q][mt][2 * hf + 1]; idx[mt][hf] = col0 + 1; }
        }
      }
  }
}

// Variant a: the assignment of kKeys keys (CTA) of flat head blockIdx.z against the clusters [cb, ce) of its
// segment (blockIdx.y) or of all clusters (global). Centroid chunks of kChunk rows in a kStages-deep ring
// of dynamic shared memory; rows past ce are zero-filled and masked.
template <int D>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocksA) assign_a_kernel(const KMeansParams p, bool global) {
  constexpr int kNp = kNpA, kStages = kStagesA;
  static_assert(kChunk % (8 * kNp) == 0, "a chunk is whole steps");
  static_assert(kStages >= 2, "the ring needs a buffer being filled and one being read");
  constexpr int kRow = D + 8;
  extern __shared__ __align__(16) uint16_t cs[];  // [kStages][kChunk][kRow] bf16
  const int h = blockIdx.z, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gq = lane >> 2, tq = lane & 3, mi = lane >> 3, ri = lane & 7;
  const AssignRange rg = assign_range(p, global);
  const int64_t te = rg.te, k0 = rg.k0;
  const int cb = rg.cb, ce = rg.ce;
  if (k0 >= te) return;  // whole CTA: before any barrier
  uint32_t a[kMt][D / 16][4];  // A fragments (PTX m16n8k16 layout) of the warp's kMt m-tiles, all k-steps
  const uint16_t* ch = p.centroids_bf16 + int64_t{h} * p.num_clusters * D;
  auto stage = [&](int cc, int buf) {
    uint16_t* dst = cs + buf * (kChunk * kRow);
#pragma unroll
    for (int e0 = 0; e0 < kChunk * (D / 8); e0 += kWarps * 32) {
      const int e = e0 + threadIdx.x;
      const int r = e / (D / 8), col = e % (D / 8);
      const bool ok = cc + r < ce;
      cp_async16_zfill(dst + r * kRow + col * 8, ch + int64_t{ok ? cc + r : cb} * D + col * 8, ok);
    }
  };
  static_assert((kChunk * (D / 8)) % (kWarps * 32) == 0, "every thread copies the same count");
  // Prologue: chunks 0 .. kStages - 2 in flight (one commit group each, empty past the range) while the A
  // fragments load.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (cb + s * kChunk < ce) stage(cb + s * kChunk, s);
    cp_async_commit();
  }
  // Rows of the warp's m-tiles relative to k0 (int: at most kKeys; fewer 64-bit registers live across
  // the loop): m-tile mt holds rows mt_row(mt) (fragment c0/c1) and mt_row(mt) + 8 (c2/c3).
  const int rows = te - k0 < kKeys ? static_cast<int>(te - k0) : kKeys;
  auto mt_row = [&](int mt) { return (warp * kMt + mt) * 16 + gq; };
  {
    const uint16_t* xk = p.centred + (int64_t{h} * p.n_idx + k0) * D;
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
      const int r_lo = mt_row(mt), r_hi = r_lo + 8;
      load_key_fragments<D>(a[mt], xk + r_lo * D, xk + r_hi * D, r_lo < rows, r_hi < rows, tq);
    }
  }
  float best[kMt][2];
  int idx[kMt][2];
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
    best[mt][0] = best[mt][1] = -INFINITY;
    idx[mt][0] = idx[mt][1] = cb;
  }
  auto steps = [&](const uint16_t* cbuf, int cc, auto full_tag) {
    constexpr bool kFull = decltype(full_tag)::value;
    // A chunk crossing ce: only its steps holding a valid column (the rest are zero rows).
    const int nt_end = kFull ? kChunk / 8 : (ce - cc + 7) / 8;
#pragma unroll 1
    for (int nt0 = 0; nt0 < nt_end; nt0 += kNp) {
      float acc[kNp][kMt][4];
      step_mma<D, kNp, kMt>(acc, a, cbuf, nt0, mi, ri);
      const int col_base = cc + nt0 * 8 + 2 * tq;
      argmax_plain<kNp, kMt, kFull>(acc, col_base, ce, best, idx);
    }
  };
#pragma unroll 1
  for (int cc = cb, it = 0; cc < ce; cc += kChunk, ++it) {
    // Groups committed so far: kStages - 1 + it; chunk `it` is group `it`: at most kStages - 2 pending.
    cp_async_wait<kStages - 2>();
    __syncthreads();  // chunk `it` visible to all; every warp is done with chunk it - 1 (its buffer is free)
    const int nxt = cc + (kStages - 1) * kChunk;
    if (nxt < ce) stage(nxt, (it + kStages - 1) % kStages);
    cp_async_commit();
    const uint16_t* cbuf = cs + (it % kStages) * (kChunk * kRow);
    if (cc + kChunk <= ce) steps(cbuf, cc, std::true_type{});
    else steps(cbuf, cc, std::false_type{});
  }
  write_assignments<kMt>(p, h, k0, rows, tq, best, idx, mt_row);
}

// ---- Variant q8: int8 operands (kernels.h kAssignQ8). Score of key x against centroid c:
// f32(sum_d xq_d cq_d) * scale_c, the integer dot exact in int32 (|dot| <= D * 127^2 < 2^22). The
// accumulators start at the bit pattern of 1.5 * 2^23 (kQ8Bias), so that after the MMAs
// __int_as_float(acc) is exactly 1.5 * 2^23 + dot: f32(dot) costs one FADD instead of an I2F (a quarter-rate
// conversion on sm_90). Ties keep the lowest cluster id, as a. Same structure as a (centroid chunks of
// kChunk rows in a ring of kStagesQ cp.async stages with their scales, A fragments in registers); the
// MMAs issue every independent accumulator of a k-step before the next k-step.
//
// Nsight Compute (run 26, 32K segment pass, the 2 x 2 tile): 53% issue slots, ALU the busiest pipe (44%:
// the argmax's compare and two selects per score), stalls mostly short-scoreboard (the ldmatrix / scale
// loads), 16 warps per SM (registers). 408-470 TOPS against a's 315-380 TFLOP/s: the argmax, not the
// tensor pipe, bounds it (3 ALU operations per (key, centroid) pair: ~0.35 ms of ALU work alone for the
// 1.74e9 pairs of a 32K layer's 9 + 1 iterations on 132 SMs).
constexpr int kQ8Bias = 0x4B400000;
constexpr float kQ8BiasF = 12582912.0f;  // 1.5 * 2^23
constexpr int kStagesQ = 3;
template <int D>
constexpr int smem_bytes_q8() {
  return kStagesQ * kChunk * (D + 16) + kStagesQ * kChunk * 4;  // int8 rows padded by 16 bytes, then scales
}

// D += A B, m16n8k32, s8 inputs, s32 accumulators (PTX fragment layouts).
__device__ __forceinline__ void mma_s8_16832(int* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// kMtQ 16-key m-tiles and kNpQ 8-centroid n-tiles per warp step, at least kMinBlocksQ CTAs per SM.
template <int D, int kMtQ, int kNpQ, int kMinBlocksQ>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocksQ) assign_q8_kernel(const KMeansParams p, bool global) {
  constexpr int kKeysQ = kWarps * 16 * kMtQ;
  constexpr int kRow = D + 16;  // bytes
  constexpr int kKs = D / 32;   // k-steps
  extern __shared__ __align__(16) uint8_t smq[];  // [kStages][kChunk][kRow] int8, then [kStages][kChunk] f32
  float* ssc = reinterpret_cast<float*>(smq + kStagesQ * kChunk * kRow);
  const int h = blockIdx.z, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gq = lane >> 2, tq = lane & 3, mi = lane >> 3, ri = lane & 7;
  const AssignRange rg = assign_range(p, global, kKeysQ);
  const int64_t te = rg.te, k0 = rg.k0;
  const int cb = rg.cb, ce = rg.ce;
  if (k0 >= te) return;  // whole CTA: before any barrier
  const int8_t* ch = p.centroids_q8 + int64_t{h} * p.num_clusters * D;
  const float* sh = p.centroid_scale + int64_t{h} * p.num_clusters;
  constexpr int kCopies = kChunk * (D / 16);  // 16-byte copies per chunk
  auto stage = [&](int cc, int buf) {
    uint8_t* dst = smq + buf * (kChunk * kRow);
    for (int e = threadIdx.x; e < kCopies; e += kWarps * 32) {
      const int r = e / (D / 16), col = e % (D / 16);
      const bool ok = cc + r < ce;
      cp_async16_zfill(dst + r * kRow + col * 16, ch + int64_t{ok ? cc + r : cb} * D + col * 16, ok);
    }
    if (threadIdx.x < kChunk) {  // the chunk's scales (zeros past ce); 4-byte copies: cc may be unaligned
      const int r = threadIdx.x;
      const bool ok = cc + r < ce;
      cp_async4_zfill(ssc + buf * kChunk + r, sh + (ok ? cc + r : cb), ok);
    }
  };
#pragma unroll
  for (int s = 0; s < kStagesQ - 1; ++s) {
    if (cb + s * kChunk < ce) stage(cb + s * kChunk, s);
    cp_async_commit();
  }
  const int rows = te - k0 < kKeysQ ? static_cast<int>(te - k0) : kKeysQ;
  auto mt_row = [&](int mt) { return (warp * kMtQ + mt) * 16 + gq; };
  uint32_t a[kMtQ][kKs][4];
  {
    const int8_t* xk = p.centred_q8 + (int64_t{h} * p.n_idx + k0) * D;
#pragma unroll
    for (int mt = 0; mt < kMtQ; ++mt) {
      const int r_lo = mt_row(mt), r_hi = r_lo + 8;
      const bool v_lo = r_lo < rows, v_hi = r_hi < rows;
#pragma unroll
      for (int ks = 0; ks < kKs; ++ks) {
        const int col = ks * 32 + 4 * tq;
        a[mt][ks][0] = v_lo ? *reinterpret_cast<const uint32_t*>(xk + r_lo * D + col) : 0u;
        a[mt][ks][1] = v_hi ? *reinterpret_cast<const uint32_t*>(xk + r_hi * D + col) : 0u;
        a[mt][ks][2] = v_lo ? *reinterpret_cast<const uint32_t*>(xk + r_lo * D + col + 16) : 0u;
        a[mt][ks][3] = v_hi ? *reinterpret_cast<const uint32_t*>(xk + r_hi * D + col + 16) : 0u;
      }
    }
  }
  float best[kMtQ][2];
  int idx[kMtQ][2];
#pragma unroll
  for (int mt = 0; mt < kMtQ; ++mt) {
    best[mt][0] = best[mt][1] = -INFINITY;
    idx[mt][0] = idx[mt][1] = cb;
  }
  auto steps = [&](int buf, int cc, auto full_tag) {
    constexpr bool kFull = decltype(full_tag)::value;
    const uint8_t* cbuf = smq + buf * (kChunk * kRow);
    const float* sbuf = ssc + buf * kChunk;
    const int nt_end = kFull ? kChunk / 8 : (ce - cc + 7) / 8;
#pragma unroll 1
    for (int nt0 = 0; nt0 < nt_end; nt0 += kNpQ) {
      int acc[kNpQ][kMtQ][4];
#pragma unroll
      for (int q = 0; q < kNpQ; ++q)
#pragma unroll
        for (int mt = 0; mt < kMtQ; ++mt) acc[q][mt][0] = acc[q][mt][1] = acc[q][mt][2] = acc[q][mt][3] = kQ8Bias;
#pragma unroll
      for (int k2 = 0; k2 < kKs / 2; ++k2) {
        uint32_t b[kNpQ][4];  // k-step 2 k2: (b0, b1); 2 k2 + 1: (b2, b3)
#pragma unroll
        for (int q = 0; q < kNpQ; ++q) ldmatrix_x4(b[q], cbuf + ((nt0 + q) * 8 + ri) * kRow + mi * 16 + k2 * 64);
#pragma unroll
        for (int half = 0; half < 2; ++half)
#pragma unroll
          for (int q = 0; q < kNpQ; ++q)
#pragma unroll
            for (int mt = 0; mt < kMtQ; ++mt)
              mma_s8_16832(acc[q][mt], a[mt][2 * k2 + half], b[q][2 * half], b[q][2 * half + 1]);
      }
#pragma unroll
      for (int q = 0; q < kNpQ; ++q) {
        const int lc = (nt0 + q) * 8 + 2 * tq;  // chunk-local column of c0 / c2
        const int col0 = cc + lc;
        const float s0 = sbuf[lc], s1 = sbuf[lc + 1];
#pragma unroll
        for (int mt = 0; mt < kMtQ; ++mt)
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            const float v0 = (__int_as_float(acc[q][mt][2 * hf]) - kQ8BiasF) * s0;
            const float v1 = (__int_as_float(acc[q][mt][2 * hf + 1]) - kQ8BiasF) * s1;
            if (kFull || col0 < ce) {
              if (v0 > best[mt][hf]) { best[mt][hf] = v0; idx[mt][hf] = col0; }
            }
            if (kFull || col0 + 1 < ce) {
              if (v1 > best[mt][hf]) { best[mt][hf] = v1; idx[mt][hf] = col0 + 1; }
            }
          }
      }
    }
  };
  // The k-steps of a D = 64 row are 2: the loop over k2 is one step of two halves (kKs / 2 = 1).
  static_assert(kKs % 2 == 0, "D = 64 or 128");
#pragma unroll 1
  for (int cc = cb, it = 0; cc < ce; cc += kChunk, ++it) {
    cp_async_wait<kStagesQ - 2>();
    __syncthreads();
    const int nxt = cc + (kStagesQ - 1) * kChunk;
    if (nxt < ce) stage(nxt, (it + kStagesQ - 1) % kStagesQ);
    cp_async_commit();
    const int buf = it % kStagesQ;
    if (cc + kChunk <= ce) steps(buf, cc, std::true_type{});
    else steps(buf, cc, std::false_type{});
  }
  write_assignments<kMtQ>(p, h, k0, rows, tq, best, idx, mt_row);
}

// Launches an assignment kernel with `smem` bytes of dynamic shared memory (set at every launch: cheap, per
// current device) over key tiles of keys_per_cta x segments (or 1, global) x heads.
template <typename Kernel>
cudaError_t launch_assign(Kernel kernel, int smem, int keys_per_cta, const KMeansParams& p, bool global,
                          cudaStream_t s) {
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  const int64_t tokens = global ? p.n_idx : p.max_seg_tokens;
  const dim3 grid(static_cast<unsigned>((tokens + keys_per_cta - 1) / keys_per_cta), global ? 1 : p.num_segments,
                  p.num_heads);
  kernel<<<grid, kWarps * 32, smem, s>>>(p, global);
  return cudaGetLastError();
}

template <int D, int kMtQ, int kNpQ, int kMinBlocksQ>
cudaError_t launch_q8_tile(const KMeansParams& p, bool global, cudaStream_t s) {
  return launch_assign(assign_q8_kernel<D, kMtQ, kNpQ, kMinBlocksQ>, smem_bytes_q8<D>(), kWarps * 16 * kMtQ, p,
                       global, s);
}

template <int D>
cudaError_t launch_a(const KMeansParams& p, bool global, cudaStream_t s) {
  // 34 KiB of dynamic shared memory at D 128 (under the 48 KiB default; a deeper ring needs no other change).
  return launch_assign(assign_a_kernel<D>, smem_bytes_a<D>(), kKeys, p, global, s);
}

// The tile: 4 m-tiles x 1 n-tile per warp step, 2 CTAs per SM (run 26's A/B at 32K, segment passes: 0.722
// ms against 0.771 for 2 x 2, 0.753 for 2 x 2 at 3 CTAs per SM, 0.846 for 4 x 2 at 1).
template <int D>
cudaError_t launch_q8(const KMeansParams& p, bool global, cudaStream_t s) {
  if (p.centred_q8 == nullptr || p.centroids_q8 == nullptr || p.centroid_scale == nullptr) return cudaErrorInvalidValue;
  return launch_q8_tile<D, 4, 1, 2>(p, global, s);
}

template <int D>
cudaError_t launch_v1(const KMeansParams& p, bool global, cudaStream_t s) {
  const int64_t tokens = global ? p.n_idx : p.max_seg_tokens;
  const dim3 grid(static_cast<unsigned>((tokens + kKeys - 1) / kKeys), global ? 1 : p.num_segments, p.num_heads);
  // RETROINFER_KMEANS_NP=1 selects one n-tile per step (about run 3's schedule; A/B comparisons).
  static const bool one = [] {
    const char* e = std::getenv("RETROINFER_KMEANS_NP");
    return e != nullptr && e[0] == '1';
  }();
  if (one) assign_v1_kernel<D, 1><<<grid, kWarps * 32, 0, s>>>(p, global);
  else assign_v1_kernel<D, 2><<<grid, kWarps * 32, 0, s>>>(p, global);
  return cudaGetLastError();
}

template <int D>
cudaError_t launch_variant(const KMeansParams& p, bool global, int variant, cudaStream_t s) {
  switch (variant) {
    case kAssignV1: return launch_v1<D>(p, global, s);
    case kAssignA: return launch_a<D>(p, global, s);
    case kAssignQ8: return launch_q8<D>(p, global, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t kmeans_assign_variant(const KMeansParams& p, bool global, int variant, cudaStream_t s) {
  if (p.head_dim == 128) return launch_variant<128>(p, global, variant, s);
  if (p.head_dim == 64) return launch_variant<64>(p, global, variant, s);
  return cudaErrorInvalidValue;
}

}  // namespace retroinfer::cuda::detail
