// The AVX-512 VNNI kernels of quant_dot.h (row kernels in 256-bit vectors, group kernels in 512-bit ones,
// vpdpbusd for the integer dots); this file is compiled with the AVX2 flags plus -mavx512f -mavx512vl
// -mavx512bw -mavx512vnni (src/model/CMakeLists.txt) and only called after best_quant_isa() found those
// instructions.
#define RETROINFER_QUANT_DOT_VNNI 1
#include "model/quant_dot_x86.h"

namespace retroinfer::model {
namespace {

// Row groups in 512-bit vectors: the 16 rows of a group in one register (quant_dot.h), half the instructions of
// the two 8-row halves of quant_dot_x86.h.
inline __m512i broadcast4x16(const int8_t* q) {
  int32_t v = 0;
  std::memcpy(&v, q, 4);
  return _mm512_set1_epi32(v);
}
// The zero-masked forms of the conversions compile to the same instructions as the plain ones, whose GCC 12 forms
// start from an undefined vector that -Wmaybe-uninitialized reports.
inline __m512 load_f16x16(const uint8_t* p) {
  return _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512i load64(const uint8_t* p) { return _mm512_loadu_si512(p); }
// 0x10 in byte i where bit i of the 64-bit mask is set (the fifth bits of 16 rows x 4 elements).
inline __m512i fifth_bits16(const uint8_t* p) {
  uint64_t m = 0;
  std::memcpy(&m, p, 8);
  return _mm512_maskz_mov_epi8(m, _mm512_set1_epi8(0x10));
}

template <class G>
void zmm_groups(const uint8_t* w, int64_t groups, Q8Row a, int64_t nb, float* out) {
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* p = w + static_cast<size_t>(g * nb) * G::kBytes;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b, p += G::kBytes) {
      const int8_t* aq = a.q + b * 32;
      __m512i i = _mm512_setzero_si512();
      int offset = 0;  // sum (q - offset) a = sum q a - offset sum a (exact in int32)
      if constexpr (std::is_same_v<G, GroupQ8_0>) {
        // Signed bytes as unsigned ones plus 128 (w xor 0x80), so vpdpbusd takes them without a sign fix-up.
        const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
        for (int c = 0; c < 8; ++c)
          i = _mm512_dpbusd_epi32(i, _mm512_xor_si512(load64(p + G::kQs + 64 * c), flip), broadcast4x16(aq + 4 * c));
        offset = 128;
      } else {
        const __m512i low = _mm512_set1_epi8(0x0f);
        for (int c = 0; c < 4; ++c) {
          const __m512i v = load64(p + G::kQs + 64 * c);
          __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
          if constexpr (G::kQh >= 0) {
            lo = _mm512_or_si512(lo, fifth_bits16(p + G::kQh + 8 * c));
            hi = _mm512_or_si512(hi, fifth_bits16(p + G::kQh + 8 * (c + 4)));
          }
          i = _mm512_dpbusd_epi32(i, lo, broadcast4x16(aq + 4 * c));
          i = _mm512_dpbusd_epi32(i, hi, broadcast4x16(aq + 16 + 4 * c));
        }
        offset = G::kOffset;
      }
      if (offset > 0) i = _mm512_sub_epi32(i, _mm512_set1_epi32(offset * a.sum[b]));
      acc = _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xffff, i), _mm512_mul_ps(load_f16x16(p), _mm512_set1_ps(a.d[b])), acc);
      if constexpr (G::kMin >= 0) acc = _mm512_fmadd_ps(load_f16x16(p + G::kMin), _mm512_set1_ps(a.ds[b]), acc);
    }
    _mm512_storeu_ps(out + g * kGroupRows, acc);
  }
}

}  // namespace

RowDot avx512_row_dot(WeightType t) { return simd_table(t); }

GroupDot avx512_group_dot(WeightType t) {
  switch (t) {
    case WeightType::kQ8_0: return zmm_groups<GroupQ8_0>;
    case WeightType::kQ4_0: return zmm_groups<GroupQ4_0>;
    case WeightType::kQ4_1: return zmm_groups<GroupQ4_1>;
    case WeightType::kQ5_0: return zmm_groups<GroupQ5_0>;
    case WeightType::kQ5_1: return zmm_groups<GroupQ5_1>;
    default: return nullptr;
  }
}

}  // namespace retroinfer::model
