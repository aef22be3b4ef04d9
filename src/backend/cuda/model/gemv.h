// A bf16 GEMV for the decode products of few rows (one of the candidates Gemm's autotune times against
// cuBLASLt; see gemm.h): y[m, n] = sum_k x[m, k] * W[n, k] + beta * y[m, n], m < rows <= kGemvMaxRows.
// W streams from HBM once with 16-byte loads (evict-first); x (tiny) is re-read through L1; products are
// exact in f32 (bf16 x bf16) and accumulated in f32, so the result differs from cuBLAS's only by summation
// order. Included only from src/backend/cuda.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace retroinfer::cuda::model {

constexpr int kGemvMaxRows = 8;

struct GemvParams {
  const uint16_t* w = nullptr;  // [out, in] bf16 row-major, 16-byte aligned
  const uint16_t* x = nullptr;  // [rows, in] bf16 row-major, 16-byte aligned; or nullptr and x_f32 set
  const float* x_f32 = nullptr; // [rows, in] f32 row-major, 16-byte aligned (used when x is null): rounded to
                                // bf16 (nearest even) as it is loaded, so the result is bit-identical to
                                // f32_to_bf16_array into x and the bf16-x GEMV
  float* y = nullptr;           // [rows, out] f32 row-major
  int64_t rows = 0, in = 0, out = 0;
  float beta = 0.0f;            // 0: y is overwritten (not read); else y = product + beta * y
};

// True when gemv_bf16 takes this shape: 1 <= rows <= kGemvMaxRows, in % 8 == 0, w and x (or x_f32) 16-byte
// aligned, y set, out >= 1 and the grid within limits.
bool gemv_supported(const GemvParams& p);

// out_per_block (1, 2 or 4): output columns n per CTA of 128 threads (the autotune's variants: more columns
// per CTA reuse each x load more, fewer give more CTAs). Returns cudaErrorInvalidValue when !gemv_supported(p)
// or out_per_block is not 1, 2 or 4; else the launch status.
cudaError_t gemv_bf16(const GemvParams& p, int out_per_block, cudaStream_t s);

}  // namespace retroinfer::cuda::model
