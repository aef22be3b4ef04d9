// RoPE: frequencies of every scaling type against closed-form values, and the rotation's properties.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "model/rope.h"
#include "retroinfer/error.h"

namespace retroinfer::model {
namespace {

ModelConfig base_config(int head_dim = 16, float theta = 10000.0f) {
  ModelConfig c;
  c.head_dim = head_dim;
  c.rope_theta = theta;
  c.max_position_embeddings = 128;
  return c;
}

// f32 rounding of a double-computed frequency: relative 2^-24.
constexpr double kFreqTol = 1e-6;

TEST(Rope, DefaultFrequencies) {
  const ModelConfig c = base_config(16, 10000.0f);
  const auto f = rope_frequencies(c, 1);
  ASSERT_EQ(f.inv_freq.size(), 8u);
  EXPECT_EQ(f.attention_factor, 1.0f);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(f.inv_freq[i], std::pow(10000.0, -2.0 * i / 16), kFreqTol * f.inv_freq[i]) << i;
  EXPECT_EQ(f.inv_freq[0], 1.0f);
  EXPECT_NEAR(f.inv_freq[4], 0.01, 1e-8);  // 10000^(-1/2)
}

TEST(Rope, LinearDividesByFactor) {
  ModelConfig c = base_config();
  c.rope_scaling.type = "linear";
  c.rope_scaling.factor = 4.0f;
  const auto f = rope_frequencies(c, 1);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(f.inv_freq[i], std::pow(10000.0, -2.0 * i / 16) / 4.0, kFreqTol * f.inv_freq[i]) << i;
}

TEST(Rope, DynamicChangesOnlyBeyondMaxPosition) {
  ModelConfig c = base_config();
  c.rope_scaling.type = "dynamic";
  c.rope_scaling.factor = 2.0f;
  const auto short_f = rope_frequencies(c, 100);  // <= 128: the plain frequencies
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(short_f.inv_freq[i], std::pow(10000.0, -2.0 * i / 16), kFreqTol) << i;
  // seq_len 256 = 2 * 128, factor 2: base = 10000 * (2 * 2 - 1)^(16 / 14).
  const double base = 10000.0 * std::pow(3.0, 16.0 / 14.0);
  const auto long_f = rope_frequencies(c, 256);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(long_f.inv_freq[i], std::pow(base, -2.0 * i / 16), kFreqTol * long_f.inv_freq[i]) << i;
  EXPECT_LT(long_f.inv_freq[7], short_f.inv_freq[7]);
}

TEST(Rope, Llama3WavelengthRule) {
  // d = 16, theta = 10000, original length 64, low 1, high 4, factor 8:
  // wavelengths 2 pi / inv_freq: i=0: 6.28, i=1: 19.9, i=2: 62.8, i=3: 199, ...
  // high_wavelen = 64 / 4 = 16, low_wavelen = 64 / 1 = 64.
  ModelConfig c = base_config();
  c.rope_scaling.type = "llama3";
  c.rope_scaling.factor = 8.0f;
  c.rope_scaling.low_freq_factor = 1.0f;
  c.rope_scaling.high_freq_factor = 4.0f;
  c.rope_scaling.original_max_position = 64;
  const auto f = rope_frequencies(c, 1);
  auto plain = [](int i) { return std::pow(10000.0, -2.0 * i / 16); };
  EXPECT_NEAR(f.inv_freq[0], plain(0), kFreqTol);  // wavelen 6.28 < 16: unchanged
  for (int i = 3; i < 8; ++i) EXPECT_NEAR(f.inv_freq[i], plain(i) / 8.0, kFreqTol * plain(i)) << i;  // > 64: / 8
  for (int i : {1, 2}) {  // 16 <= wavelen <= 64: smooth = (64 / wavelen - 1) / 3
    const double wl = 2 * std::numbers::pi / plain(i);
    const double smooth = (64.0 / wl - 1.0) / 3.0;
    EXPECT_NEAR(f.inv_freq[i], (1 - smooth) * plain(i) / 8 + smooth * plain(i), kFreqTol * plain(i)) << i;
  }
}

TEST(Rope, YarnRampAndMscale) {
  // d = 16, theta = 10000, original 128, beta_fast 32, beta_slow 1, factor 4.
  // correction_dim(r) = 16 ln(128 / (2 pi r)) / (2 ln 10000): r=32 -> -0.50 -> floor -> clamp 0;
  // r=1 -> 2.62 -> ceil 3. Ramp over i in [0, 3]: r(i) = i / 3; inv = plain * (1 - r) + plain / 4 * r.
  ModelConfig c = base_config();
  c.rope_scaling.type = "yarn";
  c.rope_scaling.factor = 4.0f;
  c.rope_scaling.original_max_position = 128;
  const auto f = rope_frequencies(c, 1);
  EXPECT_NEAR(f.attention_factor, 0.1 * std::log(4.0) + 1.0, 1e-6);
  for (int i = 0; i < 8; ++i) {
    const double plain = std::pow(10000.0, -2.0 * i / 16);
    const double r = std::min(i / 3.0, 1.0);
    EXPECT_NEAR(f.inv_freq[i], plain * (1 - r) + plain / 4 * r, kFreqTol * plain) << i;
  }
  c.rope_scaling.attention_factor = 1.5f;  // an explicit factor wins
  EXPECT_EQ(rope_frequencies(c, 1).attention_factor, 1.5f);
}

TEST(Rope, UnknownTypeAndOddDimThrow) {
  ModelConfig c = base_config();
  c.rope_scaling.type = "longrope";
  EXPECT_THROW(rope_frequencies(c, 1), Error);
  ModelConfig odd = base_config(15);
  EXPECT_THROW(rope_frequencies(odd, 1), Error);
}

TEST(Rope, RotationClosedFormAndRelativePosition) {
  const ModelConfig c = base_config(8, 100.0f);
  const auto f = rope_frequencies(c, 1);
  // x = e_0 (first component 1): at position p, y[0] = cos(p), y[4] = sin(p) (inv_freq[0] = 1).
  const int64_t p = 5;
  std::vector<float> cs(4), sn(4);
  rope_table(f, p, 1, cs.data(), sn.data());
  std::vector<float> x(8, 0.0f);
  x[0] = 1.0f;
  apply_rope(x.data(), 1, 1, 8, cs.data(), sn.data());
  EXPECT_NEAR(x[0], std::cos(5.0), 1e-6);
  EXPECT_NEAR(x[4], std::sin(5.0), 1e-6);
  // q(p1) . k(p2) depends only on p1 - p2 (and the norm is kept).
  const std::vector<float> q0 = {0.3f, -1.2f, 0.5f, 2.0f, 1.1f, 0.7f, -0.4f, 0.9f};
  const std::vector<float> k0 = {-0.8f, 0.2f, 1.5f, -0.3f, 0.6f, -1.0f, 0.25f, 0.4f};
  auto rotated_dot = [&](int64_t pq, int64_t pk) {
    std::vector<float> q = q0, k = k0, c1(4), s1(4), c2(4), s2(4);
    rope_table(f, pq, 1, c1.data(), s1.data());
    rope_table(f, pk, 1, c2.data(), s2.data());
    apply_rope(q.data(), 1, 1, 8, c1.data(), s1.data());
    apply_rope(k.data(), 1, 1, 8, c2.data(), s2.data());
    double d = 0;
    for (int i = 0; i < 8; ++i) d += static_cast<double>(q[i]) * k[i];
    return d;
  };
  // Angles up to 103 rad in f32 carry ~4e-6 absolute error each; the dot product of O(1) vectors keeps it.
  EXPECT_NEAR(rotated_dot(10, 3), rotated_dot(100, 93), 1e-4);
  EXPECT_GT(std::fabs(rotated_dot(10, 3) - rotated_dot(10, 4)), 1e-3);  // and it does depend on p1 - p2
}

}  // namespace
}  // namespace retroinfer::model
