// Activation quantization, the scalar reference kernels and the run-time choice of kernels (quant_dot.h).
// Block layouts: src/io/ggml_quants.cpp (Q5_0 .. Q6_K) and src/io/model_file.cpp (Q8_0, Q4_0, Q4_1).
#include "model/quant_dot.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "io/ggml_k4_scales.h"
#include "retroinfer/dtype.h"
#include "retroinfer/error.h"

namespace retroinfer::model {
namespace {

int round_to_int(float v) {
#if defined(__SSE2__)
  return _mm_cvtss_si32(_mm_set_ss(v));
#else
  return static_cast<int>(std::nearbyint(v));
#endif
}

float load_f16(const uint8_t* p) { return f16_to_f32(static_cast<uint16_t>(p[0] | (p[1] << 8))); }

uint32_t load_u32(const uint8_t* p) {
  uint32_t v = 0;
  std::memcpy(&v, p, 4);
  return v;
}

// The 32 block elements' integer codes of the 32-element types, in element order, and the offset that
// turns a code into the signed value (Q4_0: 8, Q5_0: 16) or the presence of a min (Q4_1, Q5_1).
void unpack_q4(const uint8_t* qs, int* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = qs[j] & 0x0f;
    q[j + 16] = qs[j] >> 4;
  }
}

void unpack_q5(const uint8_t* qh_bytes, const uint8_t* qs, int* q) {
  const uint32_t qh = load_u32(qh_bytes);
  unpack_q4(qs, q);
  for (int j = 0; j < 32; ++j) q[j] |= static_cast<int>((qh >> j) & 1u) << 4;
}

int32_t idot32(const int* q, const int8_t* a) {
  int32_t s = 0;
  for (int j = 0; j < 32; ++j) s += q[j] * a[j];
  return s;
}

float dot_q8_0(const uint8_t* w, Q8Row a, int64_t nb) {
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b, w += 34) {
    const auto* qw = reinterpret_cast<const int8_t*>(w + 2);
    int32_t s = 0;
    for (int j = 0; j < 32; ++j) s += qw[j] * a.q[b * 32 + j];
    acc += load_f16(w) * a.d[b] * static_cast<float>(s);
  }
  return acc;
}

float dot_q4_0(const uint8_t* w, Q8Row a, int64_t nb) {
  float acc = 0.0f;
  int q[32];
  for (int64_t b = 0; b < nb; ++b, w += 18) {
    unpack_q4(w + 2, q);
    for (int& v : q) v -= 8;
    acc += load_f16(w) * a.d[b] * static_cast<float>(idot32(q, a.q + b * 32));
  }
  return acc;
}

float dot_q4_1(const uint8_t* w, Q8Row a, int64_t nb) {
  float acc = 0.0f;
  int q[32];
  for (int64_t b = 0; b < nb; ++b, w += 20) {
    unpack_q4(w + 4, q);
    acc += load_f16(w) * a.d[b] * static_cast<float>(idot32(q, a.q + b * 32)) +
           load_f16(w + 2) * a.ds[b];
  }
  return acc;
}

float dot_q5_0(const uint8_t* w, Q8Row a, int64_t nb) {
  float acc = 0.0f;
  int q[32];
  for (int64_t b = 0; b < nb; ++b, w += 22) {
    unpack_q5(w + 2, w + 6, q);
    for (int& v : q) v -= 16;
    acc += load_f16(w) * a.d[b] * static_cast<float>(idot32(q, a.q + b * 32));
  }
  return acc;
}

float dot_q5_1(const uint8_t* w, Q8Row a, int64_t nb) {
  float acc = 0.0f;
  int q[32];
  for (int64_t b = 0; b < nb; ++b, w += 24) {
    unpack_q5(w + 4, w + 8, q);
    acc += load_f16(w) * a.d[b] * static_cast<float>(idot32(q, a.q + b * 32)) +
           load_f16(w + 2) * a.ds[b];
  }
  return acc;
}

