// The body of the fused CPU prefill attention's tile (prefill_attention_tiles.h), written once over a vector type and
// included by exactly two translation units: prefill_attention_avx2.cpp (-mavx2 -mfma: 8 lanes, strips of 6 rows) and
// prefill_attention_avx512.cpp (the same plus -mavx512f: 16 lanes, strips of 12 rows). Each includes it after defining
// its vector type `Vec` (lanes, zero / set / load / store / broadcast / fma / fnmadd / add / mul / sub / max, the first
// lane, a lane mask, 2^n from a rounding sum, horizontal max and sum) and kStrip. Everything here has internal linkage
// and uses only intrinsics through Vec, so no inline function compiled for the wider ISA can be picked by the linker
// for baseline code.
//
// A tile is up to kFusedTileRows packed rows of one KV head (row r: position r / group, group member r % group, so
// a strip of rows spans the group's heads at one or two positions and its rows see nearly the same keys). Per
// block of kFusedKeyBlock keys, each strip of kStrip rows computes its scores in registers (kStrip rows x 16 keys:
// 2 x kStrip accumulators of 8 lanes or kStrip of 16, one broadcast of q per row and 16 keys' loads per depth
// step), runs the online softmax on them while they sit in L1, and adds P V into its output rows (kStrip rows x 16
// dims per pass over the keys); the key and value blocks stay in L2 across the tile's strips. What the BLAS path
// spends beside its two products (zeroing each score tile, packing Q and P, repacking each key and value block per
// tile) is gone.
#pragma once

#include <cstdint>

#include "model/prefill_attention_tiles.h"

