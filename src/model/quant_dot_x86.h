// The x86 SIMD bodies of the quantized row dots (quant_dot.h), included by exactly two translation units:
// quant_dot_avx2.cpp (-mavx2 -mfma -mf16c) and quant_dot_avx512.cpp (the same plus AVX-512 F/VL/BW/VNNI),
// which differ in one instruction: the 32-byte integer dot, maddubs + madd on AVX2, vpdpbusd with VNNI.
// Everything here has internal linkage and uses only intrinsics, so no inline function compiled for the
// wider ISA can be picked by the linker for baseline code.
//
// Every block's integer dot is exact (|u8 * s8 + u8 * s8| <= 2 * 31 * 127 < 2^15, so maddubs does not
// saturate for the 4- and 5-bit types; the signed Q8_0 / Q4_0 / Q5_0 go through |w| and sign(a, w), whose
// pair sums stay <= 2 * 127 * 127 < 2^15); the block is scaled in f32 and accumulated in 8 f32 lanes, so the
// result differs from the scalar reference only in the f32 rounding of the sum over blocks.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "io/ggml_k4_scales.h"
#include "model/quant_dot.h"

#ifndef RETROINFER_QUANT_DOT_VNNI
#error "define RETROINFER_QUANT_DOT_VNNI (0 or 1) before including quant_dot_x86.h"
#endif

namespace retroinfer::model {
namespace {

inline float f16(const uint8_t* p) {
  uint16_t h = 0;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// 8 int32 lanes: sums of 4 adjacent products u[i] * s[i] (u unsigned, s signed bytes).
inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if RETROINFER_QUANT_DOT_VNNI
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// Signed bytes w times signed bytes a.
inline __m256i dot_s8s8(__m256i w, __m256i a) { return dot_u8s8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w)); }

// 32 nibbles of 16 bytes in element order: low nibbles (elements 0..15), then high nibbles (16..31).
inline __m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

// 0x10 in byte j where bit j of the 32-bit qh is set (the fifth bit of Q5_0 / Q5_1 element j).
inline __m256i fifth_bits(const uint8_t* qh_bytes) {
  uint32_t qh = 0;
  std::memcpy(&qh, qh_bytes, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(qh)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

inline __m256i load_act(const int8_t* q) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)); }
inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256 scaled(__m256i idot, float scale, __m256 acc) {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(idot), _mm256_set1_ps(scale), acc);
}

// The per-block integer dots of each type, as 8 int32 lanes, and where the block's f16 scale (and min) lie.
struct BlockQ8_0 {
  static constexpr int kBytes = 34, kMin = -1;
  static __m256i idot(const uint8_t* w, __m256i a) {
    return dot_s8s8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2)), a);
  }
};
struct BlockQ4_0 {
  static constexpr int kBytes = 18, kMin = -1;
  static __m256i idot(const uint8_t* w, __m256i a) {
    return dot_s8s8(_mm256_sub_epi8(unpack_nibbles(w + 2), _mm256_set1_epi8(8)), a);
  }
};
struct BlockQ4_1 {
  static constexpr int kBytes = 20, kMin = 2;
  static __m256i idot(const uint8_t* w, __m256i a) { return dot_u8s8(unpack_nibbles(w + 4), a); }
};
struct BlockQ5_0 {
  static constexpr int kBytes = 22, kMin = -1;
  static __m256i idot(const uint8_t* w, __m256i a) {
    const __m256i q5 = _mm256_or_si256(unpack_nibbles(w + 6), fifth_bits(w + 2));
    return dot_s8s8(_mm256_sub_epi8(q5, _mm256_set1_epi8(16)), a);
  }
};
struct BlockQ5_1 {
  static constexpr int kBytes = 24, kMin = 2;
  static __m256i idot(const uint8_t* w, __m256i a) {
    return dot_u8s8(_mm256_or_si256(unpack_nibbles(w + 8), fifth_bits(w + 4)), a);
  }
};

