// The fused CPU prefill attention's tile on AVX2 + FMA (8 lanes, strips of 6 rows: 12 accumulators of the 16
// registers), compiled with -mavx2 -mfma and called only after a run-time check of the processor
// (prefill_attention.cpp). The body: prefill_attention_x86.h.
#include <immintrin.h>

#include <cstdint>

namespace retroinfer::model {
namespace {

struct Vec {
  using T = __m256;
  static constexpr int kLanes = 8;
  static T zero() { return _mm256_setzero_ps(); }
  static T set(float x) { return _mm256_set1_ps(x); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static T broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T max(T a, T b) { return _mm256_max_ps(a, b); }
  static T fnmadd(T a, T b, T c) { return _mm256_fnmadd_ps(a, b, c); }
  static float first(T v) { return _mm_cvtss_f32(_mm256_castps256_ps128(v)); }
  // 2^n per lane, t = round + n (exactly, for |n| < 2^22) as a float: n from the bits, into the exponent field.
  static T two_pow(T t, T round) {
    const __m256i n = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(round));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
  }
  // v where x >= limit, else 0.
  static T zero_below(T v, T x, float limit) { return _mm256_and_ps(v, _mm256_cmp_ps(x, set(limit), _CMP_GE_OQ)); }
  // v with lanes >= count set to 0 (0 <= count <= 8).
  static T keep_first(T v, int64_t count) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), lane)));
  }
  static float hmax(T v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
  }
  static float hsum(T v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
  }
};
constexpr int kStrip = 6;

}  // namespace
}  // namespace retroinfer::model

#include "model/prefill_attention_x86.h"

namespace retroinfer::model {

void fused_attention_tile_avx2(const FusedAttentionTile& tile) { attention_tile(tile); }

}  // namespace retroinfer::model