// Q4_K (five_bits false) and Q5_K: 256-element blocks of 8 sub-blocks of 32, x = (d sc_s) q - (dmin m_s).
template <bool kFiveBits>
float dot_k4(const uint8_t* w, Q8Row a, int64_t nb32) {
  constexpr int kBytes = kFiveBits ? 176 : 144;
  float acc = 0.0f;
  int q[32];
  for (int64_t b = 0; b < nb32 / 8; ++b, w += kBytes) {
    const float d = load_f16(w), dmin = load_f16(w + 2);
    const uint8_t* scales = w + 4;
    const uint8_t* qh = kFiveBits ? w + 16 : nullptr;
    const uint8_t* ql = w + (kFiveBits ? 48 : 16);
    for (int s = 0; s < 8; ++s) {  // sub-block s: elements [32 s, 32 s + 32)
      const uint8_t* qs = ql + (s / 2) * 32;
      for (int l = 0; l < 32; ++l) {
        q[l] = s % 2 == 0 ? qs[l] & 0x0f : qs[l] >> 4;
        if (kFiveBits) q[l] |= ((qh[l] >> s) & 1) << 4;
      }
      int sc = 0, m = 0;
      ggml::scale_min_k4(s, scales, sc, m);
      const int64_t ab = b * 8 + s;
      acc += d * static_cast<float>(sc) * a.d[ab] * static_cast<float>(idot32(q, a.q + ab * 32)) -
             dmin * static_cast<float>(m) * a.ds[ab];
    }
  }
  return acc;
}

// Q6_K: 256-element blocks, x = d * sc[i / 16] * (q6_i - 32).
float dot_q6_k(const uint8_t* w, Q8Row a, int64_t nb32) {
  float acc = 0.0f;
  int q[256];
  for (int64_t b = 0; b < nb32 / 8; ++b, w += 210) {
    const uint8_t* ql = w;
    const uint8_t* qh = w + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(w + 192);
    const float d = load_f16(w + 208);
    for (int n = 0; n < 2; ++n, ql += 64, qh += 32) {
      int* y = q + 128 * n;
      for (int l = 0; l < 32; ++l) {
        y[l] = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
        y[l + 32] = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
        y[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        y[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      }
    }
    for (int s = 0; s < 8; ++s) {
      const int64_t ab = b * 8 + s;
      const int8_t* x = a.q + ab * 32;
      int32_t lo = 0, hi = 0;
      for (int l = 0; l < 16; ++l) lo += q[32 * s + l] * x[l];
      for (int l = 16; l < 32; ++l) hi += q[32 * s + l] * x[l];
      acc += a.d[ab] * (d * static_cast<float>(sc[2 * s]) * static_cast<float>(lo) +
                        d * static_cast<float>(sc[2 * s + 1]) * static_cast<float>(hi));
    }
  }
  return acc;
}

// Element of mask k, bit j (quant_dot.h): the fifth bits in the order the nibble vectors hold their elements.
int mask_element(int k, int j) { return k < 4 ? 4 * k + j : 16 + 4 * (k - 4) + j; }

// The file's block of row r (0..15) from group block g (L.block_bytes bytes to dst).
void unpack_group_block(const GroupLayout& L, const uint8_t* g, int r, uint8_t* dst) {
  std::memcpy(dst + L.d_src, g + 2 * r, 2);
  if (L.m_src >= 0) std::memcpy(dst + L.m_src, g + L.m_dst + 2 * r, 2);
  if (L.qh_src >= 0) {
    uint32_t qh = 0;
    for (int k = 0; k < 8; ++k) {
      uint64_t mask = 0;
      std::memcpy(&mask, g + L.qh_dst + 8 * k, 8);
      for (int j = 0; j < 4; ++j) qh |= static_cast<uint32_t>((mask >> (4 * r + j)) & 1u) << mask_element(k, j);
    }
    std::memcpy(dst + L.qh_src, &qh, 4);
  }
  for (int c = 0; c < L.qs_bytes / 4; ++c) std::memcpy(dst + L.qs_src + 4 * c, g + L.qs_dst + 64 * c + 4 * r, 4);
}

// The scalar group kernel: each row's blocks rebuilt as the file stored them and summed by the scalar row kernel
// one block at a time, in block order (the same f32 sums as the row kernel: bit for bit).
template <float (*F)(const uint8_t*, Q8Row, int64_t), WeightType T>
void scalar_groups(const uint8_t* w, int64_t groups, Q8Row a, int64_t nb, float* out) {
  const GroupLayout L = group_layout(T);
  const size_t gb = static_cast<size_t>(L.block_bytes) * kGroupRows;
  uint8_t block[64];
  for (int64_t g = 0; g < groups; ++g)
    for (int r = 0; r < kGroupRows; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        unpack_group_block(L, w + (static_cast<size_t>(g * nb + b)) * gb, r, block);
        acc += F(block, Q8Row{a.q + b * 32, a.d + b, a.sum + b, a.ds + b}, 1);
      }
      out[g * kGroupRows + r] = acc;
    }
}

#if RETROINFER_QUANT_X86
template <float (*F)(const uint8_t*, Q8Row, int64_t)>
void rows_of(const uint8_t* w, size_t row_bytes, int64_t rows, Q8Row a, int64_t nb, float* out) {
  for (int64_t r = 0; r < rows; ++r) out[r] = F(w + static_cast<size_t>(r) * row_bytes, a, nb);
}

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

bool cpu_has_avx512_vnni() {
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
}
#else
bool cpu_has_avx2() { return false; }
bool cpu_has_avx512_vnni() { return false; }
#endif

}  // namespace

