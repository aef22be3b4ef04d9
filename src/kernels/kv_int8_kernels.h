// The 8-bit KV cache's row kernels (kv_int8.cu): bf16 K/V rows quantised into int8 rows with an f32 scale each
// (core/row_quant.h's int8 arithmetic: s = absmax / 127, q = round_half_even(x * 127 / absmax) in [-127, 127]),
// and int8 rows widened back to bf16 (bf16(q * s), row_quant.h int8_widen_bf16). Layouts per flat head h:
// bf16 rows at src + h * src_head_stride * D, int8 rows at q + h * q_head_stride * D with their scales at
// scale + h * q_head_stride. Launchers validate nothing and return the launch status.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace retroinfer::cuda::detail {

// Rows r in [0, rows) of every flat head: bf16 row r -> int8 row q_row0 + r (K and V in one launch).
struct KvInt8RowsCopy {
  const uint16_t* src_k = nullptr;  // bf16 [H, src_head_stride, D]
  const uint16_t* src_v = nullptr;
  int64_t src_head_stride = 0;
  int8_t* q_k = nullptr;  // int8 [H, q_head_stride, D], 16-byte aligned rows
  int8_t* q_v = nullptr;
  float* scale_k = nullptr;  // [H, q_head_stride]
  float* scale_v = nullptr;
  int64_t q_head_stride = 0, q_row0 = 0;
  int64_t rows = 0;
  int num_heads = 0, head_dim = 0;  // head_dim 64 or 128
};
// Quantises: src rows -> q rows.
cudaError_t kv_int8_quantize(const KvInt8RowsCopy& p, cudaStream_t s);
// Widens: q rows -> src rows (src_k / src_v written: bf16(q * scale)).
cudaError_t kv_int8_widen(const KvInt8RowsCopy& p, cudaStream_t s);

}  // namespace retroinfer::cuda::detail
