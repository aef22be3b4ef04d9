// Quantisation of bf16 K/V rows for the wave buffer's compressed stores (docs/wave-buffer.md "Compressed
// store"): int8 with one scale per row, int4 with one scale per group of 32 values, of the row minus its
// cluster's mean row (the base, kept on the GPU). The CUDA store fill (src/kernels/wave_buffer_kernels.cu)
// calls these same functions element by element, and the gather widens with the same arithmetic in fewer
// instructions (the GPU tests compare its bits with int8_widen_row / int4_widen_row), so the device rounds
// exactly as this CPU reference does.
//
// int8: a row x of D values gets scale = absmax(x) / 127 and q_i = round_half_even(x_i * (127 / absmax)), clamped
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
#include <cstring>

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

// int8 -> bf16 without a conversion instruction (the CUDA decode kernels' widening of the 8-bit KV cache's
// rows, kernels/decode.cu int8_chunk_to_bf16): t holds two int8 values q0, q1 in bits 0-7 and 16-23 (the rest
// zero); a = the bf16 pair 128 + (q & 127) and b = the bf16 pair 128 + (q & 128), i.e. 128 or 256, so that
// q = a - b exactly (both terms and the difference have at most 8 significant bits): one bf16x2 subtraction
// per two values.
RETROINFER_HD void int8_pair_bf16_terms(uint32_t t, uint32_t& a, uint32_t& b) {
  a = (t & 0x007f007fu) | 0x43004300u;
  b = (t & 0x00800080u) | 0x43004300u;
}

// ---- int8 rows of an f32 KV cache (the CPU runner's --kv-dtype int8) ----
//
// The same arithmetic from f32 rows, widened to f32 (q_i * scale, one f32 rounding) instead of bf16. A stored
// row is [d int8 | f32 scale]: stored_row_bytes(DType::kI8, d) bytes, its scale read by stored_row_scale.

inline void int8_quantize_kv_row(const float* x, int d, uint8_t* dst) {
  float absmax = 0.0f;
  for (int i = 0; i < d; ++i) absmax = std::fmax(absmax, std::fabs(x[i]));
  const float inv = int8_row_inverse(absmax), scale = int8_row_scale(absmax);
  for (int i = 0; i < d; ++i) dst[i] = static_cast<uint8_t>(int8_quantize(x[i], inv));
  std::memcpy(dst + d, &scale, 4);
}

[[gnu::always_inline]] inline void int8_widen_kv_row(const uint8_t* row, int d, float* out) {
  const float s = stored_row_scale(row, d);
  const auto* q = reinterpret_cast<const int8_t*>(row);
  for (int i = 0; i < d; ++i) out[i] = static_cast<float>(q[i]) * s;
}

// ---- int4: a bf16 scale per group of 32 values ----
//
// Each group of kInt4Group consecutive values of a row gets scale = bf16(absmax(group) / 7) and
// q_i = round_half_even(x_i / scale) clamped to [-7, 7] (-8 unused: symmetric), stored as a 4-bit two's
// complement nibble, value 2j in the low nibble of byte j. Widened, w_i = bf16(q_i * scale) (q_i * scale is
// exact in f32: 3 + 8 significant bits). A group whose scale is 0 (all zero, or absmax below bf16's
// smallest subnormal times 7) gets q = 0.
//
// Why groups and not rows: 4 bits leave 15 levels, so one outlier channel in a row scale would round the
// row's other channels to 0 or +-1 (real keys carry channels tens of times the rest); a group of 32 confines
// an outlier's coarse step to its own group. Why a bf16 scale: 2 bytes per 32 values (an f32 scale would add
// 10% to the bytes per miss), and its 8 significant bits are far finer than the 15 levels it scales.
//
// Error bound, per element: |x_i - q_i * scale| <= scale * (1/2 + 2^-20): the rounding to an integer, and
// the f32 roundings of 1 / scale and x_i * inv (each <= 2^-24 relative, |x_i * inv| <= 7 * (1 + 2^-8)) when
// not clamped; a clamped value is at most 7 * 2^-8 * scale past 7 * scale, since scale >= absmax / 7 *
// (1 - 2^-9). The bf16 widening adds at most |q_i * scale| * 2^-8 (11 significant bits rounded to 8).
constexpr int kInt4Group = 32;

