// Q5_0, Q5_1, Q4_K, Q5_K and Q6_K blocks to f32 (ggml_quants.h). Layouts (little-endian, packed):
//   Q5_0  32 elements, 22 bytes: f16 d, uint8 qh[4] (bit j: the fifth bit of element j), uint8 qs[16] (nibbles as
//         Q4_0: element j < 16 the low nibble of qs[j], j + 16 the high one); x = (q5 - 16) * d
//   Q5_1  32 elements, 24 bytes: f16 d, f16 m, qh[4], qs[16]; x = q5 * d + m
//   Q4_K  256 elements, 144 bytes: f16 d, f16 dmin, uint8 scales[12] (8 six-bit scales and 8 six-bit mins),
//         uint8 qs[128]; sub-block s of 32 elements: x = d * sc_s * q4 - dmin * m_s
//   Q5_K  256 elements, 176 bytes: f16 d, f16 dmin, scales[12], uint8 qh[32], qs[128]; as Q4_K with a fifth bit
//   Q6_K  256 elements, 210 bytes: uint8 ql[128] (low 4 bits), uint8 qh[64] (high 2 bits), int8 scales[16], f16 d;
//         sub-block s of 16 elements: x = d * scales[s] * (q6 - 32)
// The arithmetic follows llama.cpp's reference dequantization operation by operation (the products d * sc and
// dmin * m rounded to f32 first), so an f32 copy of a model matches llama.cpp's own.
#include "io/ggml_quants.h"

#include <cstring>

#include "io/ggml_k4_scales.h"
#include "retroinfer/dtype.h"
#include "retroinfer/error.h"

namespace retroinfer {
namespace {

float load_f16(const uint8_t* p) { return f16_to_f32(static_cast<uint16_t>(p[0] | (p[1] << 8))); }

uint32_t load_u32(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}

// Q5_0 (m absent: has_min false) and Q5_1.
void q5_block(const uint8_t* b, bool has_min, float* y) {
  const float d = load_f16(b);
  const float m = has_min ? load_f16(b + 2) : 0.0f;
  const uint8_t* p = b + (has_min ? 4 : 2);
  const uint32_t qh = load_u32(p);
  const uint8_t* qs = p + 4;
  for (int j = 0; j < 16; ++j) {
    const int hi0 = static_cast<int>(((qh >> j) << 4) & 0x10);
    const int hi1 = static_cast<int>((qh >> (j + 12)) & 0x10);
    const int q0 = (qs[j] & 0x0f) | hi0, q1 = (qs[j] >> 4) | hi1;
    if (has_min) {
      y[j] = static_cast<float>(q0) * d + m;
      y[j + 16] = static_cast<float>(q1) * d + m;
    } else {
      y[j] = static_cast<float>(q0 - 16) * d;
      y[j + 16] = static_cast<float>(q1 - 16) * d;
    }
  }
}


// Q4_K (qh null) and Q5_K.
void k4_block(const uint8_t* b, bool five_bits, float* y) {
  const float d = load_f16(b), dmin = load_f16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = five_bits ? b + 16 : nullptr;
  const uint8_t* ql = b + (five_bits ? 48 : 16);
  uint8_t u1 = 1, u2 = 2;
  for (int j = 0, is = 0; j < 256; j += 64, is += 2, ql += 32) {
    int sc = 0, m = 0;
    ggml::scale_min_k4(is, scales, sc, m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    ggml::scale_min_k4(is + 1, scales, sc, m);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) {
      const int hi = qh != nullptr && (qh[l] & u1) ? 16 : 0;
      y[j + l] = d1 * static_cast<float>((ql[l] & 0x0f) + hi) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      const int hi = qh != nullptr && (qh[l] & u2) ? 16 : 0;
      y[j + 32 + l] = d2 * static_cast<float>((ql[l] >> 4) + hi) - m2;
    }
    u1 = static_cast<uint8_t>(u1 << 2);
    u2 = static_cast<uint8_t>(u2 << 2);
  }
}

void q6k_block(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = load_f16(b + 208);
  for (int n = 0; n < 256; n += 128, ql += 64, qh += 32, sc += 8, y += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
  }
}

}  // namespace

void dequantize_ggml_blocks(WeightType t, const uint8_t* src, int64_t blocks, float* dst) {
  RETROINFER_CHECK(blocks >= 0, "dequantize: negative block count ", blocks);
  const int elems = weight_type_block_elems(t), bytes = weight_type_block_bytes(t);
  for (int64_t i = 0; i < blocks; ++i, src += bytes, dst += elems) {
    switch (t) {
      case WeightType::kQ5_0: q5_block(src, false, dst); break;
      case WeightType::kQ5_1: q5_block(src, true, dst); break;
      case WeightType::kQ4_K: k4_block(src, false, dst); break;
      case WeightType::kQ5_K: k4_block(src, true, dst); break;
      case WeightType::kQ6_K: q6k_block(src, dst); break;
      default: RETROINFER_FAIL("dequantize_ggml_blocks: ", weight_type_name(t), " is not a Q5 or K-quant type");
    }
  }
}

}  // namespace retroinfer
