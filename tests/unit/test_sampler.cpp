// Sampler (greedy, temperature, top-k, top-p, seeds) and StopMatcher.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "retroinfer/error.h"
#include "retroinfer/generate.h"
#include "retroinfer/sampler.h"

namespace retroinfer {
namespace {

// logits ln(p) for p = 0.4, 0.3, 0.15, 0.1, 0.05 at ids 3, 0, 4, 1, 2.
std::vector<float> five() {
  return {std::log(0.3f), std::log(0.1f), std::log(0.05f), std::log(0.4f), std::log(0.15f)};
}

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
  Sampler s({});
  EXPECT_EQ(s.sample(five()), 3);
  const std::vector<float> tie = {1.0f, 5.0f, 5.0f, -2.0f};
  EXPECT_EQ(s.sample(tie), 1);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(argmax(std::vector<float>{nan, -1.0f, nan}), 1);
  EXPECT_THROW(argmax(std::vector<float>{nan, nan}), Error);
  EXPECT_THROW(argmax(std::vector<float>{}), Error);
}

TEST(Sampler, TemperatureOneReproducesSoftmax) {
  SamplerConfig c;
  c.temperature = 1.0f;
  const auto d = Sampler(c).distribution(five());
  ASSERT_EQ(d.size(), 5u);
  const std::vector<std::pair<int, float>> want = {{3, 0.4f}, {0, 0.3f}, {4, 0.15f}, {1, 0.1f}, {2, 0.05f}};
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(d[i].first, want[i].first) << i;
    EXPECT_NEAR(d[i].second, want[i].second, 1e-6) << i;
  }
}

TEST(Sampler, TopKKeepsKRenormalised) {
  SamplerConfig c;
  c.temperature = 1.0f;
  c.top_k = 2;
  const auto d = Sampler(c).distribution(five());
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].first, 3);
  EXPECT_EQ(d[1].first, 0);
  EXPECT_NEAR(d[0].second, 0.4 / 0.7, 1e-6);
  EXPECT_NEAR(d[1].second, 0.3 / 0.7, 1e-6);
}

TEST(Sampler, TopPKeepsSmallestPrefixReachingMass) {
  SamplerConfig c;
  c.temperature = 1.0f;
  c.top_p = 0.8f;  // 0.4 + 0.3 = 0.7 < 0.8; + 0.15 = 0.85 >= 0.8: three tokens
  auto d = Sampler(c).distribution(five());
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[2].first, 4);
  EXPECT_NEAR(d[0].second, 0.4 / 0.85, 1e-6);
  c.top_p = 0.1f;  // the top token alone already exceeds it
  EXPECT_EQ(Sampler(c).distribution(five()).size(), 1u);
}

TEST(Sampler, TemperatureSharpensAndFlattens) {
  SamplerConfig c;
  c.temperature = 0.5f;  // p^2 renormalised: 0.16 / (0.16 + 0.09 + 0.0225 + 0.01 + 0.0025) = 0.5614
  EXPECT_NEAR(Sampler(c).distribution(five())[0].second, 0.16 / 0.285, 1e-6);
  c.temperature = 2.0f;  // sqrt(p): 0.6325 / (0.6325 + 0.5477 + 0.3873 + 0.3162 + 0.2236)
  EXPECT_NEAR(Sampler(c).distribution(five())[0].second, 0.63246 / 2.10729, 1e-4);
}

TEST(Sampler, SeededRunsRepeatAndFrequenciesMatch) {
  SamplerConfig c;
  c.temperature = 1.0f;
  c.seed = 1234;
  Sampler a(c), b(c);
  c.seed = 99;
  Sampler other(c);
  const auto lg = five();
  std::map<int, int> counts;
  int differ = 0;
  constexpr int kDraws = 20000;
  for (int i = 0; i < kDraws; ++i) {
    const int x = a.sample(lg);
    ASSERT_EQ(x, b.sample(lg)) << "draw " << i << " with seed 1234";
    differ += x != other.sample(lg);
    ++counts[x];
  }
  EXPECT_GT(differ, kDraws / 4);  // another seed gives another sequence (P(same) per draw = 0.285)
  // Each frequency within 5 binomial standard deviations (sqrt(p(1-p)/n) <= 0.0035): a false failure
  // has probability < 1e-6 per token.
  const std::map<int, double> p = {{3, 0.4}, {0, 0.3}, {4, 0.15}, {1, 0.1}, {2, 0.05}};
  for (const auto& [id, want] : p) {
    const double got = static_cast<double>(counts[id]) / kDraws;
    EXPECT_NEAR(got, want, 5 * std::sqrt(want * (1 - want) / kDraws)) << "token " << id;
  }
}

TEST(Sampler, RejectsBadConfig) {
  SamplerConfig c;
  c.temperature = -1.0f;
  EXPECT_THROW(Sampler{c}, Error);
  c = {};
  c.top_p = 0.0f;
  EXPECT_THROW(Sampler{c}, Error);
  c = {};
  c.top_p = 1.5f;
  EXPECT_THROW(Sampler{c}, Error);
  c = {};
  c.top_k = -3;
  EXPECT_THROW(Sampler{c}, Error);
}

TEST(StopMatcher, WithholdsPrefixesAndCutsAtMatch) {
  StopMatcher m({"</s>", "STOP"});
  auto r = m.feed("hello <");
  EXPECT_EQ(r.emit, "hello ");  // "<" may start "</s>"
  EXPECT_FALSE(r.stopped);
  r = m.feed("b> world S");
  EXPECT_EQ(r.emit, "<b> world ");
  r = m.feed("TO");
  EXPECT_EQ(r.emit, "");
  r = m.feed("P and more");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.emit, "");
}

TEST(StopMatcher, EarliestMatchWinsAndFlushReturnsRest) {
  StopMatcher m({"bc", "abcd"});
  auto r = m.feed("xxabcd");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.emit, "xx");  // "abcd" starts at 2, before "bc" at 3
  StopMatcher n({"END"});
  EXPECT_EQ(n.feed("the EN").emit, "the ");
  EXPECT_EQ(n.flush(), "EN");
  StopMatcher none({});
  EXPECT_EQ(none.feed("abc").emit, "abc");
}

}  // namespace
}  // namespace retroinfer
