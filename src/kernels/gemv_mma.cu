// The tensor-core GEMV of gemv.h (mma_gemv_bf16, mma_gemv_swiglu_bf16): y[m, n] = x[m] . W[n] for rows <= 8
// with mma.sync m16n8k16 (bf16 in, f32 accumulate): A = 16 W rows x 16 k, B = 16 k x 8 x rows (rows >= the
// call's row count are zeros), D = 16 x 8 f32. The GEMV is bandwidth-bound; the tensor core replaces the
// bf16 -> f32 conversions and rows x 8 FMAs per W element of gemv.cu by one instruction per 16 x 16 W tile.
//
// The k permutation. A dot product over k is invariant under a permutation of k applied to both A and B, so
// the fragments are loaded in the order that gives each thread wide coalesced loads. Thread (g = lane / 4,
// t = lane % 4) of a warp, at one 32-k step starting at k0, loads 16 bytes (8 bf16) at k0 + 8t .. k0 + 8t + 7
// of: W row r0 + g (lo), W row r0 + g + 8 (hi) and x row g (xv; zeros when g >= rows). Words (.x .y .z .w)
// hold the element pairs 8t + {0,1}, {2,3}, {4,5}, {6,7}. Two mmas consume them:
//   mma 1: a0 = lo.x, a1 = hi.x, a2 = lo.y, a3 = hi.y; b0 = xv.x, b1 = xv.y
//   mma 2: a0 = lo.z, a1 = hi.z, a2 = lo.w, a3 = hi.w; b0 = xv.z, b1 = xv.w
// By the PTX fragment layout (a0: row g, logical k 2t, 2t+1; a1: row g + 8, same k; a2: row g, k 2t+8, 2t+9;
// a3: row g + 8, same k; b0: k 2t, 2t+1, column g; b1: k 2t+8, 2t+9, column g), mma 1 maps logical k 2t + j to
// physical k0 + 8t + j and logical 2t + 8 + j to k0 + 8t + 2 + j (j = 0, 1) for A's rows and B's columns
// alike (the map depends on k only), a bijection of the 16 logical k onto {k0 + 8t + 0..3, t = 0..3}; mma 2
// the same onto k0 + 8t + 4..7. Each physical k of the step is used exactly once. D: c0, c1 = (W row g,
// x rows 2t, 2t+1), c2, c3 = (W row g + 8, x rows 2t, 2t+1).
//
// Work split. A CTA of kWarps warps owns kTiles 16-row tiles of W (kTiles x 16 output columns) and the whole
// K; its warps split K into contiguous ranges of 32-k steps. A warp loads batches of kSteps steps (8 W loads
// of 16 bytes per thread, evict-first) into two register sets in turn, so that the next batch is in flight
// while the current one's mmas wait; the steps past the last whole batch (and the K tail, in % 32 != 0) go
// one at a time. The warps' 16 x 8 f32 tiles are summed through shared memory in warp order (deterministic:
// one fixed summation order per (kTiles, kWarps, K), independent of timing). Rows past out (out % 16 != 0)
// load the last row and are not written.
//
// SwiGLU: a tile's A rows 0-7 are the gate rows n0 + g and rows 8-15 the matching up rows out + n0 + g, so
// that c0 / c2 (gate / up of x row 2t) and c1 / c3 (x row 2t + 1) meet in one thread: act = bf16(silu_mul).
#include <cuda_runtime.h>

#include "kernels/common.cuh"
#include "kernels/gemv.h"
#include "kernels/silu.cuh"
#include "retroinfer/dtype.h"

namespace retroinfer::cuda::model {
namespace {

enum class Mode { kBf16X, kF32X, kSwiGlu };

// D (+)= A B with A 16 x 16 bf16 (a0..a3), B 16 x 8 bf16 (b0, b1), D 16 x 8 f32, fragments as in the header.
__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  // Not built for pre-sm_80 targets (the presets build sm_90 only; no such binary can launch it).
  (void)d, (void)a0, (void)a1, (void)a2, (void)a3, (void)b0, (void)b1;
  __trap();
#endif
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return static_cast<uint32_t>(f32_to_bf16(lo)) | (static_cast<uint32_t>(f32_to_bf16(hi)) << 16);
}

__device__ __forceinline__ float4 u4_as_f4(const uint4& v) {
  return make_float4(__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z), __uint_as_float(v.w));
}