// sum over blocks of d_w d_a idot (+ m_w d_a sum(q_a) for the types with a min). Two blocks per iteration into
// two accumulators, so that consecutive blocks' multiply-adds do not wait for each other.
template <class B>
float simd_dot(const uint8_t* w, Q8Row a, int64_t nb) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  float mins0 = 0.0f, mins1 = 0.0f;
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2, w += 2 * B::kBytes) {
    const __m256i i0 = B::idot(w, load_act(a.q + b * 32));
    const __m256i i1 = B::idot(w + B::kBytes, load_act(a.q + (b + 1) * 32));
    acc0 = scaled(i0, f16(w) * a.d[b], acc0);
    acc1 = scaled(i1, f16(w + B::kBytes) * a.d[b + 1], acc1);
    if constexpr (B::kMin >= 0) {
      mins0 += f16(w + B::kMin) * a.ds[b];
      mins1 += f16(w + B::kBytes + B::kMin) * a.ds[b + 1];
    }
  }
  if (b < nb) {
    acc0 = scaled(B::idot(w, load_act(a.q + b * 32)), f16(w) * a.d[b], acc0);
    if constexpr (B::kMin >= 0) mins0 += f16(w + B::kMin) * a.ds[b];
  }
  return hsum(_mm256_add_ps(acc0, acc1)) + (mins0 + mins1);
}

template <class B>
void simd_rows(const uint8_t* w, size_t row_bytes, int64_t rows, Q8Row a, int64_t nb, float* out) {
  for (int64_t r = 0; r < rows; ++r) out[r] = simd_dot<B>(w + static_cast<size_t>(r) * row_bytes, a, nb);
}

// ---- The K-quants (256-element blocks; layouts in src/io/ggml_quants.cpp), row by row ----------------------


// Q4_K (kFiveBits false) and Q5_K: x = (d sc_s) q - (dmin m_s) per sub-block s of 32; the 32 bytes of qs hold
// sub-blocks 2 j (low nibbles) and 2 j + 1 (high nibbles); Q5_K's fifth bit of element l of sub-block s is bit s
// of qh[l].
template <bool kFiveBits>
float k4_dot(const uint8_t* w, Q8Row a, int64_t nb32) {
  constexpr int kBytes = kFiveBits ? 176 : 144;
  const __m256i low = _mm256_set1_epi8(0x0f);
  __m256 acc = _mm256_setzero_ps();
  float mins = 0.0f;
  for (int64_t b = 0; b < nb32 / 8; ++b, w += kBytes) {
    const float d = f16(w), dmin = f16(w + 2);
    const uint8_t* scales = w + 4;
    const uint8_t* ql = w + (kFiveBits ? 48 : 16);
    const __m256i qh = kFiveBits ? load32(w + 16) : _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      const __m256i v = load32(ql + 32 * j);
      for (int half = 0; half < 2; ++half) {
        const int s = 2 * j + half;
        __m256i q = half == 0 ? _mm256_and_si256(v, low) : _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        if constexpr (kFiveBits) {
          const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << s));
          const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
          q = _mm256_or_si256(q, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
        }
        int sc = 0, m = 0;
        ggml::scale_min_k4(s, scales, sc, m);
        const int64_t ab = b * 8 + s;
        acc = scaled(dot_u8s8(q, load_act(a.q + ab * 32)), d * static_cast<float>(sc) * a.d[ab], acc);
        mins += dmin * static_cast<float>(m) * a.ds[ab];
      }
    }
  }
  return hsum(acc) - mins;
}

