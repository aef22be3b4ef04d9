// AVX-512 building blocks over key-like rows (16 C floats or bf16 each): a row in registers, the logits of a few
// query heads against many rows with the heads held in registers. Included only by translation units compiled
// with -mavx512f -mavx512bw -mavx512dq -mavx512vl (src/attention/exact_avx512.cpp, src/core/simd_avx512.cpp)
// and called only after core::cpu_has_avx512(); internal linkage, so that no copy of them can stand in for
// baseline code at link time.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace retroinfer::core::avx512 {
namespace {

// The zero-masked forms of the intrinsics below compile to the same instructions as the plain ones, whose GCC 12
// forms start from an undefined vector that -Wmaybe-uninitialized reports.

// A key or value row (C x 16 elements, f32 or bf16) in registers.
template <int C>
inline void load_row(const void* src, bool bf16, __m512* r) {
  if (bf16) {
    for (int c = 0; c < C; ++c) {
      const __m256i h = _mm256_loadu_si256(static_cast<const __m256i*>(src) + c);
      const __m512i wide = _mm512_maskz_cvtepu16_epi32(0xffff, h);
      r[c] = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, wide, 16));
    }
  } else {
    for (int c = 0; c < C; ++c) r[c] = _mm512_loadu_ps(static_cast<const float*>(src) + 16 * c);
  }
}

// The sum of the 16 lanes.
inline float hsum16(__m512 a) {
  const __m256 s8 = _mm256_add_ps(_mm512_maskz_extractf32x8_ps(0xff, a, 0), _mm512_maskz_extractf32x8_ps(0xff, a, 1));
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
  return _mm_cvtss_f32(s4);
}

// The scaled logits of nb rows for query heads [g0, g0 + G) of q [group, 16 C]: s[g * ld + b] for row b.
template <int C, int G>
void block_logits(const void* const* krows, int nb, bool bf16, const float* q, int g0, float scale, float* s,
                  int64_t ld) {
  __m512 qr[G][C];
  for (int j = 0; j < G; ++j)
    for (int c = 0; c < C; ++c) qr[j][c] = _mm512_loadu_ps(q + (g0 + j) * C * 16 + 16 * c);
  for (int b = 0; b < nb; ++b) {
    __m512 k[C];
    load_row<C>(krows[b], bf16, k);
    for (int j = 0; j < G; ++j) {
      __m512 acc = _mm512_mul_ps(qr[j][0], k[0]);
      for (int c = 1; c < C; ++c) acc = _mm512_fmadd_ps(qr[j][c], k[c], acc);
      s[(g0 + j) * ld + b] = hsum16(acc) * scale;
    }
  }
}

// Op<C, G>::run(g0, args...) over the `group` query heads in chunks [g0, g0 + G) of at most 4 (head_dim 64) or
// 2 (128) heads: 4 x C registers of queries or output rows a chunk, within the 32 vector registers.
template <int C, template <int, int> class Op, typename... Args>
void by_head_chunks(int group, Args... args) {
  constexpr int kHeads = C == 4 ? 4 : 2;
  for (int g0 = 0; g0 < group; g0 += kHeads) {
    switch (group - g0 < kHeads ? group - g0 : kHeads) {
      case 4: Op<C, 4>::run(g0, args...); break;
      case 3: Op<C, 3>::run(g0, args...); break;
      case 2: Op<C, 2>::run(g0, args...); break;
      default: Op<C, 1>::run(g0, args...); break;
    }
  }
}

// block_logits as an Op of by_head_chunks.
template <int C, int G>
struct LogitsOp {
  static void run(int g0, const void* const* krows, int nb, bool bf16, const float* q, float scale, float* s,
                  int64_t ld) {
    block_logits<C, G>(krows, nb, bf16, q, g0, scale, s, ld);
  }
};

}  // namespace
}  // namespace retroinfer::core::avx512
