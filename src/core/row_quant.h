// Per-row int8 quantisation of bf16 K/V rows: the wave buffer's int8 store (docs/wave-buffer.md
// "Compressed store"). The CUDA store fill and gather (src/kernels/wave_buffer_kernels.cu) call these same
// functions element by element, so the device rounds exactly as this CPU reference does.
//
// A row x of D values gets scale = absmax(x) / 127 and q_i = round_half_even(x_i * (127 / absmax)), clamped
// to [-127, 127] (-128 unused: the range stays symmetric); widened, w_i = bf16(q_i * scale). An all-zero row
// has scale 0 and q = 0 (widened exactly).
//
// Error bound, per element: |x_i - q_i * scale| <= scale * (1/2 + 2^-15). The 1/2 is the rounding to an
// integer; the rest bounds the f32 roundings of 127 / absmax, x_i * inv, absmax / 127 and q_i * scale (each
// <= 2^-24 relative, four of them, times |q_i| <= 127: 4 * 127 * 2^-24 < 2^-15). The bf16 widening adds at
// most |q_i * scale| * 2^-8 (round to nearest, 8 significant bits).
#pragma once

#include <cmath>
#include <cstdint>

#include "retroinfer/dtype.h"

namespace retroinfer {

// absmax / 127: the row's scale (0 for an all-zero row).
RETROINFER_HD float int8_row_scale(float absmax) { return absmax / 127.0f; }

// 127 / absmax: what the row's values are multiplied by before rounding (0 for an all-zero row).
RETROINFER_HD float int8_row_inverse(float absmax) { return absmax > 0.0f ? 127.0f / absmax : 0.0f; }

// One value: round_half_even(x * inv) clamped to [-127, 127].
RETROINFER_HD int8_t int8_quantize(float x, float inv) {
  float t = rintf(x * inv);
  t = t > 127.0f ? 127.0f : (t < -127.0f ? -127.0f : t);
  return static_cast<int8_t>(t);
}

// One value widened: bf16(q * scale), round to nearest even.
RETROINFER_HD uint16_t int8_widen_bf16(int8_t q, float scale) {
  return f32_to_bf16(static_cast<float>(q) * scale);
}

// A whole row (the CPU reference): q [d] int8 from x [d] bf16; returns the scale.
inline float int8_quantize_row(const uint16_t* x, int d, int8_t* q) {
  float absmax = 0.0f;
  for (int i = 0; i < d; ++i) absmax = std::fmax(absmax, std::fabs(bf16_to_f32(x[i])));
  const float inv = int8_row_inverse(absmax);
  for (int i = 0; i < d; ++i) q[i] = int8_quantize(bf16_to_f32(x[i]), inv);
  return int8_row_scale(absmax);
}

// A whole row widened (the CPU reference): out [d] bf16 from q [d] int8 and the row's scale.
inline void int8_widen_row(const int8_t* q, float scale, int d, uint16_t* out) {
  for (int i = 0; i < d; ++i) out[i] = int8_widen_bf16(q[i], scale);
}

}  // namespace retroinfer
