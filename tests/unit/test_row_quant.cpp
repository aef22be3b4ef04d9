// The compressed stores' row quantisation (core/row_quant.h), the CPU reference of the CUDA store fill and
// gather. int8 (a scale per row): the per-element error bound, exact cases (zero rows, the absmax element,
// rows already on the int8 grid), symmetry and the clamp, over head dims with tails. int4 (a bf16 scale per
// 32 values): the same bound per group, the nibble order, an outlier confined to its group, exact cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/row_quant.h"
#include "retroinfer/dtype.h"

namespace retroinfer {
namespace {

std::vector<uint16_t> random_row(std::mt19937& rng, int d, float sigma, int outliers) {
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<uint16_t> x(d);
  for (auto& v : x) v = f32_to_bf16(nd(rng));
  // Keys carry a few outlier channels (tens of times the rest): the case per-row scales must survive.
  for (int i = 0; i < outliers && i < d; ++i) x[(i * 37) % d] = f32_to_bf16(40.0f * sigma * (i % 2 ? -1.0f : 1.0f));
  return x;
}

// Every element: |x - q * scale| <= scale * (1/2 + 2^-15), and after the bf16 widening at most
// |q * scale| * 2^-8 more (row_quant.h derives both); |q| <= 127; the absmax element maps to +-127.
TEST(RowQuant, ErrorBoundPerElement) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::mt19937 rng(seed);
    for (int d : {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 64, 127, 128, 129}) {
      for (int outliers : {0, 1, 3}) {
        for (float sigma : {1e-3f, 0.5f, 30.0f}) {
          const std::vector<uint16_t> x = random_row(rng, d, sigma, outliers);
          std::vector<int8_t> q(d, 99);
          const float scale = int8_quantize_row(x.data(), d, q.data());
          std::vector<uint16_t> w(d, 0xffff);  // sentinel: NaN in bf16
          int8_widen_row(q.data(), scale, d, w.data());
          float amax = 0.0f;
          for (uint16_t v : x) amax = std::fmax(amax, std::fabs(bf16_to_f32(v)));
          ASSERT_EQ(scale, amax / 127.0f);
          bool saw_max = false;
          for (int i = 0; i < d; ++i) {
            SCOPED_TRACE("seed " + std::to_string(seed) + " d " + std::to_string(d) + " i " + std::to_string(i));
            const double xi = bf16_to_f32(x[i]), qs = double(q[i]) * double(scale);
            ASSERT_LE(std::abs(q[i]), 127);
            ASSERT_LE(std::abs(xi - qs), double(scale) * (0.5 + std::ldexp(1.0, -15)));
            const double wi = bf16_to_f32(w[i]);
            ASSERT_TRUE(std::isfinite(wi));
            ASSERT_LE(std::abs(xi - wi), double(scale) * (0.5 + std::ldexp(1.0, -15)) + std::abs(qs) * std::ldexp(1.0, -8));
            if (std::fabs(float(xi)) == amax) {
              ASSERT_EQ(std::abs(q[i]), 127);
              saw_max = true;
            }
          }
          ASSERT_TRUE(saw_max);
        }
      }
    }
  }
}

TEST(RowQuant, ZeroRowIsExact) {
  std::vector<uint16_t> x(128, f32_to_bf16(0.0f));
  x[5] = f32_to_bf16(-0.0f);
  std::vector<int8_t> q(128, 7);
  EXPECT_EQ(int8_quantize_row(x.data(), 128, q.data()), 0.0f);
  std::vector<uint16_t> w(128, 0xffff);
  int8_widen_row(q.data(), 0.0f, 128, w.data());
  for (int i = 0; i < 128; ++i) {
    EXPECT_EQ(q[i], 0);
    EXPECT_EQ(bf16_to_f32(w[i]), 0.0f);
  }
}

// A row whose values are small integers times a power of two (all exactly representable in bf16, absmax
// 127 * 2^e): scale is 2^e (exact) and the round trip returns every value bit for bit.
TEST(RowQuant, RowsOnTheGridRoundTripExactly) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> ui(-127, 127);
  for (int e : {-12, -3, 0, 5}) {
    std::vector<uint16_t> x(64);
    for (auto& v : x) v = f32_to_bf16(std::ldexp(float(ui(rng)), e));
    x[11] = f32_to_bf16(std::ldexp(-127.0f, e));
    std::vector<int8_t> q(64);
    const float scale = int8_quantize_row(x.data(), 64, q.data());
    // absmax / 127 = 2^e exactly (127 * 2^e / 127 is exact in f32).
    EXPECT_EQ(scale, std::ldexp(1.0f, e));
    std::vector<uint16_t> w(64);
    int8_widen_row(q.data(), scale, 64, w.data());
    EXPECT_EQ(w, x) << "e " << e;
  }
}

