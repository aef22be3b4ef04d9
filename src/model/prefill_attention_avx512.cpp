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
  // e^x for x <= 0: core::exp_nonpositive's algorithm, as in prefill_attention_avx2.cpp, 16 lanes.
  static T exp_nonpositive(T x) {
    const T round = set(12582912.0f);
    const __mmask16 keep = _mm512_cmp_ps_mask(x, set(-87.0f), _CMP_GE_OQ);
    const T t = fma(x, set(1.44269504088896341f), round);
    const T n = sub(t, round);
    T r = _mm512_fnmadd_ps(n, set(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, set(1.42860682030941723e-6f), r);
    T p = set(1.0f / 5040.0f);
    p = fma(p, r, set(1.0f / 720.0f));
    p = fma(p, r, set(1.0f / 120.0f));
    p = fma(p, r, set(1.0f / 24.0f));
    p = fma(p, r, set(1.0f / 6.0f));
    p = fma(p, r, set(0.5f));
    p = fma(p, r, set(1.0f));
    p = fma(p, r, set(1.0f));
    const __m512i n_bits = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_castps_si512(round));
    const T two_n = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n_bits, _mm512_set1_epi32(127)), 23));
    return _mm512_maskz_mov_ps(keep, mul(p, two_n));
  }
  static float exp_first(float x) { return _mm512_cvtss_f32(exp_nonpositive(set(x))); }
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
