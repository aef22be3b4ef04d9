// The processor's vector extensions as the CPU kernels ask for them, and the AVX-512 kernels of the core layer.
#pragma once

#include <cstdint>

namespace retroinfer::core {

// AVX2 and FMA (decided once per process; false off x86-64).
bool cpu_has_avx2_fma();

// AVX-512 F, BW, DQ and VL (decided once per process; false off x86-64).
bool cpu_has_avx512();

// logits[g * ld + j] = scale * q_g . rows_j for the `group` query heads q [group, d] and the n rows [n, d] (f32),
// with head_dim d = 64 or 128; false (nothing written) for another d, on a processor without AVX-512 or off
// x86-64. The same sums as core::dot_lanes up to the order of the f32 additions.
bool row_logits_avx512(const float* rows, int64_t n, int d, const float* q, int group, float scale, float* logits,
                       int64_t ld);

}  // namespace retroinfer::core