// x and -x quantise to q and -q (round half even is symmetric); ties go to the even integer.
TEST(RowQuant, SymmetricWithTiesToEven) {
  const float inv = 1.0f;
  EXPECT_EQ(int8_quantize(2.5f, inv), 2);
  EXPECT_EQ(int8_quantize(-2.5f, inv), -2);
  EXPECT_EQ(int8_quantize(3.5f, inv), 4);
  EXPECT_EQ(int8_quantize(200.0f, inv), 127);   // clamped (only reachable through f32 rounding of inv)
  EXPECT_EQ(int8_quantize(-200.0f, inv), -127);
  std::mt19937 rng(3);
  const std::vector<uint16_t> x = random_row(rng, 128, 1.0f, 2);
  std::vector<uint16_t> nx(128);
  for (int i = 0; i < 128; ++i) nx[i] = x[i] ^ 0x8000u;
  std::vector<int8_t> q(128), nq(128);
  EXPECT_EQ(int8_quantize_row(x.data(), 128, q.data()), int8_quantize_row(nx.data(), 128, nq.data()));
  for (int i = 0; i < 128; ++i) EXPECT_EQ(q[i], -nq[i]) << i;
}

// ---- int4 ----

// Every element: |x - q * scale| <= scale * (1/2 + 2^-20) with its group's scale, after the bf16 widening at
// most |q * scale| * 2^-8 more (row_quant.h); the group's absmax element maps to +-7 (the bf16 rounding of
// its scale moves absmax / scale by less than 2^-8 of 7, which still rounds to 7).
// The decode kernels' int8 -> bf16 widening: every byte pair, both halves, q = a - b exactly.
TEST(RowQuant, Int8PairBf16TermsDifferToTheValue) {
  for (uint32_t lo = 0; lo < 256; ++lo)
    for (uint32_t hi : {0u, 1u, 127u, 128u, 129u, 255u, lo ^ 0x5au}) {
      uint32_t a = 0, b = 0;
      int8_pair_bf16_terms(lo | (hi << 16), a, b);
      const float d0 = bf16_to_f32(uint16_t(a & 0xffffu)) - bf16_to_f32(uint16_t(b & 0xffffu));
      const float d1 = bf16_to_f32(uint16_t(a >> 16)) - bf16_to_f32(uint16_t(b >> 16));
      ASSERT_EQ(d0, float(int8_t(uint8_t(lo)))) << lo;
      ASSERT_EQ(d1, float(int8_t(uint8_t(hi)))) << hi;
      // Both terms are bf16 values with 8 significant bits at most, so a bf16 subtraction is exact too.
      ASSERT_EQ(f32_to_bf16(d0), f32_to_bf16(float(int8_t(uint8_t(lo)))));
    }
}

TEST(RowQuantInt4, ErrorBoundPerElement) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::mt19937 rng(seed);
    for (int d : {32, 64, 128, 256}) {
      for (int outliers : {0, 1, 3}) {
        for (float sigma : {1e-3f, 0.5f, 30.0f}) {
          const std::vector<uint16_t> x = random_row(rng, d, sigma, outliers);
          std::vector<uint8_t> q(d / 2, 0x99);
          std::vector<uint16_t> sc(d / kInt4Group, 0xffff);
          int4_quantize_row(x.data(), d, q.data(), sc.data());
          std::vector<uint16_t> w(d, 0xffff);
          int4_widen_row(q.data(), sc.data(), d, w.data());
          for (int g = 0; g < d / kInt4Group; ++g) {
            float amax = 0.0f;
            for (int i = 0; i < kInt4Group; ++i) amax = std::fmax(amax, std::fabs(bf16_to_f32(x[g * kInt4Group + i])));
            const double scale = bf16_to_f32(sc[g]);
            ASSERT_EQ(sc[g], f32_to_bf16(amax / 7.0f));
            bool saw_max = false;
            for (int i = g * kInt4Group; i < (g + 1) * kInt4Group; ++i) {
              SCOPED_TRACE("seed " + std::to_string(seed) + " d " + std::to_string(d) + " i " + std::to_string(i));
              const int qi = int4_value(static_cast<uint8_t>(q[i / 2] >> (4 * (i % 2))));
              const double xi = bf16_to_f32(x[i]), qs = qi * scale;
              ASSERT_LE(std::abs(qi), 7);
              ASSERT_LE(std::abs(xi - qs), scale * (0.5 + std::ldexp(1.0, -20)));
              const double wi = bf16_to_f32(w[i]);
              ASSERT_TRUE(std::isfinite(wi));
              ASSERT_LE(std::abs(xi - wi), scale * (0.5 + std::ldexp(1.0, -20)) + std::abs(qs) * std::ldexp(1.0, -8));
              if (std::fabs(float(xi)) == amax) {
                ASSERT_EQ(std::abs(qi), 7);
                saw_max = true;
              }
            }
            ASSERT_TRUE(saw_max);
          }
        }
      }
    }
  }
}

