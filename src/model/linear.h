// The CPU runner's products with a weight matrix: y[n, out] = x[n, in] @ W[out, in]^T + beta * y, for W in any
// storage of weight_matrix.h. Prefill chunks (Gemm::kBlas, n > 1) go through cblas_sgemm: f32 parts directly,
// block parts widened to f32 one tile of rows at a time. Decode rows (n = 1, or Gemm::kRows) are memory bound
// and read W once for all n rows: f32 parts through an OpenMP matvec, block parts through the quantized row
// dots of quant_dot.h with x quantized to 8 bits per 32-element block.
#pragma once

#include <cstdint>

#include "model/weight_matrix.h"

namespace retroinfer::model {

enum class Gemm : uint8_t {
  kBlas,  // cblas_sgemm when n > 1 (compute bound: prefill)
  kRows,  // per-row dot products whatever n (memory bound; a row's result does not depend on n)
};

// Prefill widens block weights in tiles of at most this many floats (16 MiB, a thread's buffer). Each
// cblas_sgemm call packs the chunk's activations anew, so a tile must hold many rows: at 1 MiB (~290 rows of a
// 0.5B model's FFN) that packing was ~13% of a prefill on an AVX2 host and Qwen2.5-Coder-0.5B prefilled 2048
// tokens at 107 tok/s; at 16 MiB, 143. The tile lives in L3 or memory; BLAS packs its own L2 panels from it.
inline constexpr int64_t kWidenTileFloats = int64_t{1} << 22;

// Whether a cblas call made inside an OpenMP parallel region runs on the calling thread alone: true for
// OpenBLAS's OpenMP build. Loops that give each thread its own BLAS calls (prefill attention's tiles, the layers
// of an index build) run in parallel only then; OpenBLAS's pthread build would start its own threads under each
// call. Defined in threads.cpp.
bool blas_serial_in_parallel_regions();

// x: [n, w.cols()] f32; y: [n, w.rows()] f32, read when beta != 0. All OpenMP threads of the process.
void linear(const float* x, const WeightMatrix& w, float* y, int64_t n, float beta, Gemm g);

}  // namespace retroinfer::model
