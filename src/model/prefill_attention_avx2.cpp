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
  // e^x for x <= 0: core::exp_nonpositive's algorithm (n = round(x / ln 2) from the rounding sum's bits, ln 2 in
  // two parts, a degree-7 Taylor polynomial of e^r, 2^n from the exponent bits, 0 below -87), with FMAs.
  static T exp_nonpositive(T x) {
    const T round = set(12582912.0f);
    const T keep = _mm256_cmp_ps(x, set(-87.0f), _CMP_GE_OQ);
    const T t = fma(x, set(1.44269504088896341f), round);
    const T n = sub(t, round);
    T r = _mm256_fnmadd_ps(n, set(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, set(1.42860682030941723e-6f), r);
    T p = set(1.0f / 5040.0f);
    p = fma(p, r, set(1.0f / 720.0f));
    p = fma(p, r, set(1.0f / 120.0f));
    p = fma(p, r, set(1.0f / 24.0f));
    p = fma(p, r, set(1.0f / 6.0f));
    p = fma(p, r, set(0.5f));
    p = fma(p, r, set(1.0f));
    p = fma(p, r, set(1.0f));
    const __m256i n_bits = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(round));
    const T two_n = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n_bits, _mm256_set1_epi32(127)), 23));
    return _mm256_and_ps(mul(p, two_n), keep);
  }
  static float exp_first(float x) { return _mm_cvtss_f32(_mm256_castps256_ps128(exp_nonpositive(set(x)))); }
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