// An outlier channel coarsens only its own group: the other groups keep their own (small) scales.
TEST(RowQuantInt4, OutlierStaysInItsGroup) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> x(128);
  for (auto& v : x) v = f32_to_bf16(nd(rng));
  x[70] = f32_to_bf16(500.0f);  // group 2
  std::vector<uint8_t> q(64);
  std::vector<uint16_t> sc(4);
  int4_quantize_row(x.data(), 128, q.data(), sc.data());
  std::vector<uint16_t> w(128);
  int4_widen_row(q.data(), sc.data(), 128, w.data());
  EXPECT_EQ(sc[2], f32_to_bf16(500.0f / 7.0f));
  double err_other = 0.0, sum_other = 0.0;
  for (int i = 0; i < 128; ++i) {
    if (i / 32 == 2) continue;
    EXPECT_LT(bf16_to_f32(sc[i / 32]), 1.0f) << "group " << i / 32;
    const double e = bf16_to_f32(x[i]) - bf16_to_f32(w[i]);
    err_other += e * e;
    sum_other += double(bf16_to_f32(x[i])) * bf16_to_f32(x[i]);
  }
  // 15 levels over a Gaussian group's range: ~1% of its energy (per-row scales would lose nearly all of it).
  EXPECT_LT(err_other / sum_other, 0.03);
}

// Nibble order: value 2j in the low nibble of byte j; two's complement; -8 never produced.
TEST(RowQuantInt4, NibbleLayoutAndClamp) {
  EXPECT_EQ(int4_quantize(3.0f, 1.0f), 0x3);
  EXPECT_EQ(int4_quantize(-3.0f, 1.0f), 0xd);
  EXPECT_EQ(int4_quantize(2.5f, 1.0f), 0x2);   // ties to even
  EXPECT_EQ(int4_quantize(-2.5f, 1.0f), 0xe);
  EXPECT_EQ(int4_quantize(90.0f, 1.0f), 0x7);  // clamped
  EXPECT_EQ(int4_quantize(-90.0f, 1.0f), 0x9);
  for (int v = -8; v < 8; ++v) EXPECT_EQ(int4_value(static_cast<uint8_t>(v & 0xf)), v);
  EXPECT_EQ(int4_value(0xf3), 3);  // the high nibble is ignored
  std::vector<uint16_t> x(32);
  for (int i = 0; i < 32; ++i) x[i] = f32_to_bf16(float(i % 15 - 7));  // on the grid, scale exactly 1
  std::vector<uint8_t> q(16);
  uint16_t sc = 0;
  int4_quantize_row(x.data(), 32, q.data(), &sc);
  EXPECT_EQ(bf16_to_f32(sc), 1.0f);
  EXPECT_EQ(q[0], uint8_t((0x9) | (0xa << 4)));  // -7, -6
  std::vector<uint16_t> w(32);
  int4_widen_row(q.data(), &sc, 32, w.data());
  EXPECT_EQ(w, x);
}

