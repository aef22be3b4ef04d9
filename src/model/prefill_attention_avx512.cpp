// The fused CPU prefill attention's tile on AVX-512 F (16 lanes, strips of 12 rows: 12 accumulators), compiled
// with -mavx2 -mfma -mavx512f and called only after a run-time check of the processor (prefill_attention.cpp).
// The body: prefill_attention_x86.h.
// GCC 12's AVX-512 intrinsics header reads its own _mm512_undefined_ps() values (GCC bug 105593): its
// -Wmaybe-uninitialized warnings about them are not this file's.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

namespace retroinfer::model {
namespace {

struct Vec {
  using T = __m512;
  static constexpr int kLanes = 16;
  static T zero() { return _mm512_setzero_ps(); }
  static T set(float x) { return _mm512_set1_ps(x); }
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static T broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T max(T a, T b) { return _mm512_max_ps(a, b); }
  static T fnmadd(T a, T b, T c) { return _mm512_fnmadd_ps(a, b, c); }
  static float first(T v) { return _mm512_cvtss_f32(v); }
  // 2^n per lane, t = round + n (exactly, for |n| < 2^22) as a float: n from the bits, into the exponent field.
  static T two_pow(T t, T round) {
    const __m512i n = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_castps_si512(round));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n, _mm512_set1_epi32(127)), 23));
  }
  // v where x >= limit, else 0.
  static T zero_below(T v, T x, float limit) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, set(limit), _CMP_GE_OQ), v);
  }
  // v with lanes >= count set to 0 (0 <= count <= 16).
  static T keep_first(T v, int64_t count) {
    return _mm512_maskz_mov_ps(static_cast<__mmask16>((1u << count) - 1u), v);
  }
  static float hmax(T v) { return _mm512_reduce_max_ps(v); }
  static float hsum(T v) { return _mm512_reduce_add_ps(v); }
};
constexpr int kStrip = 12;

}  // namespace
}  // namespace retroinfer::model

#include "model/prefill_attention_x86.h"

namespace retroinfer::model {

void fused_attention_tile_avx512(const FusedAttentionTile& tile) { attention_tile(tile); }

}  // namespace retroinfer::model