__device__ __forceinline__ void store_y(const GemvParams& p, int64_t m, int64_t n, float v) {
  float* y = p.y + m * p.out + n;
  *y = p.beta == 0.0f ? v : fmaf(p.beta, *y, v);
}

// The operands of kN 32-k steps for one thread (g = lane / 4, t = lane % 4), in registers: load() issues
// every 16-byte load of the steps (W evict-first, x through L1), mma() consumes them (fragments as in the
// header). kTail (single steps only): the step may reach past K (in % 32 != 0): chunks past the end reload
// the last chunk (in bounds) and mma() zeroes their W and x words; x rows g >= rows read row 0 and are zeroed.
// Without kTail the addresses are the row pointers plus immediates (the loads need no clamping registers).
template <int kN, int kTiles, Mode kMode, bool kTail = false>
struct Batch {
  static constexpr int kXWords = kMode == Mode::kF32X ? 2 : 1;  // 16-byte x loads per step (f32 x: 8 floats)
  uint4 lo[kN][kTiles], hi[kN][kTiles];                         // W rows g and g + 8 of each tile
  uint4 x[kN][kXWords];                                         // x row g (raw bf16 or f32 bits)

  // wlo / whi: the tiles' W rows of this thread, advanced to its chunk t; xp: x row g (or 0) at chunk t, in
  // 16-byte words. Steps s0 .. s0 + kN - 1.
  __device__ __forceinline__ void load(const uint4* const (&wlo)[kTiles], const uint4* const (&whi)[kTiles],
                                       const uint4* xp, int64_t chunks, int64_t s0, int t) {
    load_w(wlo, whi, chunks, s0, t);
    load_x(xp, chunks, s0, t);
  }
  // The W loads (streamed, evict-first), then the x loads (re-read through L1).
  __device__ __forceinline__ void load_w(const uint4* const (&wlo)[kTiles], const uint4* const (&whi)[kTiles],
                                         int64_t chunks, int64_t s0, int t) {
#pragma unroll
    for (int u = 0; u < kN; ++u) {
      const int64_t off = offset(chunks, s0 + u, t);
#pragma unroll
      for (int i = 0; i < kTiles; ++i) {
        lo[u][i] = __ldcs(wlo[i] + off);
        hi[u][i] = __ldcs(whi[i] + off);
      }
    }
  }
  __device__ __forceinline__ void load_x(const uint4* xp, int64_t chunks, int64_t s0, int t) {
#pragma unroll
    for (int u = 0; u < kN; ++u) {
      const int64_t off = offset(chunks, s0 + u, t);
#pragma unroll
      for (int j = 0; j < kXWords; ++j) x[u][j] = __ldg(xp + off * kXWords + j);
    }
  }
  // Chunk offset of step s from chunk t (kTail: clamped to the last chunk).
  __device__ __forceinline__ static int64_t offset(int64_t chunks, int64_t s, int t) {
    const int64_t off = s * 4;
    if constexpr (kTail) return off + t < chunks ? off : chunks - 1 - t;
    return off;
  }

  // f32 x is rounded to bf16 (nearest even) here: the values of f32_to_bf16_array, so the f32-x launch
  // equals the bf16-x launch on the rounded copy bitwise.
  __device__ __forceinline__ void mma(float (&acc)[kTiles][4], bool x_row, int64_t chunks, int64_t s0,
                                      int t) const {
#pragma unroll
    for (int u = 0; u < kN; ++u) {
      uint4 xv;
      if constexpr (kMode == Mode::kF32X) {
        const float4 a = u4_as_f4(x[u][0]), b = u4_as_f4(x[u][1]);
        xv = make_uint4(pack_bf16x2(a.x, a.y), pack_bf16x2(a.z, a.w), pack_bf16x2(b.x, b.y), pack_bf16x2(b.z, b.w));
      } else {
        xv = x[u][0];
      }
      // Past K (kTail): W is zeroed too, so that no reloaded weight (even an inf) reaches the sums.
      const bool past = kTail && (s0 + u) * 4 + t >= chunks;
      if (!x_row || past) xv = make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int i = 0; i < kTiles; ++i) {
        const uint4 l = past ? make_uint4(0, 0, 0, 0) : lo[u][i], h = past ? make_uint4(0, 0, 0, 0) : hi[u][i];
        mma_16816(acc[i], l.x, h.x, l.y, h.y, xv.x, xv.y);
        mma_16816(acc[i], l.z, h.z, l.w, h.w, xv.z, xv.w);
      }
    }
  }
};

