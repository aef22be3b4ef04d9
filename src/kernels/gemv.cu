// The bf16 GEMV of gemv.h. CTA = 4 warps over kCols consecutive output columns n; its 128 threads stride over
// the K dimension in chunks of 8 elements (one 16-byte load of W per column and one of x per row), two chunks
// in flight per thread; each thread keeps kRows x kCols partial sums, reduced over the warp by shuffles and
// over the 4 warps through shared memory in a fixed order (deterministic).
#include <cuda_runtime.h>

#include "kernels/common.cuh"
#include "kernels/gemv.h"
#include "kernels/silu.cuh"
#include "retroinfer/dtype.h"

namespace retroinfer::cuda::model {
namespace {

constexpr int kThreads = 128, kWarps = kThreads / 32, kUnroll = 2;

__device__ __forceinline__ void to_float8(const uint4& w, float* f) { detail::bf16x8_to_float(w, f); }

// Chunk k (8 elements) of x row m as floats: bf16 x, or f32 x_f32 rounded to bf16 values.
template <bool kF32X>
__device__ __forceinline__ void load_x(const GemvParams& p, int64_t chunks, int m, int64_t k, float* xf) {
  if constexpr (kF32X) {
    const float4* x = reinterpret_cast<const float4*>(p.x_f32) + (m * chunks + k) * 2;
    const float4 a = __ldg(x), b = __ldg(x + 1);
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int j = 0; j < 8; ++j) xf[j] = bf16_to_f32(f32_to_bf16(v[j]));
  } else {
    to_float8(__ldg(reinterpret_cast<const uint4*>(p.x) + m * chunks + k), xf);
  }
}

// kSwiGlu: the CTA's kCols W rows are kCols / 2 gate rows n0 + g and the matching up rows p.out + n0 + g.
template <int kRows, int kCols, bool kF32X, bool kSwiGlu = false>
__global__ void __launch_bounds__(kThreads) gemv_kernel(GemvParams p) {
  constexpr int kOut = kSwiGlu ? kCols / 2 : kCols;  // output columns per CTA
  static_assert(!kSwiGlu || (kCols % 2 == 0 && !kF32X), "SwiGLU mode: gate/up pairs, bf16 x");
  const int64_t n0 = int64_t{blockIdx.x} * kOut;
  const int64_t chunks = p.in / 8;
  const uint4* w = reinterpret_cast<const uint4*>(p.w);
  float acc[kRows][kCols];
#pragma unroll
  for (int m = 0; m < kRows; ++m)
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[m][c] = 0.0f;
  // W row of CTA column c (offset in chunks), the output column clamped to the last one (its loads stay in
  // bounds; its sums are not written).
  int64_t col[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int64_t o = n0 + c % kOut;
    col[c] = ((o < p.out ? o : p.out - 1) + (c >= kOut ? p.out : 0)) * chunks;
  }

  for (int64_t k0 = threadIdx.x; k0 < chunks; k0 += int64_t{kThreads} * kUnroll) {
    uint4 wv[kUnroll][kCols];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = k0 + int64_t{u} * kThreads;
#pragma unroll
      for (int c = 0; c < kCols; ++c) wv[u][c] = k < chunks ? __ldcs(w + col[c] + k) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = k0 + int64_t{u} * kThreads;
      if (k >= chunks) break;
      float wf[kCols][8];
#pragma unroll
      for (int c = 0; c < kCols; ++c) to_float8(wv[u][c], wf[c]);
#pragma unroll
      for (int m = 0; m < kRows; ++m) {
        float xf[8];
        load_x<kF32X>(p, chunks, m, k, xf);
#pragma unroll
        for (int c = 0; c < kCols; ++c)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[m][c] = fmaf(xf[j], wf[c][j], acc[m][c]);
      }
    }
  }

  __shared__ float part[kWarps][kRows * kCols];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int m = 0; m < kRows; ++m)
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const float v = detail::warp_sum(acc[m][c]);
      if (lane == 0) part[warp][m * kCols + c] = v;
    }
  __syncthreads();
  if (threadIdx.x < kRows * kOut) {
    const int m = threadIdx.x / kOut, c = threadIdx.x % kOut;
    const int64_t n = n0 + c;
    if (n < p.out) {
      const int i = m * kCols + c;
      float v = part[0][i];
#pragma unroll
      for (int q = 1; q < kWarps; ++q) v += part[q][i];
      if constexpr (kSwiGlu) {
        float u = part[0][i + kOut];
#pragma unroll
        for (int q = 1; q < kWarps; ++q) u += part[q][i + kOut];
        p.act_bf16[m * p.out + n] = f32_to_bf16(silu_mul(v, u));
      } else {
        float* y = p.y + m * p.out + n;
        *y = p.beta == 0.0f ? v : fmaf(p.beta, *y, v);
      }
    }
  }
}