// Q6_K: x = d sc[i / 16] (q6_i - 32); per 128 elements n, ql[64 n ..] holds the low nibbles of sub-blocks 4 n
// (low nibbles of bytes 0..31), 4 n + 1 (of bytes 32..63), 4 n + 2 and 4 n + 3 (their high nibbles), qh[32 n + l]
// the two high bits of element l of each (bits 0-1, 2-3, 4-5, 6-7). A sub-block's two halves of 16 have their
// own scales: the dot's lanes 0-3 (elements 0..15) take the first, lanes 4-7 the second.
float q6k_dot(const uint8_t* w, Q8Row a, int64_t nb32) {
  const __m256i low = _mm256_set1_epi8(0x0f), two = _mm256_set1_epi8(3), off = _mm256_set1_epi8(32);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb32 / 8; ++b, w += 210) {
    const auto* sc = reinterpret_cast<const int8_t*>(w + 192);
    const float d = f16(w + 208);
    for (int n = 0; n < 2; ++n) {
      const __m256i ql0 = load32(w + 64 * n), ql1 = load32(w + 64 * n + 32), qh = load32(w + 128 + 32 * n);
      const __m256i nib[4] = {_mm256_and_si256(ql0, low), _mm256_and_si256(ql1, low),
                              _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low),
                              _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low)};
      for (int k = 0; k < 4; ++k) {
        const __m256i hi2 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), two);
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(nib[k], _mm256_slli_epi16(hi2, 4)), off);
        const int s = 4 * n + k;
        const int64_t ab = b * 8 + s;
        const float f = d * a.d[ab];
        const __m256 scale = _mm256_set_m128(_mm_set1_ps(f * static_cast<float>(sc[2 * s + 1])),
                                             _mm_set1_ps(f * static_cast<float>(sc[2 * s])));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_s8s8(q, load_act(a.q + ab * 32))), scale, acc);
      }
    }
  }
  return hsum(acc);
}

template <float (*F)(const uint8_t*, Q8Row, int64_t)>
void k_rows(const uint8_t* w, size_t row_bytes, int64_t rows, Q8Row a, int64_t nb, float* out) {
  for (int64_t r = 0; r < rows; ++r) out[r] = F(w + static_cast<size_t>(r) * row_bytes, a, nb);
}

RowDot simd_table(WeightType t) {
  switch (t) {
    case WeightType::kQ8_0: return simd_rows<BlockQ8_0>;
    case WeightType::kQ4_0: return simd_rows<BlockQ4_0>;
    case WeightType::kQ4_1: return simd_rows<BlockQ4_1>;
    case WeightType::kQ5_0: return simd_rows<BlockQ5_0>;
    case WeightType::kQ5_1: return simd_rows<BlockQ5_1>;
    case WeightType::kQ4_K: return k_rows<k4_dot<false>>;
    case WeightType::kQ5_K: return k_rows<k4_dot<true>>;
    case WeightType::kQ6_K: return k_rows<q6k_dot>;
    default: return nullptr;
  }
}

// ---- Row groups (quant_dot.h): 16 rows per group, as two halves of 8 rows (one int32 / f32 lane per row) ----

