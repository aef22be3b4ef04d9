// The k-means assignment kernels after v1 (kmeans.cu assign_kernel; variants in kernels.h
// KMeansAssignVariant). Same result as v1 bit for bit: every score is the same chain of mma.sync m16n8k16
// (bf16 operands, f32 accumulation, k-steps 0..D/16-1 in ascending order on the same A and B fragments),
// and the argmax keeps the first strict maximum in ascending cluster order, ties to the lowest id.
//
// Why v1 is slow (Nsight Compute, 128K: ~333 TFLOP/s, sm throughput 51%): in v1's program order the two
// k-steps of one accumulator are adjacent (for k2: for q: for mt: mma(ks), mma(ks + 1)), so a warp waits a
// full mma latency every other MMA unless ptxas reorders; with 4 warps per scheduler that caps the
// tensor pipe. Here every k-step first issues the MMAs of all kNp x kMt independent accumulators, then
// the next k-step. Other changes: a kStages-deep cp.async ring with one barrier per chunk (v1: two), the
// column guards only in a chunk that crosses the range end, and (kTree) an argmax epilogue of one FMNMX
// per score plus one compare per row and step; the column of a new record is looked up only then.
#include <cuda_runtime.h>

#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace retroinfer::cuda::detail {
namespace {

constexpr int kWarps = 8;  // warps per CTA
// kMt: 16-key m-tiles per warp (A fragments in registers; each B fragment feeds kMt MMAs): 2 as v1
// (256 keys per CTA) or 3 (variant e: 384 keys per CTA, a third fewer shared-memory reads per MMA).
template <int kMt>
constexpr int keys_per_cta() {
  return kWarps * 16 * kMt;
}

template <int D, int kChunk, int kStages>
constexpr int smem_bytes() {
  return kStages * kChunk * (D + 8) * 2;  // rows padded by 16 bytes: conflict-free ldmatrix
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

// v1's epilogue: every score compared in ascending column order (strict >: the first maximum stays).
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

// Max-tree epilogue with the same outcome: m = max of the step's scores of a row (columns past ce count
// as -inf); only when m > best is the first column holding m looked up (that is where the sequential
// strict-> scan would have ended: m is the largest and the first occurrence wins; NaN scores are skipped
// by both, fmaxf ignoring them and v == m failing).
template <int kNp, int kMt, bool kFull>
__device__ __forceinline__ void argmax_tree(const float (&acc)[kNp][kMt][4], int col_base, int ce,
                                            float (&best)[kMt][2], int (&idx)[kMt][2]) {
  constexpr int kV = 2 * kNp;
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float v[kV];
#pragma unroll
      for (int i = 0; i < kV; ++i) {  // ascending columns: q = i / 2 (8 apart), c = i % 2 (adjacent)
        v[i] = acc[i / 2][mt][2 * hf + (i & 1)];
        if (!kFull && col_base + (i / 2) * 8 + (i & 1) >= ce) v[i] = -INFINITY;
      }
      float t[kV];
#pragma unroll
      for (int i = 0; i < kV; ++i) t[i] = v[i];
#pragma unroll
      for (int w = 1; w < kV; w <<= 1)
#pragma unroll
        for (int i = 0; i + w < kV; i += 2 * w) t[i] = fmaxf(t[i], t[i + w]);
      const float m = t[0];
      if (m > best[mt][hf]) {
        int at = 0;
#pragma unroll
        for (int i = kV - 1; i >= 0; --i)
          if (v[i] == m) at = i;
        best[mt][hf] = m;
        idx[mt][hf] = col_base + (at / 2) * 8 + (at & 1);
      }
    }
}

// The assignment of kKeys keys (CTA) of flat head blockIdx.z against the clusters [cb, ce) of its segment
// (blockIdx.y) or of all clusters (global). Centroid chunks of kChunk rows in a kStages-deep ring of
// dynamic shared memory; rows past ce are zero-filled and masked.
template <int D, int kMt, int kNp, int kChunk, int kStages, bool kTree, int kMinBlocks>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks) assign_fast_kernel(const KMeansParams p, bool global) {
  constexpr int kKeys = keys_per_cta<kMt>();
  static_assert(kChunk % (8 * kNp) == 0, "a chunk is whole steps");
  static_assert(kStages >= 2, "the ring needs a buffer being filled and one being read");
  constexpr int kRow = D + 8;
  extern __shared__ __align__(16) uint16_t cs[];  // [kStages][kChunk][kRow] bf16
  const int h = blockIdx.z, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gq = lane >> 2, tq = lane & 3, mi = lane >> 3, ri = lane & 7;
  int64_t tb, te;
  int cb, ce;
  if (global) {
    tb = 0; te = p.n_idx; cb = 0; ce = p.num_clusters;
  } else {
    tb = p.seg_token_begin[blockIdx.y]; te = p.seg_token_begin[blockIdx.y + 1];
    cb = p.seg_cluster_begin[blockIdx.y]; ce = p.seg_cluster_begin[blockIdx.y + 1];
  }
  const int64_t k0 = tb + int64_t{blockIdx.x} * kKeys;
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
      const bool v_lo = r_lo < rows, v_hi = r_hi < rows;
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        const int col = ks * 16 + 2 * tq;
        a[mt][ks][0] = v_lo ? *reinterpret_cast<const uint32_t*>(xk + r_lo * D + col) : 0u;
        a[mt][ks][1] = v_hi ? *reinterpret_cast<const uint32_t*>(xk + r_hi * D + col) : 0u;
        a[mt][ks][2] = v_lo ? *reinterpret_cast<const uint32_t*>(xk + r_lo * D + col + 8) : 0u;
        a[mt][ks][3] = v_hi ? *reinterpret_cast<const uint32_t*>(xk + r_hi * D + col + 8) : 0u;
      }
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
      if constexpr (kTree) argmax_tree<kNp, kMt, kFull>(acc, col_base, ce, best, idx);
      else argmax_plain<kNp, kMt, kFull>(acc, col_base, ce, best, idx);
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
  const int64_t base = int64_t{h} * p.n_idx + k0;
  const uint32_t hbase = static_cast<uint32_t>(h) * static_cast<uint32_t>(p.num_clusters);
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      // Reduce over the 4 lanes of the quad (same row, interleaved columns); ties -> lower id.
#pragma unroll
      for (int off = 1; off <= 2; off <<= 1) {
        const float ob = __shfl_xor_sync(0xffffffffu, best[mt][hf], off);
        const int oi = __shfl_xor_sync(0xffffffffu, idx[mt][hf], off);
        if (ob > best[mt][hf] || (ob == best[mt][hf] && oi < idx[mt][hf])) { best[mt][hf] = ob; idx[mt][hf] = oi; }
      }
      const int r = mt_row(mt) + 8 * hf;
      if (tq == 0 && r < rows) {
        p.assignment[base + r] = idx[mt][hf];
        p.sort_keys[base + r] = hbase + idx[mt][hf];
      }
    }
}

