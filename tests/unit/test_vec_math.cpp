// core::exp_nonpositive, the exponential of every CPU softmax: its accuracy over the range the attention uses,
// its edges (0, the underflow bound, -inf, NaN), and the same values from a loop the compiler vectorises as from
// single calls.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/vec_math.h"

using retroinfer::core::exp_nonpositive;

namespace {

// A loop over an array: vectorised at -O2/-O3 (the point of the function's form).
[[gnu::noinline]] void exp_loop(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = exp_nonpositive(x[i]);
}

// One call the compiler cannot fold into a vector loop.
[[gnu::noinline]] float exp_one(float x) { return exp_nonpositive(x); }

}  // namespace

TEST(ExpNonpositive, RelativeErrorOverTheSoftmaxRange) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-87.0f, 0.0f);
  std::vector<float> x(1 << 16);
  for (auto& v : x) v = u(rng);
  for (int i = 0; i <= 870; ++i) x[i] = -0.1f * static_cast<float>(i);  // a grid, ends included
  std::vector<float> y(x.size());
  exp_loop(x.data(), y.data(), static_cast<int64_t>(x.size()));
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(static_cast<double>(x[i]));
    worst = std::max(worst, std::fabs(y[i] - want) / want);
  }
  // A few float roundings (~6e-8 each) through the polynomial and the scaling: ~1e-7 measured.
  EXPECT_LT(worst, 3e-7);
}

TEST(ExpNonpositive, Edges) {
  EXPECT_EQ(exp_one(0.0f), 1.0f);
  EXPECT_EQ(exp_one(-0.0f), 1.0f);
  EXPECT_GT(exp_one(-87.0f), 0.0f);  // e^-87 ~ 1.6e-38, a normal float
  EXPECT_NEAR(exp_one(-87.0f) / std::exp(-87.0), 1.0, 1e-6);
  EXPECT_EQ(exp_one(-87.001f), 0.0f);
  EXPECT_EQ(exp_one(-1e30f), 0.0f);
  EXPECT_EQ(exp_one(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_TRUE(std::isnan(exp_one(std::numeric_limits<float>::quiet_NaN())));  // a NaN logit stays visible
}

TEST(ExpNonpositive, VectorLoopEqualsSingleCalls) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-100.0f, 0.0f);
  std::vector<float> x(4099);  // not a multiple of any vector width: the loop's tail too
  for (auto& v : x) v = u(rng);
  x[5] = -std::numeric_limits<float>::infinity();
  x[4098] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> y(x.size());
  exp_loop(x.data(), y.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const float one = exp_one(x[i]);
    if (std::isnan(one)) {
      EXPECT_TRUE(std::isnan(y[i])) << "x " << x[i];
    } else {
      EXPECT_EQ(y[i], one) << "x " << x[i];
    }
  }
}
