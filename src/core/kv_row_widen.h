// The KV cache's 8-bit rows (--kv-dtype fp8 | int8: d one-byte values and an f32 scale) widened to f32, for
// KvCache's readers and the CPU attention kernels (inlined into their per-instruction-set clones).
#pragma once

#include "core/fp8_row.h"
#include "core/row_quant.h"
#include "retroinfer/dtype.h"

namespace retroinfer {

// out [d] f32 from a stored row of t (kF8E4M3 or kI8).
[[gnu::always_inline]] inline void widen_scaled_8bit_row(DType t, const void* row, int d, float* out) {
  const auto* r = static_cast<const uint8_t*>(row);
  if (t == DType::kF8E4M3)
    fp8_widen_row(r, d, out);
  else
    int8_widen_kv_row(r, d, out);
}

// A widened 8-bit key row through its head's calibration (KeyCalibration): k = y * factor + mean. Out of line
// (kv_cache.cpp) so that KvCache's readers (load_key, dot_key) round alike. The exact-attention kernels do not
// call it: they score y with q * factor plus q . mean (attention/exact.cpp).
void calibrate_key_row(const float* mean, const float* factor, int d, float* row);

}  // namespace retroinfer
