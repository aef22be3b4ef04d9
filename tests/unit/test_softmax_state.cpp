// The log-sum-exp merge: equals one-pass softmax, is associative, and empty states give no NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "retroinfer/softmax_state.h"

using retroinfer::SoftmaxScalars;

namespace {
constexpr int kDim = 7;

struct State {
  SoftmaxScalars s;
  std::vector<float> o = std::vector<float>(kDim, 0.0f);
};

State build(const std::vector<float>& logits, const std::vector<std::vector<float>>& vals, size_t b, size_t e) {
  State st;
  for (size_t i = b; i < e; ++i) retroinfer::softmax_push(st.s, st.o.data(), logits[i], 1.0f, vals[i].data(), kDim);
  return st;
}

std::vector<float> reference(const std::vector<float>& logits, const std::vector<std::vector<float>>& vals) {
  double m = -INFINITY;
  for (float l : logits) m = std::max<double>(m, l);
  double den = 0;
  std::vector<double> num(kDim, 0.0);
  for (size_t i = 0; i < logits.size(); ++i) {
    const double p = std::exp(logits[i] - m);
    den += p;
    for (int j = 0; j < kDim; ++j) num[j] += p * vals[i][j];
  }
  std::vector<float> out(kDim);
  for (int j = 0; j < kDim; ++j) out[j] = static_cast<float>(num[j] / den);
  return out;
}
}  // namespace

TEST(SoftmaxState, MergeEqualsOnePassAndIsAssociative) {
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int trial = 0; trial < 50; ++trial) {
    const size_t n = 3 + trial % 40;
    std::vector<float> logits(n);
    std::vector<std::vector<float>> vals(n, std::vector<float>(kDim));
    for (size_t i = 0; i < n; ++i) {
      logits[i] = nd(rng) * (trial % 3 == 0 ? 10.0f : 1.0f);  // wide spreads stress the rescaling
      for (auto& v : vals[i]) v = nd(rng);
    }
    const auto ref = reference(logits, vals);
    const size_t a = n / 3, b = 2 * n / 3;
    State x = build(logits, vals, 0, a), y = build(logits, vals, a, b), z = build(logits, vals, b, n);
    // (x + y) + z
    State l = x;
    retroinfer::softmax_merge(l.s, l.o.data(), y.s, y.o.data(), kDim);
    retroinfer::softmax_merge(l.s, l.o.data(), z.s, z.o.data(), kDim);
    // x + (y + z)
    State r = y;
    retroinfer::softmax_merge(r.s, r.o.data(), z.s, z.o.data(), kDim);
    State r2 = x;
    retroinfer::softmax_merge(r2.s, r2.o.data(), r.s, r.o.data(), kDim);
    std::vector<float> out_l(kDim), out_r(kDim);
    retroinfer::softmax_finish(l.s, l.o.data(), out_l.data(), kDim);
    retroinfer::softmax_finish(r2.s, r2.o.data(), out_r.data(), kDim);
    for (int j = 0; j < kDim; ++j) {
      // f32 accumulation over <= 42 terms with |v| ~ 3: relative error ~ n * 2^-24 ~ 3e-6; 1e-5 abs bound
      // on outputs of magnitude ~3 leaves margin without hiding a wrong rescale (which errs by O(1)).
      EXPECT_NEAR(out_l[j], ref[j], 1e-5f * (1.0f + std::fabs(ref[j]))) << "trial " << trial << " j " << j;
      EXPECT_NEAR(out_r[j], ref[j], 1e-5f * (1.0f + std::fabs(ref[j]))) << "trial " << trial << " j " << j;
    }
    EXPECT_NEAR(retroinfer::softmax_lse(l.s), retroinfer::softmax_lse(r2.s), 1e-4f);
  }
}

TEST(SoftmaxState, EmptyStatesGiveNoNaN) {
  State a, b;
  retroinfer::softmax_merge(a.s, a.o.data(), b.s, b.o.data(), kDim);
  EXPECT_EQ(a.s.m, -INFINITY);
  EXPECT_EQ(a.s.l, 0.0f);
  std::vector<float> out(kDim, 123.0f);
  retroinfer::softmax_finish(a.s, a.o.data(), out.data(), kDim);
  for (float v : out) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(retroinfer::softmax_lse(a.s), -INFINITY);
  // empty merged into non-empty, and non-empty into empty, are identities
  std::vector<float> v(kDim, 2.0f);
  State c;
  retroinfer::softmax_push(c.s, c.o.data(), 1.5f, 1.0f, v.data(), kDim);
  State d = c;
  retroinfer::softmax_merge(d.s, d.o.data(), b.s, b.o.data(), kDim);
  EXPECT_EQ(d.s.m, c.s.m);
  EXPECT_EQ(d.s.l, c.s.l);
  State e;
  retroinfer::softmax_merge(e.s, e.o.data(), c.s, c.o.data(), kDim);
  EXPECT_EQ(e.s.m, c.s.m);
  EXPECT_FLOAT_EQ(e.s.l, c.s.l);
  for (int j = 0; j < kDim; ++j) EXPECT_FLOAT_EQ(e.o[j], c.o[j]);
}

TEST(SoftmaxState, WeightedPushCountsClusterSize) {
  // A cluster of size 5 whose tokens all have logit z equals 5 exact pushes of the same token.
  std::vector<float> v(kDim, 1.0f), vs(kDim, 5.0f);
  State exact, est;
  for (int i = 0; i < 5; ++i) retroinfer::softmax_push(exact.s, exact.o.data(), 0.7f, 1.0f, v.data(), kDim);
  retroinfer::softmax_push(est.s, est.o.data(), 0.7f, 5.0f, vs.data(), kDim);
  EXPECT_FLOAT_EQ(exact.s.l, est.s.l);
  for (int j = 0; j < kDim; ++j) EXPECT_FLOAT_EQ(exact.o[j], est.o[j]);
}
