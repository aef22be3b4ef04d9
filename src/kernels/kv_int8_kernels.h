// The 8-bit KV cache's row kernels (kv_int8.cu): bf16 K/V rows quantised into int8 rows with an f32 scale each
// (core/row_quant.h's int8 arithmetic: s = absmax / 127, q = round_half_even(x * 127 / absmax) in [-127, 127]),
// and int8 rows widened back to bf16 (bf16(q * s), row_quant.h int8_widen_bf16). Layouts per flat head h:
// bf16 rows at src + h * src_head_stride * D, int8 rows at q + h * q_head_stride * D with their scales at
// scale + h * q_head_stride. Launchers validate nothing and return the launch status.
//
// Keys are stored relative to a key calibration (kv_int8_cache.h): per flat head and channel a mean and a
// factor, x = (k - mean) / factor before the row scale, k = bf16(x * factor + mean) widened (each operation
// rounded once, as the CPU's KvCache does with its calibration). kv_int8_key_calibration computes one from
// rows [0, n) of each head.
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
  // The key calibration ([H, D] f32 each): K rows are quantised from (k - mean) / factor and widened back to
  // y * factor + mean. nullptr: K rows as they are (V rows always are).
  const float* k_mean = nullptr;
  const float* k_factor = nullptr;
};
// Quantises: src rows -> q rows.
cudaError_t kv_int8_quantize(const KvInt8RowsCopy& p, cudaStream_t s);
// Widens: q rows -> src rows (src_k / src_v written: bf16(q * scale), keys calibrated back).
cudaError_t kv_int8_widen(const KvInt8RowsCopy& p, cudaStream_t s);

// The key calibration of rows [0, n) of each flat head of k (bf16 [H, head_stride, D]): mean[h, i] the
// channel's mean over the rows; factor[h, i] = sqrt(max(dev_i, kKeyFactorFloor * max_j dev_j)) with dev_i =
// max_t |k[t, i] - mean_i| (1 where the head's rows do not vary, and mean 0, factor 1 for n = 0).
// Deterministic: partial sums and maxima per (head, split) in `partials`, reduced in a fixed order.
inline constexpr int kKeyStatSplits = 32;
// A channel's deviation counts as at least 1/100 of the head's largest: a prompt of a few tokens leaves some
// channels nearly constant, and a factor near 0 would magnify their later values past every other channel's.
inline constexpr float kKeyFactorFloor = 0.01f;
struct KvKeyCalibrationParams {
  const uint16_t* k = nullptr;
  int64_t head_stride = 0;
  int64_t n = 0;
  int num_heads = 0, head_dim = 0;  // head_dim 64 or 128
  float* partials = nullptr;        // [2, H, kKeyStatSplits, D] scratch
  float* mean = nullptr;            // [H, D]
  float* factor = nullptr;          // [H, D]
};
cudaError_t kv_int8_key_calibration(const KvKeyCalibrationParams& p, cudaStream_t s);

}  // namespace retroinfer::cuda::detail