template <int kCols, bool kF32X>
cudaError_t launch_cols(const GemvParams& p, cudaStream_t s) {
  const auto grid = static_cast<unsigned>((p.out + kCols - 1) / kCols);
  switch (p.rows) {
    case 1: gemv_kernel<1, kCols, kF32X><<<grid, kThreads, 0, s>>>(p); break;
    case 2: gemv_kernel<2, kCols, kF32X><<<grid, kThreads, 0, s>>>(p); break;
    case 3: gemv_kernel<3, kCols, kF32X><<<grid, kThreads, 0, s>>>(p); break;
    case 4: gemv_kernel<4, kCols, kF32X><<<grid, kThreads, 0, s>>>(p); break;
    case 5: gemv_kernel<5, kCols, kF32X><<<grid, kThreads, 0, s>>>(p); break;
    case 6: gemv_kernel<6, kCols, kF32X><<<grid, kThreads, 0, s>>>(p); break;
    case 7: gemv_kernel<7, kCols, kF32X><<<grid, kThreads, 0, s>>>(p); break;
    case 8: gemv_kernel<8, kCols, kF32X><<<grid, kThreads, 0, s>>>(p); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

template <int kCols>
cudaError_t launch_swiglu(const GemvParams& p, cudaStream_t s) {
  const auto grid = static_cast<unsigned>((p.out + kCols / 2 - 1) / (kCols / 2));
  switch (p.rows) {
    case 1: gemv_kernel<1, kCols, false, true><<<grid, kThreads, 0, s>>>(p); break;
    case 2: gemv_kernel<2, kCols, false, true><<<grid, kThreads, 0, s>>>(p); break;
    case 3: gemv_kernel<3, kCols, false, true><<<grid, kThreads, 0, s>>>(p); break;
    case 4: gemv_kernel<4, kCols, false, true><<<grid, kThreads, 0, s>>>(p); break;
    case 5: gemv_kernel<5, kCols, false, true><<<grid, kThreads, 0, s>>>(p); break;
    case 6: gemv_kernel<6, kCols, false, true><<<grid, kThreads, 0, s>>>(p); break;
    case 7: gemv_kernel<7, kCols, false, true><<<grid, kThreads, 0, s>>>(p); break;
    case 8: gemv_kernel<8, kCols, false, true><<<grid, kThreads, 0, s>>>(p); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

template <bool kF32X>
cudaError_t launch(const GemvParams& p, int out_per_block, cudaStream_t s) {
  switch (out_per_block) {
    case 1: return launch_cols<1, kF32X>(p, s);
    case 2: return launch_cols<2, kF32X>(p, s);
    case 4: return launch_cols<4, kF32X>(p, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

bool gemv_supported(const GemvParams& p) {
  static_assert(kGemvMaxRows == 8, "gemv_kernel is instantiated for rows 1..8");
  const void* x = p.x != nullptr ? static_cast<const void*>(p.x) : static_cast<const void*>(p.x_f32);
  return p.w != nullptr && x != nullptr && p.y != nullptr && p.rows >= 1 && p.rows <= kGemvMaxRows && p.in >= 8 &&
         p.in % 8 == 0 && p.out >= 1 && p.out <= 0x7fffffff && reinterpret_cast<uintptr_t>(p.w) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

bool gemv_swiglu_supported(const GemvParams& p) {
  if (p.x == nullptr || p.act_bf16 == nullptr || p.out > 0x3fffffff) return false;
  // The products' checks on a [2 out, in] W (y is unused: any non-null pointer passes the check).
  GemvParams q = p;
  q.x_f32 = nullptr;
  q.y = reinterpret_cast<float*>(p.act_bf16);
  q.out = 2 * p.out;
  return gemv_supported(q);
}

cudaError_t gemv_swiglu_bf16(const GemvParams& p, int out_per_block, cudaStream_t s) {
  if (!gemv_swiglu_supported(p)) return cudaErrorInvalidValue;
  switch (out_per_block) {
    case 1: return launch_swiglu<2>(p, s);
    case 2: return launch_swiglu<4>(p, s);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t gemv_bf16(const GemvParams& p, int out_per_block, cudaStream_t s) {
  if (!gemv_supported(p)) return cudaErrorInvalidValue;
  return p.x != nullptr ? launch<false>(p, out_per_block, s) : launch<true>(p, out_per_block, s);
}

}  // namespace retroinfer::cuda::model