// Launch bounds: at least 16 warps per SM (<= 128 registers per thread), so that the 256 CTAs of a 4096-column
// product fit in one wave on 132 SMs with 8 warps per CTA.
template <int kTiles, int kWarps, Mode kMode>
__global__ void __launch_bounds__(kWarps * 32, kWarps >= 16 ? 1 : 16 / kWarps) mma_gemv_kernel(GemvParams p) {
  // 32-k steps per batch: 2 * kTiles * kSteps = 8 W loads of 16 bytes per thread (4 with f32 x, whose x words
  // double), two batches in flight within 128 registers (ptxas -v: tiles 1 with bf16 x spill nothing; the
  // others spill a few pointers, stored before the main loop and reloaded after it).
  constexpr int kSteps = (kMode == Mode::kF32X ? 2 : 4) / kTiles;
  constexpr bool kSwiGlu = kMode == Mode::kSwiGlu;
  constexpr int kTileCols = kSwiGlu ? 8 : 16;  // output columns per tile (SwiGLU: 8 gate/up pairs)
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t chunks = p.in / 8, steps = (chunks + 3) / 4;
  const int64_t s_begin = steps * warp / kWarps, s_end = steps * (warp + 1) / kWarps;
  const int64_t col0 = int64_t{blockIdx.x} * (kTiles * kTileCols);
  const uint4* w = reinterpret_cast<const uint4*>(p.w);

  // This thread's W rows per tile, advanced to its chunk t; rows past the end clamp to the last one (their
  // loads stay in bounds, their sums are not written).
  const uint4* wlo[kTiles];
  const uint4* whi[kTiles];
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    int64_t lo, hi;
    if constexpr (kSwiGlu) {
      const int64_t n = col0 + i * 8 + g, c = n < p.out ? n : p.out - 1;
      lo = c;
      hi = p.out + c;
    } else {
      lo = col0 + i * 16 + g;
      hi = lo + 8;
      lo = lo < p.out ? lo : p.out - 1;
      hi = hi < p.out ? hi : p.out - 1;
    }
    wlo[i] = w + lo * chunks + t;
    whi[i] = w + hi * chunks + t;
  }
  const bool x_row = g < p.rows;
  const void* x = kMode == Mode::kF32X ? static_cast<const void*>(p.x_f32) : static_cast<const void*>(p.x);
  constexpr int kXWords = Batch<1, kTiles, kMode>::kXWords;
  const uint4* xp = static_cast<const uint4*>(x) + ((x_row ? g : 0) * chunks + t) * kXWords;

  float acc[kTiles][4];