TEST(RowQuantInt4, ZeroGroupIsExact) {
  std::vector<uint16_t> x(64, f32_to_bf16(0.0f));
  x[40] = f32_to_bf16(2.0f);  // group 1 nonzero, group 0 all zero
  std::vector<uint8_t> q(32, 0x77);
  std::vector<uint16_t> sc(2, 0x1234);
  int4_quantize_row(x.data(), 64, q.data(), sc.data());
  EXPECT_EQ(sc[0], 0);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(q[j], 0) << j;
  std::vector<uint16_t> w(64, 0xffff);
  int4_widen_row(q.data(), sc.data(), 64, w.data());
  for (int i = 0; i < 64; ++i) EXPECT_EQ(bf16_to_f32(w[i]), i == 40 ? 2.0f : 0.0f) << i;
}

// ---- int4 relative to a base row ----

// The base row: the f32 mean of the rows in row order, rounded to bf16; zero for no rows.
TEST(RowQuantInt4, BaseRowIsTheRoundedMean) {
  const std::vector<uint16_t> x = {f32_to_bf16(1.0f), f32_to_bf16(-2.0f),   // row 0
                                   f32_to_bf16(2.0f), f32_to_bf16(4.0f),    // row 1
                                   f32_to_bf16(4.0f), f32_to_bf16(1.0f)};   // row 2
  std::vector<uint16_t> b(2, 0xffff);
  int4_base_row(x.data(), 3, 2, b.data());
  EXPECT_EQ(b[0], f32_to_bf16(7.0f / 3.0f));
  EXPECT_EQ(b[1], f32_to_bf16(1.0f));
  int4_base_row(x.data(), 0, 2, b.data());
  EXPECT_EQ(b[0], 0);
  EXPECT_EQ(b[1], 0);
}

// Rows sharing large per-channel offsets (a cluster of keys with a K-projection bias): stored relative to their
// mean, each element is within the bound of its residual's group scale (row_quant.h, plus the bf16 rounding of
// base + q * scale), and the rows come back far closer than int4 of the raw rows, whose groups must span the
// offsets.
TEST(RowQuantInt4, RowsRelativeToTheirMeanKeepTheSmallChannels) {
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int d = 128, s = 16;
  std::vector<float> offset(d);
  for (int i = 0; i < d; ++i) offset[i] = i % 9 == 0 ? 60.0f * nd(rng) : 0.3f * nd(rng);
  std::vector<uint16_t> x(size_t(s) * d);
  for (int r = 0; r < s; ++r)
    for (int i = 0; i < d; ++i) x[size_t(r) * d + i] = f32_to_bf16(offset[i] + 0.5f * nd(rng));
  std::vector<uint16_t> base(d);
  int4_base_row(x.data(), s, d, base.data());
  double err_rel = 0.0, err_raw = 0.0;
  for (int r = 0; r < s; ++r) {
    const uint16_t* xr = x.data() + size_t(r) * d;
    std::vector<uint8_t> q(d / 2), qraw(d / 2);
    std::vector<uint16_t> sc(d / kInt4Group), scraw(d / kInt4Group), w(d), wraw(d);
    int4_quantize_row(xr, d, q.data(), sc.data(), base.data());
    int4_widen_row(q.data(), sc.data(), d, w.data(), base.data());
    int4_quantize_row(xr, d, qraw.data(), scraw.data());
    int4_widen_row(qraw.data(), scraw.data(), d, wraw.data());
    for (int i = 0; i < d; ++i) {
      SCOPED_TRACE("row " + std::to_string(r) + " i " + std::to_string(i));
      const double xi = bf16_to_f32(xr[i]), bi = bf16_to_f32(base[i]), scale = bf16_to_f32(sc[i / kInt4Group]);
      const int qi = int4_value(static_cast<uint8_t>(q[i / 2] >> (4 * (i % 2))));
      const double wi = bf16_to_f32(w[i]);
      ASSERT_LE(std::abs(xi - bi - qi * scale), scale * (0.5 + std::ldexp(1.0, -20)));
      ASSERT_LE(std::abs(xi - wi),
                scale * (0.5 + std::ldexp(1.0, -20)) + std::abs(bi + qi * scale) * std::ldexp(1.0, -8));
      err_rel += (xi - wi) * (xi - wi);
      err_raw += (xi - bf16_to_f32(wraw[i])) * (xi - bf16_to_f32(wraw[i]));
    }
  }
  EXPECT_LT(err_rel, 0.2 * err_raw) << "relative " << err_rel << " raw " << err_raw;
}

}  // namespace
}  // namespace retroinfer