void quantize_q8_rows(const float* x, int64_t rows, int64_t cols, Q8Rows& out) {
  RETROINFER_CHECK(cols % kQ8Block == 0, "quantize_q8_rows: ", cols, " columns is not a multiple of ", kQ8Block);
  const int64_t nb = cols / kQ8Block;
  out.rows = rows;
  out.cols = cols;
  out.q.resize(rows * cols);
  out.d.resize(rows * nb);
  out.sum.resize(rows * nb);
  out.ds.resize(rows * nb);
  for (int64_t b = 0; b < rows * nb; ++b) {
    const float* xb = x + b * kQ8Block;
    int8_t* qb = out.q.data() + b * kQ8Block;
    float amax = 0.0f;
    for (int j = 0; j < kQ8Block; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t s = 0;
    for (int j = 0; j < kQ8Block; ++j) {
      // |xb * id| <= 127 up to one rounding of amax * (1 / d); the clamp keeps that in int8. Rounds to the
      // nearest, ties to even (the processor's default mode; one instruction on x86-64).
      const int qi = std::clamp(round_to_int(xb[j] * id), -127, 127);
      qb[j] = static_cast<int8_t>(qi);
      s += qi;
    }
    out.d[b] = d;
    out.sum[b] = s;
    out.ds[b] = d * static_cast<float>(s);
  }
}

bool has_group_layout(WeightType t) { return group_layout(t).block_bytes > 0; }

size_t row_groups_bytes(WeightType t, int64_t rows, int64_t cols) {
  RETROINFER_CHECK(has_group_layout(t), "row groups: no row-group layout for ", weight_type_name(t));
  const int64_t groups = (rows + kGroupRows - 1) / kGroupRows;
  return static_cast<size_t>(groups * kGroupRows) * weight_type_row_bytes(t, cols);
}

void pack_row_groups(WeightType t, const uint8_t* rows_data, int64_t rows, int64_t cols, uint8_t* out) {
  const GroupLayout L = group_layout(t);
  RETROINFER_CHECK(L.block_bytes > 0 && cols % 32 == 0, "row groups: cannot lay out rows of ", cols,
                   " elements of type ", weight_type_name(t));
  const int64_t nb = cols / 32, groups = (rows + kGroupRows - 1) / kGroupRows;
  const size_t row_bytes = weight_type_row_bytes(t, cols), gb = static_cast<size_t>(L.block_bytes) * kGroupRows;
  std::memset(out, 0, row_groups_bytes(t, rows, cols));  // rows past the end: zero blocks
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* dst = out + static_cast<size_t>(g * nb + b) * gb;
      for (int r = 0; r < kGroupRows && g * kGroupRows + r < rows; ++r) {
        const uint8_t* src = rows_data + static_cast<size_t>(g * kGroupRows + r) * row_bytes + b * L.block_bytes;
        std::memcpy(dst + 2 * r, src + L.d_src, 2);
        if (L.m_src >= 0) std::memcpy(dst + L.m_dst + 2 * r, src + L.m_src, 2);
        if (L.qh_src >= 0) {
          const uint32_t qh = load_u32(src + L.qh_src);
          for (int k = 0; k < 8; ++k) {
            uint64_t mask = 0;
            std::memcpy(&mask, dst + L.qh_dst + 8 * k, 8);
            for (int j = 0; j < 4; ++j)
              mask |= static_cast<uint64_t>((qh >> mask_element(k, j)) & 1u) << (4 * r + j);
            std::memcpy(dst + L.qh_dst + 8 * k, &mask, 8);
          }
        }
        for (int c = 0; c < L.qs_bytes / 4; ++c) std::memcpy(dst + L.qs_dst + 64 * c + 4 * r, src + L.qs_src + 4 * c, 4);
      }
    }
}