#pragma unroll
  for (int i = 0; i < kTiles; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

  // Full batches of kSteps steps (within K: steps < chunks / 4), software-pipelined by hand over two register
  // sets a and b (ping-pong, no copies: a copy of a set whose loads are pending would wait for them): the
  // next batch's loads are issued before the current batch's mmas, so two batches are in flight while a warp
  // waits. Then the warp's remaining steps one at a time (with the K tail).
  const int64_t s_whole = s_end < chunks / 4 ? s_end : chunks / 4;  // end of the warp's steps within K
  const int64_t full = s_whole > s_begin ? (s_whole - s_begin) / kSteps : 0;
  int64_t s = s_begin;
  if (full > 0) {
    Batch<kSteps, kTiles, kMode> a, b;
    a.load(wlo, whi, xp, chunks, s, t);
    int64_t j = 0;
#pragma unroll 1
    for (; j + 2 < full; j += 2) {  // batches j + 1 and j + 2 exist
      b.load(wlo, whi, xp, chunks, s + kSteps, t);
      a.mma(acc, x_row, chunks, s, t);
      s += kSteps;
      a.load(wlo, whi, xp, chunks, s + kSteps, t);
      b.mma(acc, x_row, chunks, s, t);
      s += kSteps;
    }
    if (j + 1 < full) {  // a holds batch j, and batch j + 1 is the last
      b.load(wlo, whi, xp, chunks, s + kSteps, t);
      a.mma(acc, x_row, chunks, s, t);
      s += kSteps;
      b.mma(acc, x_row, chunks, s, t);
    } else {
      a.mma(acc, x_row, chunks, s, t);
    }
    s += kSteps;
  }
#pragma unroll 1
  for (; s < s_end; ++s) {
    Batch<1, kTiles, kMode, true> one;
    one.load(wlo, whi, xp, chunks, s, t);
    one.mma(acc, x_row, chunks, s, t);
  }

  __shared__ float4 part[kWarps][kTiles][32];
#pragma unroll
  for (int i = 0; i < kTiles; ++i) part[warp][i][lane] = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
  __syncthreads();
  if (threadIdx.x >= 32 * kTiles) return;
  const int i = static_cast<int>(threadIdx.x) / 32;
  float4 v = part[0][i][lane];
#pragma unroll
  for (int q = 1; q < kWarps; ++q) {
    const float4 o = part[q][i][lane];
    v.x += o.x;
    v.y += o.y;
    v.z += o.z;
    v.w += o.w;
  }
  const int64_t m0 = 2 * t, m1 = 2 * t + 1;  // x rows of (c0, c2) and (c1, c3)
  if constexpr (kSwiGlu) {
    const int64_t n = col0 + i * 8 + g;
    if (n < p.out) {
      if (m0 < p.rows) p.act_bf16[m0 * p.out + n] = f32_to_bf16(silu_mul(v.x, v.z));
      if (m1 < p.rows) p.act_bf16[m1 * p.out + n] = f32_to_bf16(silu_mul(v.y, v.w));
    }
  } else {
    const int64_t lo = col0 + i * 16 + g, hi = lo + 8;
    if (lo < p.out) {
      if (m0 < p.rows) store_y(p, m0, lo, v.x);
      if (m1 < p.rows) store_y(p, m1, lo, v.y);
    }
    if (hi < p.out) {
      if (m0 < p.rows) store_y(p, m0, hi, v.z);
      if (m1 < p.rows) store_y(p, m1, hi, v.w);
    }
  }
}

template <int kTiles, Mode kMode>
cudaError_t launch_warps(const GemvParams& p, int warps, cudaStream_t s) {
  constexpr int kTileCols = kMode == Mode::kSwiGlu ? 8 : 16;
  const int64_t blocks = (p.out + kTiles * kTileCols - 1) / (kTiles * kTileCols);
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  void (*kernel)(GemvParams) = nullptr;
  switch (warps) {
    case 4: kernel = mma_gemv_kernel<kTiles, 4, kMode>; break;
    case 8: kernel = mma_gemv_kernel<kTiles, 8, kMode>; break;
    case 16: kernel = mma_gemv_kernel<kTiles, 16, kMode>; break;
    default: return cudaErrorInvalidValue;
  }
  kernel<<<static_cast<unsigned>(blocks), static_cast<unsigned>(warps * 32), 0, s>>>(p);
  return cudaGetLastError();
}

template <Mode kMode>
cudaError_t launch(const GemvParams& p, int tiles, int warps, cudaStream_t s) {
  switch (tiles) {
    case 1: return launch_warps<1, kMode>(p, warps, s);
    case 2: return launch_warps<2, kMode>(p, warps, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t mma_gemv_bf16(const GemvParams& p, int tiles, int warps, cudaStream_t s) {
  if (!gemv_supported(p)) return cudaErrorInvalidValue;
  return p.x != nullptr ? launch<Mode::kBf16X>(p, tiles, warps, s) : launch<Mode::kF32X>(p, tiles, warps, s);
}

cudaError_t mma_gemv_swiglu_bf16(const GemvParams& p, int tiles, int warps, cudaStream_t s) {
  if (!gemv_swiglu_supported(p)) return cudaErrorInvalidValue;
  return launch<Mode::kSwiGlu>(p, tiles, warps, s);
}

}  // namespace retroinfer::cuda::model