// bf16(absmax / 7): the group's scale (0 for an all-zero group).
RETROINFER_HD uint16_t int4_group_scale(float absmax) { return f32_to_bf16(absmax / 7.0f); }

// 1 / scale: what the group's values are multiplied by before rounding (0 for a zero scale).
RETROINFER_HD float int4_group_inverse(uint16_t scale) {
  const float s = bf16_to_f32(scale);
  return s > 0.0f ? 1.0f / s : 0.0f;
}

// One value: round_half_even(x * inv) clamped to [-7, 7], as a nibble (two's complement, 4 bits).
RETROINFER_HD uint8_t int4_quantize(float x, float inv) {
  float t = rintf(x * inv);
  t = t > 7.0f ? 7.0f : (t < -7.0f ? -7.0f : t);
  return static_cast<uint8_t>(static_cast<int>(t) & 0xf);
}

// A nibble's signed value in [-8, 7].
RETROINFER_HD int int4_value(uint8_t nibble) { return static_cast<int>((nibble & 0xfu) ^ 0x8u) - 8; }

// One value widened: bf16(base + q * scale), rounded once (q * scale is exact in f32, so the device's fused
// multiply-add rounds as the CPU's multiply then add).
RETROINFER_HD uint16_t int4_widen_bf16(uint8_t nibble, float scale, float base = 0.0f) {
  return f32_to_bf16(base + static_cast<float>(int4_value(nibble)) * scale);
}

// ---- int4 rows relative to a base row ----
//
// The int4 store keeps each K (V) row of a cluster as the int4 groups of the row minus a base row: the mean of
// the cluster's K (V) rows, rounded to bf16. Keys carry large per-channel offsets shared by a head's tokens
// (Qwen2's K projection has a bias): 15 levels a group cannot resolve the small channels beside such an offset,
// but the difference to the cluster's mean holds only what varies within the cluster, a fraction of the
// offset (docs/wave-buffer.md "Compressed store"). The bound above holds with x_i - base_i in place of x_i,
// plus the bf16 rounding of base_i + q_i * scale.

// The base of s rows (x [s, d] bf16): the f32 sum of each column in row order, divided by s, rounded to
// bf16; all zero for s = 0. The device's fill sums in the same order and divides with __fdiv_rn.
inline void int4_base_row(const uint16_t* x, int64_t s, int d, uint16_t* base) {
  for (int i = 0; i < d; ++i) {
    float sum = 0.0f;
    for (int64_t r = 0; r < s; ++r) sum += bf16_to_f32(x[r * d + i]);
    base[i] = s > 0 ? f32_to_bf16(sum / static_cast<float>(s)) : uint16_t{0};
  }
}

// A whole row (the CPU reference): q [d / 2] packed nibbles and scales [d / 32] from x [d] bf16 minus the
// base row (nullptr: zero). d must be a multiple of kInt4Group.
inline void int4_quantize_row(const uint16_t* x, int d, uint8_t* q, uint16_t* scales, const uint16_t* base = nullptr) {
  float r[kInt4Group];
  for (int g = 0; g < d / kInt4Group; ++g) {
    float absmax = 0.0f;
    for (int i = 0; i < kInt4Group; ++i) {
      const int e = g * kInt4Group + i;
      r[i] = bf16_to_f32(x[e]) - (base != nullptr ? bf16_to_f32(base[e]) : 0.0f);
      absmax = std::fmax(absmax, std::fabs(r[i]));
    }
    scales[g] = int4_group_scale(absmax);
    const float inv = int4_group_inverse(scales[g]);
    for (int i = 0; i < kInt4Group; i += 2)
      q[(g * kInt4Group + i) / 2] = static_cast<uint8_t>(int4_quantize(r[i], inv) | (int4_quantize(r[i + 1], inv) << 4));
  }
}

// A whole row widened (the CPU reference): out [d] bf16 from q [d / 2] nibbles and scales [d / 32], plus the
// base row (nullptr: zero).
inline void int4_widen_row(const uint8_t* q, const uint16_t* scales, int d, uint16_t* out,
                           const uint16_t* base = nullptr) {
  for (int i = 0; i < d; ++i)
    out[i] = int4_widen_bf16(static_cast<uint8_t>(q[i / 2] >> (4 * (i % 2))), bf16_to_f32(scales[i / kInt4Group]),
                             base != nullptr ? bf16_to_f32(base[i]) : 0.0f);
}

}  // namespace retroinfer
