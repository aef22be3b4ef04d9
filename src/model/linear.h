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

// x: [n, w.cols()] f32; y: [n, w.rows()] f32, read when beta != 0. All OpenMP threads of the process.
void linear(const float* x, const WeightMatrix& w, float* y, int64_t n, float beta, Gemm g);

}  // namespace retroinfer::model