void unpack_group_row(WeightType t, const uint8_t* groups, int64_t r, int64_t cols, uint8_t* dst) {
  const GroupLayout L = group_layout(t);
  RETROINFER_CHECK(L.block_bytes > 0 && cols % 32 == 0, "row groups: cannot lay out rows of ", cols,
                   " elements of type ", weight_type_name(t));
  const int64_t nb = cols / 32, g = r / kGroupRows;
  const size_t gb = static_cast<size_t>(L.block_bytes) * kGroupRows;
  for (int64_t b = 0; b < nb; ++b)
    unpack_group_block(L, groups + static_cast<size_t>(g * nb + b) * gb, static_cast<int>(r % kGroupRows),
                       dst + b * L.block_bytes);
}

GroupDot scalar_group_dot(WeightType t) {
  switch (t) {
    case WeightType::kQ8_0: return scalar_groups<dot_q8_0, WeightType::kQ8_0>;
    case WeightType::kQ4_0: return scalar_groups<dot_q4_0, WeightType::kQ4_0>;
    case WeightType::kQ4_1: return scalar_groups<dot_q4_1, WeightType::kQ4_1>;
    case WeightType::kQ5_0: return scalar_groups<dot_q5_0, WeightType::kQ5_0>;
    case WeightType::kQ5_1: return scalar_groups<dot_q5_1, WeightType::kQ5_1>;
    default: return nullptr;
  }
}

GroupDot group_dot_kernel(WeightType t, QuantIsa isa) {
  RETROINFER_CHECK(has_group_layout(t), "group_dot_kernel: no row-group layout for ", weight_type_name(t));
  if (isa == QuantIsa::kAvx512Vnni && cpu_has_avx512_vnni())
    if (GroupDot k = avx512_group_dot(t)) return k;
  if (isa != QuantIsa::kScalar && cpu_has_avx2())
    if (GroupDot k = avx2_group_dot(t)) return k;
  return scalar_group_dot(t);
}

const char* quant_isa_name(QuantIsa isa) {
  switch (isa) {
    case QuantIsa::kAvx512Vnni: return "avx512-vnni";
    case QuantIsa::kAvx2: return "avx2";
    default: return "scalar";
  }
}

QuantIsa best_quant_isa() {
  static const QuantIsa isa = cpu_has_avx512_vnni() ? QuantIsa::kAvx512Vnni
                              : cpu_has_avx2()       ? QuantIsa::kAvx2
                                                     : QuantIsa::kScalar;
  return isa;
}

bool has_quant_kernel(WeightType t) { return scalar_row_dot(t) != nullptr; }

RowDot scalar_row_dot(WeightType t) {
  switch (t) {
    case WeightType::kQ8_0: return rows_of<dot_q8_0>;
    case WeightType::kQ4_0: return rows_of<dot_q4_0>;
    case WeightType::kQ4_1: return rows_of<dot_q4_1>;
    case WeightType::kQ5_0: return rows_of<dot_q5_0>;
    case WeightType::kQ5_1: return rows_of<dot_q5_1>;
    case WeightType::kQ4_K: return rows_of<dot_k4<false>>;
    case WeightType::kQ5_K: return rows_of<dot_k4<true>>;
    case WeightType::kQ6_K: return rows_of<dot_q6_k>;
    default: return nullptr;
  }
}

RowDot row_dot_kernel(WeightType t, QuantIsa isa) {
  RETROINFER_CHECK(has_quant_kernel(t), "row_dot_kernel: no quantized kernel for ", weight_type_name(t));
  // The SIMD tables are only asked on a processor that runs their instructions (their translation units are
  // compiled for them).
  if (isa == QuantIsa::kAvx512Vnni && cpu_has_avx512_vnni())
    if (RowDot k = avx512_row_dot(t)) return k;
  if (isa != QuantIsa::kScalar && cpu_has_avx2())
    if (RowDot k = avx2_row_dot(t)) return k;
  return scalar_row_dot(t);
}

#if !RETROINFER_QUANT_X86
// No SIMD translation units on this processor family (src/model/CMakeLists.txt): the scalar kernels only.
RowDot avx2_row_dot(WeightType) { return nullptr; }
RowDot avx512_row_dot(WeightType) { return nullptr; }
GroupDot avx2_group_dot(WeightType) { return nullptr; }
GroupDot avx512_group_dot(WeightType) { return nullptr; }
#endif

}  // namespace retroinfer::model
