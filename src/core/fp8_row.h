// FP8 (e4m3) K/V rows with a power-of-two scale per row: the `--kv-dtype fp8` storage of the KV cache
// (docs/model-runner.md "KV cache storage"). Host and device share these functions, so a kernel that stores or
// widens a row rounds exactly as this CPU reference does.
//
// The element format is OCP FP8 E4M3 ("e4m3fn"): 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; no
// infinities, the codes S.1111.111 are NaN; largest finite 448, smallest normal 2^-6, smallest subnormal 2^-9.
//
// A row x of d values is stored as d e4m3 codes of x_i / s followed by s as an f32: s = 2^k, the smallest power
// of two with absmax(x) <= 448 * s (so the row's largest value lands in (224, 448]), s = 0 for an all-zero row.
// Why a scale per row: a row keeps e4m3's 3-bit relative precision wherever its magnitude lies (keys carry
// channels of hundreds, values of hundredths), and no calibration pass or saturation is needed. Why a power of
// two: x_i / s and q_i * s are exact in f32, so the one rounding is e4m3's (round to nearest even) and the
// widened value is the stored one exactly.
//
// Error bound, per element: |x_i - w_i| <= 2^-4 * |x_i| where |x_i| / s >= 2^-6 (e4m3 normals: half a unit in
// the last of 4 significant bits), else <= 2^-10 * s (half the subnormal step), where s <= absmax / 224.
// Bytes per row: d + 4 (68 at d = 64, 132 at d = 128: 53% and 52% of bf16).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "retroinfer/dtype.h"

namespace retroinfer {

inline constexpr float kFp8Max = 448.0f;

// e4m3 code -> f32, exact. NaN codes widen to NaN (the quantiser never writes them).
RETROINFER_HD float fp8_e4m3_to_f32(uint8_t b) {
  const uint32_t mag = b & 0x7fu;
  float v;
  if (mag == 0x7fu) {
    v = NAN;
  } else if (mag < 8u) {  // subnormal (or zero): m * 2^-9
    v = static_cast<float>(mag) * 0x1p-9f;
  } else {  // normal: exponent e = mag >> 3 (bias 7 -> 127: + 120), mantissa bits moved to the top of f32's
    v = f32_from_bits((mag << 20) + (120u << 23));
  }
  return (b & 0x80u) ? -v : v;
}

// f32 -> e4m3 code, round to nearest even, saturating to +-448 (finite inputs never give NaN; a NaN input
// gives the NaN code).
RETROINFER_HD uint8_t f32_to_fp8_e4m3(float x) {
  const uint32_t u = f32_bits(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);
  const float a = fabsf(x);
  if (a < 0x1p-6f) {  // subnormal range: steps of 2^-9, exact scaling, one rounding (to 8 gives the normal 2^-6)
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(rintf(a * 512.0f)));
  }
  // Normal: round f32's 23 mantissa bits to 3, to nearest even (a carry bumps the exponent, as it should).
  uint32_t r = abs + 0x7ffffu + ((abs >> 20) & 1u);
  const int e = static_cast<int>(r >> 23) - 127 + 7;
  if (e > 15 || (e == 15 && ((r >> 20) & 7u) == 7u)) return static_cast<uint8_t>(sign | 0x7eu);  // past 448
  return static_cast<uint8_t>(sign | (static_cast<uint32_t>(e) << 3) | ((r >> 20) & 7u));
}

// The row's scale 2^k for its absolute maximum (0 for 0): the smallest power of two with absmax <= 448 * 2^k,
// k clamped to f32's normal range.
RETROINFER_HD float fp8_row_scale(float absmax) {
  if (!(absmax > 0.0f)) return 0.0f;
  int e;
  const float m = frexpf(absmax / kFp8Max, &e);  // absmax / 448 = m * 2^e, m in [0.5, 1)
  if (m == 0.5f) --e;                            // an exact power of two needs no headroom
  if (e < -126) e = -126;
  if (e > 127) e = 127;
  return ldexpf(1.0f, e);
}

// A whole row (the CPU reference): dst [d codes | f32 scale] (stored_row_bytes(DType::kF8E4M3, d) bytes) from
// x [d] f32.
inline void fp8_quantize_row(const float* x, int d, uint8_t* dst) {
  float absmax = 0.0f;
  for (int i = 0; i < d; ++i) absmax = std::fmax(absmax, std::fabs(x[i]));
  const float s = fp8_row_scale(absmax);
  const float inv = s > 0.0f ? 1.0f / s : 0.0f;  // a power of two: exact
  for (int i = 0; i < d; ++i) dst[i] = f32_to_fp8_e4m3(x[i] * inv);
  std::memcpy(dst + d, &s, 4);
}

// A whole row widened (the CPU reference): out [d] f32 from a stored row, equal to fp8_e4m3_to_f32(q_i) * s
// for every code the quantiser writes (a NaN code, never written, widens to +-480 here). The loop has no table
// or branch the compiler cannot turn into selects, so it vectorises.
[[gnu::always_inline]] inline void fp8_widen_row(const uint8_t* row, int d, float* out) {
  const float s = stored_row_scale(row, d);
  for (int i = 0; i < d; ++i) {
    const uint32_t b = row[i];
    const uint32_t mag = b & 0x7fu;
    const float sub = static_cast<float>(static_cast<int32_t>(mag)) * 0x1p-9f;
    const float normal = f32_from_bits((mag << 20) + (120u << 23));
    const float v = mag < 8u ? sub : normal;
    out[i] = f32_from_bits(f32_bits(v) | ((b & 0x80u) << 24)) * s;
  }
}

}  // namespace retroinfer
