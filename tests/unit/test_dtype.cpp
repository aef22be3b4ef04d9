#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "retroinfer/dtype.h"
#include "retroinfer/error.h"

using namespace retroinfer;

TEST(DType, Bf16RoundTripAndRounding) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-2.5f)), -2.5f);
  // 1 + 2^-8 is exactly half-way between bf16 neighbours 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(INFINITY))));
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 100.0f);
  for (int i = 0; i < 10000; ++i) {
    const float x = nd(rng);
    const float y = bf16_to_f32(f32_to_bf16(x));
    EXPECT_LE(std::fabs(x - y), std::fabs(x) * std::ldexp(1.0f, -8)) << x;  // half an ulp of 8-bit mantissa
  }
}

TEST(DType, F16RoundTrip) {
  for (float x : {0.0f, 1.0f, -1.0f, 0.5f, 65504.0f, 6.103515625e-05f /*min normal*/, 5.960464477539063e-08f /*min subnormal*/})
    EXPECT_EQ(f16_to_f32(f32_to_f16(x)), x) << x;
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite positive half survives f16 -> f32 -> f16
    EXPECT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h) << h;
  }
}

TEST(DType, ParseRejectsUnknown) {
  EXPECT_EQ(parse_dtype("bf16"), DType::kBF16);
  EXPECT_THROW(parse_dtype("int4"), Error);
}
