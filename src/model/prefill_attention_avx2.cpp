// The AVX2 + FMA body of the fused CPU prefill attention (prefill_attention_tiles.h), compiled with
// -mavx2 -mfma and called only after a run-time check of the processor (prefill_attention.cpp). Intrinsics and
// plain loops only, every helper of internal linkage: no inline function compiled here for the wider ISA can be
// picked by the linker for baseline code.
//
// A tile is up to kTileRows packed rows of one KV head (row r: position r / group, group member r % group, so a
// strip of rows spans the group's heads at one or two positions and its rows see nearly the same keys). Per
// block of kKeyBlock keys, each strip of kStrip rows computes its scores in registers (6 rows x 16 keys, 12
// accumulators, one broadcast of q per row and two loads of the key panel per depth step), runs the online
// softmax on them while they sit in L1, and adds P V into its output rows (6 rows x 16 dims per pass); the key
// and value block stay in L2 across the tile's strips. What the BLAS path spends beside its two products
// (zeroing each score tile, packing Q and P, repacking each key and value block per tile) is gone.
#include <immintrin.h>

#include <cstdint>

#include "model/prefill_attention_tiles.h"

namespace retroinfer::model {
namespace {

constexpr int kStrip = kFusedStripRows;
constexpr int kPanel = kFusedKeyPanel;

// e^x for x <= 0 in 8 lanes: core::exp_nonpositive's algorithm (n = round(x / ln 2) from the rounding sum's bits,
// ln 2 in two parts, a degree-7 Taylor polynomial of e^r, 2^n from the exponent bits, 0 below -87), with FMAs.
inline __m256 exp_nonpositive8(__m256 x) {
  const __m256 round = _mm256_set1_ps(12582912.0f);
  const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ);
  const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), round);
  const __m256 n = _mm256_sub_ps(t, round);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860682030941723e-6f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i n_bits = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(round));
  const __m256 two_n = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n_bits, _mm256_set1_epi32(127)), 23));
  return _mm256_and_ps(_mm256_mul_ps(p, two_n), keep);
}

inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// s[r][j] = scale * q_r . key j for the strip's kStrip rows and `panels` panels of 16 keys (kp: the first
// panel, [d][16]); s's rows are kFusedKeyBlock floats apart.
void strip_scores(const float* const* q, const float* kp, int64_t panels, int d, float scale, float* s) {
  const __m256 sc = _mm256_set1_ps(scale);
  for (int64_t p = 0; p < panels; ++p, kp += int64_t{d} * kPanel) {
    __m256 c[kStrip][2];
    for (int r = 0; r < kStrip; ++r) c[r][0] = c[r][1] = _mm256_setzero_ps();
    for (int k = 0; k < d; ++k) {
      const __m256 b0 = _mm256_loadu_ps(kp + k * kPanel), b1 = _mm256_loadu_ps(kp + k * kPanel + 8);
      for (int r = 0; r < kStrip; ++r) {
        const __m256 a = _mm256_broadcast_ss(q[r] + k);
        c[r][0] = _mm256_fmadd_ps(a, b0, c[r][0]);
        c[r][1] = _mm256_fmadd_ps(a, b1, c[r][1]);
      }
    }
    for (int r = 0; r < kStrip; ++r) {
      float* dst = s + r * kFusedKeyBlock + p * kPanel;
      _mm256_storeu_ps(dst, _mm256_mul_ps(c[r][0], sc));
      _mm256_storeu_ps(dst + 8, _mm256_mul_ps(c[r][1], sc));
    }
  }
}

// One row's online-softmax step over `valid` visible scores of `width` computed (width a multiple of 8):
// s -> e^(s - m') (0 from valid on), m' the new running maximum; l and the output row o [d] rescaled to m'.
void softmax_row(float* s, int64_t valid, int64_t width, float& m, float& l, float* o, int d) {
  if (valid == 0) {
    for (int64_t j = 0; j < width; j += 8) _mm256_storeu_ps(s + j, _mm256_setzero_ps());
    return;
  }
  const float neg_inf = -__builtin_inff();
  __m256 mx8 = _mm256_set1_ps(neg_inf);
  int64_t j = 0;
  for (; j + 8 <= valid; j += 8) mx8 = _mm256_max_ps(mx8, _mm256_loadu_ps(s + j));
  float mx = hmax8(mx8);
  for (int64_t t = j; t < valid; ++t) mx = s[t] > mx ? s[t] : mx;
  if (m > mx) mx = m;
  const float a = m == neg_inf ? 0.0f : _mm_cvtss_f32(_mm256_castps256_ps128(exp_nonpositive8(_mm256_set1_ps(m - mx))));
  const __m256 mv = _mm256_set1_ps(mx);
  __m256 sum8 = _mm256_setzero_ps();
  for (j = 0; j + 8 <= valid; j += 8) {
    const __m256 e = exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
    _mm256_storeu_ps(s + j, e);
    sum8 = _mm256_add_ps(sum8, e);
  }
  if (j < width) {  // the block of 8 holding `valid`: lanes at or past it are masked to 0
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 live = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(valid - j)), lane));
    const __m256 e = _mm256_and_ps(exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv)), live);
    _mm256_storeu_ps(s + j, e);
    sum8 = _mm256_add_ps(sum8, e);
    for (j += 8; j < width; j += 8) _mm256_storeu_ps(s + j, _mm256_setzero_ps());
  }
  if (a != 1.0f) {
    const __m256 av = _mm256_set1_ps(a);
    for (int c = 0; c < d; c += 8) _mm256_storeu_ps(o + c, _mm256_mul_ps(_mm256_loadu_ps(o + c), av));
  }
  l = l * a + hsum8(sum8);
  m = mx;
}

