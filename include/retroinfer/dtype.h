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

enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

inline constexpr int dtype_size(DType t) { return t == DType::kF32 ? 4 : 2; }
std::string_view dtype_name(DType t);
// Parses "f32" | "f16" | "bf16"; throws Error on anything else.
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