template <int D, int kMt, int kNp, int kChunk, int kStages, bool kTree, int kMinBlocks>
cudaError_t launch(const KMeansParams& p, bool global, cudaStream_t s) {
  constexpr int kSmem = smem_bytes<D, kChunk, kStages>();
  constexpr int kKeys = keys_per_cta<kMt>();
  auto* kernel = assign_fast_kernel<D, kMt, kNp, kChunk, kStages, kTree, kMinBlocks>;
  // Past the 48 KiB default for dynamic shared memory; set at every launch (cheap, per current device).
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (e != cudaSuccess) return e;
  const int64_t tokens = global ? p.n_idx : p.max_seg_tokens;
  const dim3 grid(static_cast<unsigned>((tokens + kKeys - 1) / kKeys), global ? 1 : p.num_segments, p.num_heads);
  kernel<<<grid, kWarps * 32, kSmem, s>>>(p, global);
  return cudaGetLastError();
}

template <int D>
cudaError_t launch_variant(const KMeansParams& p, bool global, int variant, cudaStream_t s) {
  switch (variant) {
    //                         D kMt kNp kChunk kStages kTree kMinBlocks   shared memory at D 128
    case kAssignA: return launch<D, 2, 2, 64, 2, false, 2>(p, global, s);   // 34 KiB
    case kAssignB: return launch<D, 2, 2, 128, 3, true, 2>(p, global, s);   // 102 KiB
    case kAssignC: return launch<D, 2, 4, 128, 3, true, 1>(p, global, s);   // 102 KiB
    case kAssignD: return launch<D, 2, 4, 128, 3, true, 2>(p, global, s);   // 102 KiB
    case kAssignE: return launch<D, 3, 2, 128, 3, true, 1>(p, global, s);   // 102 KiB
    case kAssignF: return launch<D, 2, 2, 128, 3, false, 2>(p, global, s);  // 102 KiB
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t kmeans_assign_fast(const KMeansParams& p, bool global, int variant, cudaStream_t s) {
  if (p.head_dim == 128) return launch_variant<128>(p, global, variant, s);
  if (p.head_dim == 64) return launch_variant<64>(p, global, variant, s);
  return cudaErrorInvalidValue;
}

}  // namespace retroinfer::cuda::detail