namespace retroinfer::model {
namespace {

constexpr int kPanel = kFusedKeyPanel;
constexpr int kParts = kPanel / Vec::kLanes;  // vectors per 16 keys (scores) or 16 dims (values)
static_assert(kStrip * kParts <= 12 && kStrip <= kFusedMaxStripRows && kFusedTileRows % kStrip == 0,
              "accumulators fit the register file; strips tile the tile and its scratch");

// e^x for x <= 0 in Vec's lanes: core::exp_nonpositive's algorithm (n = round(x / ln 2) from the rounding sum's
// bits, ln 2 in two parts, a degree-7 Taylor polynomial of e^r, 2^n from the exponent bits, 0 below -87), with
// FMAs.
typename Vec::T exp_nonpositive(typename Vec::T x) {
  const typename Vec::T round = Vec::set(12582912.0f);  // 1.5 * 2^23: t = round + n exactly
  const typename Vec::T t = Vec::fma(x, Vec::set(1.44269504088896341f), round);
  const typename Vec::T n = Vec::sub(t, round);
  typename Vec::T r = Vec::fnmadd(n, Vec::set(0.693145751953125f), x);
  r = Vec::fnmadd(n, Vec::set(1.42860682030941723e-6f), r);
  typename Vec::T p = Vec::set(1.0f / 5040.0f);
  p = Vec::fma(p, r, Vec::set(1.0f / 720.0f));
  p = Vec::fma(p, r, Vec::set(1.0f / 120.0f));
  p = Vec::fma(p, r, Vec::set(1.0f / 24.0f));
  p = Vec::fma(p, r, Vec::set(1.0f / 6.0f));
  p = Vec::fma(p, r, Vec::set(0.5f));
  p = Vec::fma(p, r, Vec::set(1.0f));
  p = Vec::fma(p, r, Vec::set(1.0f));
  return Vec::zero_below(Vec::mul(p, Vec::two_pow(t, round)), x, -87.0f);
}

// s[r][j] = scale * q_r . key j for the strip's kStrip rows and `panels` panels of 16 keys (kp: the first
// panel, [d][16]); s's rows are kFusedKeyBlock floats apart.
void strip_scores(const float* const* q, const float* kp, int64_t panels, int d, float scale, float* s) {
  const typename Vec::T sc = Vec::set(scale);
  for (int64_t p = 0; p < panels; ++p, kp += int64_t{d} * kPanel) {
    typename Vec::T c[kStrip][kParts];
    for (int r = 0; r < kStrip; ++r)
      for (int h = 0; h < kParts; ++h) c[r][h] = Vec::zero();
    for (int k = 0; k < d; ++k) {
      typename Vec::T b[kParts];
      for (int h = 0; h < kParts; ++h) b[h] = Vec::load(kp + k * kPanel + h * Vec::kLanes);
      for (int r = 0; r < kStrip; ++r) {
        const typename Vec::T a = Vec::broadcast(q[r] + k);
        for (int h = 0; h < kParts; ++h) c[r][h] = Vec::fma(a, b[h], c[r][h]);
      }
    }
    for (int r = 0; r < kStrip; ++r)
      for (int h = 0; h < kParts; ++h)
        Vec::store(s + r * kFusedKeyBlock + p * kPanel + h * Vec::kLanes, Vec::mul(c[r][h], sc));
  }
}

// One row's online-softmax step over `valid` visible scores of `width` computed (width a multiple of 16):
// s -> e^(s - m') (0 from valid on), m' the new running maximum; l and the output row o [d] rescaled to m'.
void softmax_row(float* s, int64_t valid, int64_t width, float& m, float& l, float* o, int d) {
  constexpr int kL = Vec::kLanes;
  if (valid == 0) {
    for (int64_t j = 0; j < width; j += kL) Vec::store(s + j, Vec::zero());
    return;
  }
  const float neg_inf = -__builtin_inff();
  typename Vec::T mx_v = Vec::set(neg_inf);
  int64_t j = 0;
  for (; j + kL <= valid; j += kL) mx_v = Vec::max(mx_v, Vec::load(s + j));
  float mx = Vec::hmax(mx_v);
  for (int64_t t = j; t < valid; ++t) mx = s[t] > mx ? s[t] : mx;
  if (m > mx) mx = m;
  const float a = m == neg_inf ? 0.0f : Vec::first(exp_nonpositive(Vec::set(m - mx)));  // rescales the earlier blocks
  const typename Vec::T mv = Vec::set(mx);
  typename Vec::T sum = Vec::zero();
  for (j = 0; j + kL <= valid; j += kL) {
    const typename Vec::T e = exp_nonpositive(Vec::sub(Vec::load(s + j), mv));
    Vec::store(s + j, e);
    sum = Vec::add(sum, e);
  }
  if (j < width) {  // the vector holding `valid`: lanes at or past it are 0
    const typename Vec::T e = Vec::keep_first(exp_nonpositive(Vec::sub(Vec::load(s + j), mv)), valid - j);
    Vec::store(s + j, e);
    sum = Vec::add(sum, e);
    for (j += kL; j < width; j += kL) Vec::store(s + j, Vec::zero());
  }
  if (a != 1.0f) {
    const typename Vec::T av = Vec::set(a);
    for (int c = 0; c < d; c += kL) Vec::store(o + c, Vec::mul(Vec::load(o + c), av));
  }
  l = l * a + Vec::hsum(sum);
  m = mx;
}

// o[r] += sum over keys k < nk of p[r][k] * v[k] for the strip's rows (p rows kFusedKeyBlock apart, o rows d
// apart), 16 output dims at a time; vp: the first key's entry of dim panel 0, panels `panel_stride` floats apart
// (a panel holds 16 dims of every key, 64 bytes a key, so each pass streams its values in order).
void strip_values(const float* p, int64_t nk, const float* vp, int64_t panel_stride, int d, float* o) {
  for (int c0 = 0; c0 < d; c0 += kPanel, vp += panel_stride) {
    typename Vec::T acc[kStrip][kParts];
    for (int r = 0; r < kStrip; ++r)
      for (int h = 0; h < kParts; ++h) acc[r][h] = Vec::load(o + r * d + c0 + h * Vec::kLanes);
    const float* vk = vp;
    for (int64_t k = 0; k < nk; ++k, vk += kPanel) {
      typename Vec::T b[kParts];
      for (int h = 0; h < kParts; ++h) b[h] = Vec::load(vk + h * Vec::kLanes);
      for (int r = 0; r < kStrip; ++r) {
        const typename Vec::T a = Vec::broadcast(p + r * kFusedKeyBlock + k);
        for (int h = 0; h < kParts; ++h) acc[r][h] = Vec::fma(a, b[h], acc[r][h]);
      }
    }
    for (int r = 0; r < kStrip; ++r)
      for (int h = 0; h < kParts; ++h) Vec::store(o + r * d + c0 + h * Vec::kLanes, acc[r][h]);
  }
}

void attention_tile(const FusedAttentionTile& t) {
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
          for (int64_t j = 0; j < panels * kPanel; j += Vec::kLanes) Vec::store(s + j, Vec::zero());
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

}  // namespace
}  // namespace retroinfer::model