// o[r] += sum over keys k < nk of p[r][k] * v[k] for the strip's rows (p rows kFusedKeyBlock apart, o rows d
// apart), 16 output dims at a time; vp: the first key's entry of dim panel 0, panels `panel_stride` floats apart
// (a panel holds 16 dims of every key, 64 bytes a key, so each pass streams its values in order).
void strip_values(const float* p, int64_t nk, const float* vp, int64_t panel_stride, int d,
                                    float* o) {
  for (int c0 = 0; c0 < d; c0 += kPanel, vp += panel_stride) {
    __m256 acc[kStrip][2];
    for (int r = 0; r < kStrip; ++r) {
      acc[r][0] = _mm256_loadu_ps(o + r * d + c0);
      acc[r][1] = _mm256_loadu_ps(o + r * d + c0 + 8);
    }
    const float* vk = vp;
    for (int64_t k = 0; k < nk; ++k, vk += kPanel) {
      const __m256 b0 = _mm256_loadu_ps(vk), b1 = _mm256_loadu_ps(vk + 8);
      for (int r = 0; r < kStrip; ++r) {
        const __m256 a = _mm256_broadcast_ss(p + r * kFusedKeyBlock + k);
        acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
      }
    }
    for (int r = 0; r < kStrip; ++r) {
      _mm256_storeu_ps(o + r * d + c0, acc[r][0]);
      _mm256_storeu_ps(o + r * d + c0 + 8, acc[r][1]);
    }
  }
}

}  // namespace

void fused_attention_tile_avx2(const FusedAttentionTile& t) {
  const int d = t.d, group = t.group;
  const int64_t strips = (t.rows + kStrip - 1) / kStrip, padded = strips * kStrip;
  const float neg_inf = -__builtin_inff();
  for (int64_t r = 0; r < padded; ++r) {
    t.m[r] = neg_inf;
    t.l[r] = 0.0f;
  }
  for (int64_t e = 0; e < padded * d; ++e) t.o[e] = 0.0f;
  const int64_t last = t.r0 + t.rows - 1;
  const int64_t visible = t.pos0 + last / group + 1;  // keys the tile's last row sees
  for (int64_t k0 = 0; k0 < visible; k0 += kFusedKeyBlock) {
    const int64_t kb = visible - k0 < kFusedKeyBlock ? visible - k0 : kFusedKeyBlock;
    for (int64_t st = 0; st < strips; ++st) {
      const int64_t s0 = st * kStrip, live = t.rows - s0 < kStrip ? t.rows - s0 : kStrip;
      const int64_t strip_last = t.r0 + s0 + live - 1;
      int64_t seen = t.pos0 + strip_last / group + 1 - k0;  // keys of this block the strip's last row sees
      if (seen <= 0) continue;
      if (seen > kb) seen = kb;
      const float* q[kStrip];
      for (int r = 0; r < kStrip; ++r) {
        const int64_t row = t.r0 + s0 + (r < live ? r : live - 1);  // rows past the tile repeat its last
        q[r] = t.q + (row / group) * t.q_stride + (row % group) * d;
      }
      const int64_t panels = (seen + kPanel - 1) / kPanel;
      strip_scores(q, t.kp + (k0 / kPanel) * int64_t{d} * kPanel, panels, d, t.scale, t.s);
      for (int r = 0; r < kStrip; ++r) {
        float* s = t.s + r * kFusedKeyBlock;
        if (r >= live) {  // a repeated row: weight 0, its output row is scratch
          for (int64_t j = 0; j < panels * kPanel; j += 8) _mm256_storeu_ps(s + j, _mm256_setzero_ps());
          continue;
        }
        const int64_t row = t.r0 + s0 + r;
        int64_t valid = t.pos0 + row / group + 1 - k0;  // causal: keys <= the row's position
        valid = valid < 0 ? 0 : (valid > seen ? seen : valid);
        softmax_row(s, valid, panels * kPanel, t.m[s0 + r], t.l[s0 + r], t.o + (s0 + r) * d, d);
      }
      strip_values(t.s, seen, t.vp + k0 * kPanel, t.v_panel_stride, d, t.o + s0 * d);
    }
  }
  for (int64_t r = 0; r < t.rows; ++r) {
    const int64_t row = t.r0 + r;
    const float inv = 1.0f / t.l[r];  // l >= 1: the row's own maximum contributes e^0
    float* dst = t.out + (row / group) * t.q_stride + (row % group) * d;
    for (int c = 0; c < d; ++c) dst[c] = t.o[r * d + c] * inv;
  }
}

}  // namespace retroinfer::model