// acc + the 8 lanes' sums of 4 adjacent products u * s (u unsigned, s signed bytes); exact for the sums here.
inline __m256i dot_u8s8_acc(__m256i acc, __m256i u, __m256i s) {
#if RETROINFER_QUANT_DOT_VNNI
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}
inline __m256i dot_s8s8_acc(__m256i acc, __m256i w, __m256i a) {
  return dot_u8s8_acc(acc, _mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
}

// 4 activation bytes in every lane.
inline __m256i broadcast4(const int8_t* q) {
  int32_t v = 0;
  std::memcpy(&v, q, 4);
  return _mm256_set1_epi32(v);
}
inline __m256 load_f16x8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The group block of type T as compile-time constants of its layout (quant_dot.h's group_layout).
template <WeightType T>
struct GroupOf {
  static constexpr GroupLayout kLayout = group_layout(T);
  static_assert(kLayout.block_bytes > 0, "a type with a row-group layout");
  static constexpr int kBytes = kLayout.block_bytes * kGroupRows, kMin = kLayout.m_dst, kQh = kLayout.qh_dst,
                       kQs = kLayout.qs_dst, kOffset = kLayout.code_offset;
};
using GroupQ8_0 = GroupOf<WeightType::kQ8_0>;
using GroupQ4_0 = GroupOf<WeightType::kQ4_0>;
using GroupQ4_1 = GroupOf<WeightType::kQ4_1>;
using GroupQ5_0 = GroupOf<WeightType::kQ5_0>;
using GroupQ5_1 = GroupOf<WeightType::kQ5_1>;

// The integer dots of one group block: i[h] for rows 8 h .. 8 h + 7.
template <class G>
inline void group_block_idot(const uint8_t* p, const int8_t* aq, __m256i& i0, __m256i& i1) {
  if constexpr (std::is_same_v<G, GroupQ8_0>) {
    for (int c = 0; c < 8; ++c) {
      const __m256i ac = broadcast4(aq + 4 * c);
      i0 = dot_s8s8_acc(i0, load32(p + G::kQs + 64 * c), ac);
      i1 = dot_s8s8_acc(i1, load32(p + G::kQs + 64 * c + 32), ac);
    }
  } else {
    const __m256i low = _mm256_set1_epi8(0x0f);
    for (int c = 0; c < 4; ++c) {
      const __m256i alo = broadcast4(aq + 4 * c), ahi = broadcast4(aq + 16 + 4 * c);
      for (int h = 0; h < 2; ++h) {
        const __m256i v = load32(p + G::kQs + 64 * c + 32 * h);
        __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        if constexpr (G::kQh >= 0) {
          lo = _mm256_or_si256(lo, fifth_bits(p + G::kQh + 8 * c + 4 * h));
          hi = _mm256_or_si256(hi, fifth_bits(p + G::kQh + 8 * (c + 4) + 4 * h));
        }
        __m256i& i = h == 0 ? i0 : i1;
        i = dot_u8s8_acc(i, lo, alo);
        i = dot_u8s8_acc(i, hi, ahi);
      }
    }
  }
}

template <class G>
void simd_groups(const uint8_t* w, int64_t groups, Q8Row a, int64_t nb, float* out) {
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* p = w + static_cast<size_t>(g * nb) * G::kBytes;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b, p += G::kBytes) {
      __m256i i0 = _mm256_setzero_si256(), i1 = _mm256_setzero_si256();
      group_block_idot<G>(p, a.q + b * 32, i0, i1);
      if constexpr (G::kOffset > 0) {  // sum (q - o) a = sum q a - o sum a, exact in int32
        const __m256i o = _mm256_set1_epi32(G::kOffset * a.sum[b]);
        i0 = _mm256_sub_epi32(i0, o);
        i1 = _mm256_sub_epi32(i1, o);
      }
      const __m256 da = _mm256_set1_ps(a.d[b]);
      acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_mul_ps(load_f16x8(p), da), acc0);
      acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), _mm256_mul_ps(load_f16x8(p + 16), da), acc1);
      if constexpr (G::kMin >= 0) {
        const __m256 ds = _mm256_set1_ps(a.ds[b]);
        acc0 = _mm256_fmadd_ps(load_f16x8(p + G::kMin), ds, acc0);
        acc1 = _mm256_fmadd_ps(load_f16x8(p + G::kMin + 16), ds, acc1);
      }
    }
    _mm256_storeu_ps(out + g * kGroupRows, acc0);
    _mm256_storeu_ps(out + g * kGroupRows + 8, acc1);
  }
}

#if !RETROINFER_QUANT_DOT_VNNI  // the VNNI translation unit has 512-bit group kernels of its own
GroupDot simd_group_table(WeightType t) {
  switch (t) {
    case WeightType::kQ8_0: return simd_groups<GroupQ8_0>;
    case WeightType::kQ4_0: return simd_groups<GroupQ4_0>;
    case WeightType::kQ4_1: return simd_groups<GroupQ4_1>;
    case WeightType::kQ5_0: return simd_groups<GroupQ5_0>;
    case WeightType::kQ5_1: return simd_groups<GroupQ5_1>;
    default: return nullptr;
  }
}
#endif

}  // namespace
}  // namespace retroinfer::model
