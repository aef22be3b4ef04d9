// bf16 GEMVs for the decode products of few rows (candidates Gemm's autotune times against cuBLASLt; see
// gemm.h): y[m, n] = sum_k x[m, k] * W[n, k] + beta * y[m, n], m < rows <= kGemvMaxRows. Two kernels with one
// contract: gemv_bf16 (gemv.cu, FMA on the CUDA cores) and mma_gemv_bf16 (gemv_mma.cu, tensor cores).
// W streams from HBM once with 16-byte loads (evict-first); x (tiny) is re-read through L1; products are
// exact in f32 (bf16 x bf16) and accumulated in f32, so gemv_bf16's result differs from cuBLAS's only by
// summation order. Included only from src/model/cuda, tests/gpu and bench.
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
  float* y = nullptr;           // [rows, out] f32 row-major (gemv_bf16)
  uint16_t* act_bf16 = nullptr; // [rows, out] bf16 row-major (gemv_swiglu_bf16)
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

// Fused gate/up product + SwiGLU: act_bf16[m, n] = bf16(silu(g) * u), g = x[m] . W[n], u = x[m] . W[out + n],
// for W [2 out, in] (gate rows, then up rows; the runner's wgate_up), n < out. The sums are those of gemv_bf16
// (summation order included) and the element function is the SwiGLU kernel's. bf16 x only (x_f32, y and
// beta unused); act_bf16 must not overlap x. out_per_block: 1 or 2 gate columns per CTA (2 or 4 W rows).
bool gemv_swiglu_supported(const GemvParams& p);
cudaError_t gemv_swiglu_bf16(const GemvParams& p, int out_per_block, cudaStream_t s);

// The tensor-core GEMV (gemv_mma.cu): the same contracts (shapes, gemv_supported / gemv_swiglu_supported,
// beta, x or x_f32, act_bf16) computed with mma.sync m16n8k16 (bf16 x bf16 products, f32 accumulation inside
// the tensor core, whose k-group sums may round differently from IEEE f32 adds: the error is that of
// cuBLAS's tensor-core kernels). Deterministic for a fixed (tiles, warps, shape). Variants for the autotune:
// tiles (1 or 2): 16-column W tiles per CTA (SwiGLU: 8 gate/up column pairs per tile); warps (4, 8 or 16):
// warps per CTA, splitting K. The f32-x launch equals the bf16-x launch on f32_to_bf16_array(x) bitwise.
// Returns cudaErrorInvalidValue for an unsupported shape or variant, else the launch status (sm_80+ only).
constexpr int kMmaGemvTiles[] = {1, 2};
constexpr int kMmaGemvWarps[] = {4, 8, 16};
cudaError_t mma_gemv_bf16(const GemvParams& p, int tiles, int warps, cudaStream_t s);
cudaError_t mma_gemv_swiglu_bf16(const GemvParams& p, int tiles, int warps, cudaStream_t s);

}  // namespace retroinfer::cuda::model
