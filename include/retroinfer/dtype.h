// Storage dtypes and scalar conversions (host and device). Arithmetic always accumulates in f32.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#if defined(__CUDACC__)
#define RETROINFER_HD __host__ __device__ __forceinline__
#else
#define RETROINFER_HD inline
#endif

namespace retroinfer {

// kF8E4M3 and kI8: KV cache storage only, each row as 8-bit values and an f32 scale: e4m3 codes with a
// power-of-two scale (src/core/fp8_row.h), or int8 with scale absmax / 127 (src/core/row_quant.h).
enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kF8E4M3 = 3, kI8 = 4 };

// The 8-bit KV storages: rows of d one-byte values and their f32 scale.
inline constexpr bool is_scaled_8bit(DType t) { return t == DType::kF8E4M3 || t == DType::kI8; }
// Bytes of one element.
inline constexpr int dtype_size(DType t) { return t == DType::kF32 ? 4 : (is_scaled_8bit(t) ? 1 : 2); }
// Bytes of one stored K or V row of d elements: the elements, plus the f32 row scale of the 8-bit storages.
inline constexpr int64_t stored_row_bytes(DType t, int d) {
  return static_cast<int64_t>(d) * dtype_size(t) + (is_scaled_8bit(t) ? 4 : 0);
}
// An 8-bit row's f32 scale, stored behind its d values.
inline float stored_row_scale(const void* row, int d) {
  float s;
  std::memcpy(&s, static_cast<const uint8_t*>(row) + d, 4);
  return s;
}

// An f32's bits and back (host and device).
RETROINFER_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
RETROINFER_HD float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
std::string_view dtype_name(DType t);
// Parses "f32" | "f16" | "bf16" | "fp8" | "int8" (also "float32", "float16", "bfloat16", "f8e4m3", "e4m3",
// "i8"); throws Error on anything else.
DType parse_dtype(std::string_view s);

// bf16 <-> f32. Rounds to nearest even; NaN stays NaN (quiet).
RETROINFER_HD uint16_t f32_to_bf16(float f) {
  uint32_t u;
#if defined(__CUDA_ARCH__)
  u = __float_as_uint(f);
#else
  std::memcpy(&u, &f, 4);
#endif
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

RETROINFER_HD float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// IEEE half <-> f32 (host only; device code uses cuda_fp16).
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

}  // namespace retroinfer
