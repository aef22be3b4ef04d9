// The k-means assignment kernel (kmeans_kernels.h kmeans_assign): every index token to the centroid of
// [cb, ce) with the largest f32(int8 key . int8 centroid) * the centroid's scale, ties to the lowest cluster
// id. Centroid chunks of kChunk rows stream through a cp.async ring in shared memory with their scales; each
// warp holds its keys' A fragments in registers and issues every independent accumulator of a k-step before
// the next k-step.
#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/async_copy.cuh"
#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace retroinfer::cuda::detail {
namespace {

constexpr int kWarps = 8;    // warps per CTA
constexpr int kChunk = 64;   // centroids staged in shared memory at a time

// The CTA's keys and clusters: the key range ends at te, the CTA's keys_per_cta keys start at k0 (k0 >= te: none,
// the CTA returns at once); cluster range [cb, ce). Segment blockIdx.y's ranges, or all (global).
struct AssignRange {
  int64_t k0, te;
  int cb, ce;
};
__device__ __forceinline__ AssignRange assign_range(const KMeansKernelParams& p, bool global, int keys_per_cta) {
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

// The best (score, id) over the 4 lanes of a quad (one row's interleaved columns); ties -> lower id.
__device__ __forceinline__ void quad_argmax(float& best, int& idx) {
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, off);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, off);
    if (ob > best || (ob == best && oi < idx)) { best = ob; idx = oi; }
  }
}

// The end of a warp's assignment: each row's best over its quad, written by lane tq 0 as the token's
// cluster and sort key (h * C + cluster); m-tile mt holds rows mt_row(mt) and mt_row(mt) + 8 of the CTA's
// keys from k0 (rows valid ones).
template <int kMt, typename RowOf>
__device__ __forceinline__ void write_assignments(const KMeansKernelParams& p, int h, int64_t k0, int rows, int tq,
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

// Score of key x against centroid c: f32(sum_d xq_d cq_d) * scale_c, the integer dot exact in int32
// (|dot| <= D * 127^2 < 2^22). The accumulators start at the bit pattern of 1.5 * 2^23 (kQ8Bias), so that
// after the MMAs __int_as_float(acc) is exactly 1.5 * 2^23 + dot: f32(dot) costs one FADD instead of an I2F
// (a quarter-rate conversion on sm_90). Centroid chunks of kChunk rows in a ring of kStagesQ cp.async
// stages with their scales.
//
// What bounds it (Nsight Compute, 32K segment pass): the argmax, not the tensor pipe: 3 ALU operations per
// (key, centroid) pair (a compare and two selects; ALU the busiest pipe), stalls mostly short-scoreboard
// (the ldmatrix / scale loads); ~0.35 ms of ALU work alone for the 1.74e9 pairs of a 32K layer's 9 + 1
// iterations on 132 SMs.
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
__global__ void __launch_bounds__(kWarps * 32, kMinBlocksQ) assign_q8_kernel(const KMeansKernelParams p, bool global) {
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
cudaError_t launch_assign(Kernel kernel, int smem, int keys_per_cta, const KMeansKernelParams& p, bool global,
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
cudaError_t launch_q8_tile(const KMeansKernelParams& p, bool global, cudaStream_t s) {
  return launch_assign(assign_q8_kernel<D, kMtQ, kNpQ, kMinBlocksQ>, smem_bytes_q8<D>(), kWarps * 16 * kMtQ, p,
                       global, s);
}

// The tile: 4 m-tiles x 1 n-tile per warp step, 2 CTAs per SM (segment passes at 32K: 0.722 ms against
// 0.771 for 2 x 2, 0.753 for 2 x 2 at 3 CTAs per SM, 0.846 for 4 x 2 at 1).
template <int D>
cudaError_t launch_q8(const KMeansKernelParams& p, bool global, cudaStream_t s) {
  return launch_q8_tile<D, 4, 1, 2>(p, global, s);
}

}  // namespace

cudaError_t kmeans_assign(const KMeansKernelParams& p, bool global, cudaStream_t s) {
  if (p.centred_q8 == nullptr || p.centroids_q8 == nullptr || p.centroid_scale == nullptr) return cudaErrorInvalidValue;
  if (p.head_dim == 128) return launch_q8<128>(p, global, s);
  if (p.head_dim == 64) return launch_q8<64>(p, global, s);
  return cudaErrorInvalidValue;
}

}  // namespace retroinfer::cuda::detail
