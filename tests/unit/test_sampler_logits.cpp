// The sampler's logit changes (repetition / frequency / presence penalties, logit_bias, a token constraint)
// against hand-computed examples, and its log-probabilities.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "retroinfer/error.h"
#include "retroinfer/sampler.h"

namespace retroinfer {
namespace {

std::vector<double> softmax(const std::vector<double>& l) {
  const double m = *std::max_element(l.begin(), l.end());
  std::vector<double> p(l.size());
  double s = 0;
  for (size_t i = 0; i < l.size(); ++i) s += p[i] = std::exp(l[i] - m);
  for (double& x : p) x /= s;
  return p;
}

// The probability of `id` in a distribution() result (0 when absent).
double prob(const std::vector<std::pair<int32_t, float>>& d, int32_t id) {
  for (const auto& [i, p] : d)
    if (i == id) return p;
  return 0.0;
}

TEST(SamplerLogits, PenaltiesAndBiasFollowTheirDefinitions) {
  const std::vector<float> logits = {2.0f, -1.0f, 0.5f, 3.0f};
  SamplerConfig c;
  c.temperature = 1.0f;
  c.repetition_penalty = 2.0f;
  c.frequency_penalty = 0.5f;
  c.presence_penalty = 0.25f;
  c.logit_bias = {{2, 1.0f}};
  Sampler s(c);
  s.add_prompt(std::vector<int32_t>{0, 1});
  // Before any token: repetition on the prompt's ids (2 / 2 = 1; -1 * 2 = -2), bias +1 on id 2; the
  // frequency and presence penalties count generated tokens only.
  auto d = s.distribution(logits);
  auto want = softmax({1.0, -2.0, 1.5, 3.0});
  for (int32_t id = 0; id < 4; ++id) EXPECT_NEAR(prob(d, id), want[id], 1e-6) << "id " << id;
  // Two draws of id 3 (its logit is 100 above the others': any uniform picks it).
  const std::vector<float> force3 = {0.0f, 0.0f, 0.0f, 100.0f};
  ASSERT_EQ(s.sample(force3), 3);
  ASSERT_EQ(s.sample(force3), 3);
  // id 3: repetition 3 / 2 = 1.5, then 1.5 - 2 * 0.5 (frequency) - 0.25 (presence) = 0.25.
  d = s.distribution(logits);
  want = softmax({1.0, -2.0, 1.5, 0.25});
  for (int32_t id = 0; id < 4; ++id) EXPECT_NEAR(prob(d, id), want[id], 1e-6) << "id " << id;
}

TEST(SamplerLogits, NegativePenaltiesEncourageRepeats) {
  SamplerConfig c;
  c.presence_penalty = -2.0f;  // a generated id's logit rises by 2, however often it came
  Sampler s(c);
  ASSERT_EQ(s.sample(std::vector<float>{5.0f, 0.0f, 0.0f}), 0);
  ASSERT_EQ(s.sample(std::vector<float>{5.0f, 0.0f, 0.0f}), 0);
  // id 0: 1 + 2 = 3 beats id 2's unchanged 2.5.
  EXPECT_EQ(s.sample(std::vector<float>{1.0f, 0.5f, 2.5f}), 0);
}

TEST(SamplerLogits, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplerConfig c;
  c.repetition_penalty = 4.0f;
  Sampler s(c);
  s.add_prompt(std::vector<int32_t>{0, 2});
  // id 0: 8 / 4 = 2 < id 1: 3; id 2: -0.5 * 4 = -2 < id 3: -1.
  EXPECT_EQ(s.sample(std::vector<float>{8.0f, 3.0f, -5.0f, -6.0f}), 1);
  EXPECT_EQ(s.sample(std::vector<float>{-9.0f, -9.0f, -0.5f, -1.0f}), 3);
  // A penalty below 1 favours the seen ids: 1 / 0.5 = 2 > 1.5.
  SamplerConfig f;
  f.repetition_penalty = 0.5f;
  Sampler favour(f);
  favour.add_prompt(std::vector<int32_t>{0});
  EXPECT_EQ(favour.sample(std::vector<float>{1.0f, 1.5f}), 0);
}

TEST(SamplerLogits, LogitBiasBansAndForces) {
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> logits(64);
    for (float& x : logits) x = normal(gen);
    const int32_t best = argmax(logits);
    SamplerConfig ban;
    ban.logit_bias = {{best, -100.0f}};
    EXPECT_NE(Sampler(ban).sample(logits), best) << "trial " << trial;
    SamplerConfig force;
    force.temperature = 1.0f;
    force.seed = trial;
    const int32_t target = trial % 64;
    force.logit_bias = {{target, 100.0f}};
    Sampler s(force);
    for (int k = 0; k < 20; ++k) ASSERT_EQ(s.sample(logits), target) << "trial " << trial << " draw " << k;
  }
  SamplerConfig out_of_vocab;
  out_of_vocab.logit_bias = {{10, 1.0f}};
  EXPECT_THROW(Sampler(out_of_vocab).sample(std::vector<float>{1.0f, 2.0f}), Error);
  SamplerConfig negative;
  negative.logit_bias = {{-1, 1.0f}};
  EXPECT_THROW(Sampler{negative}, Error);
}

TEST(SamplerLogits, LogprobsAreLogSoftmaxBeforeTemperature) {
  // p = 0.3, 0.1, 0.05, 0.4, 0.15 at ids 0..4.
  const std::vector<float> logits = {std::log(0.3f), std::log(0.1f), std::log(0.05f), std::log(0.4f),
                                     std::log(0.15f)};
  for (const float t : {0.0f, 0.7f, 2.0f}) {
    SamplerConfig c;
    c.temperature = t;
    c.logprobs = 3;
    c.seed = 5;
    Sampler s(c);
    for (int k = 0; k < 20; ++k) {
      const int32_t tok = s.sample(logits);
      const TokenLogprobs& lp = s.last_logprobs();
      EXPECT_EQ(lp.sampled.token, tok);
      EXPECT_LE(lp.sampled.logprob, 0.0f);
      EXPECT_NEAR(lp.sampled.logprob, logits[tok], 1e-5) << "t " << t;  // the logits are log-probabilities
      ASSERT_EQ(lp.top.size(), 3u);
      const int32_t want_ids[3] = {3, 0, 4};
      double mass = 0;
      for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(lp.top[i].token, want_ids[i]);
        EXPECT_NEAR(lp.top[i].logprob, logits[want_ids[i]], 1e-5);
        mass += std::exp(lp.top[i].logprob);
      }
      EXPECT_LE(mass, 1.0 + 1e-6);
      EXPECT_NEAR(mass, 0.85, 1e-5);
      if (t == 0.0f) {
        EXPECT_EQ(lp.top[0].token, tok);  // greedy: the sampled token heads the list
      }
    }
  }
  // logprobs = 0: the sampled token only.
  SamplerConfig c;
  c.logprobs = 0;
  Sampler s(c);
  s.sample(logits);
  EXPECT_TRUE(s.last_logprobs().top.empty());
  EXPECT_NEAR(s.last_logprobs().sampled.logprob, std::log(0.4), 1e-5);
  SamplerConfig bad;
  bad.logprobs = kMaxTopLogprobs + 1;
  EXPECT_THROW(Sampler{bad}, Error);
}

// Bans every even id (a stand-in for a grammar).
struct OddOnly final : TokenConstraint {
  int accepted = 0;
  void mask(std::span<float> logits) const override {
    for (size_t i = 0; i < logits.size(); i += 2) logits[i] = -std::numeric_limits<float>::infinity();
  }
  void accept(int32_t token) override {
    ASSERT_EQ(token % 2, 1);
    ++accepted;
  }
  bool complete() const override { return accepted >= 3; }
};

TEST(SamplerLogits, ConstraintMasksAndLogprobsRenormalise) {
  const std::vector<float> logits = {std::log(0.4f), std::log(0.3f), std::log(0.2f), std::log(0.1f)};
  for (const float t : {0.0f, 1.0f}) {
    SamplerConfig c;
    c.temperature = t;
    c.logprobs = 4;
    auto odd = std::make_shared<OddOnly>();
    c.constraint = odd;
    Sampler s(c);
    for (int k = 0; k < 3; ++k) {
      const int32_t tok = s.sample(logits);
      EXPECT_EQ(tok % 2, 1);
      const TokenLogprobs& lp = s.last_logprobs();
      ASSERT_EQ(lp.top.size(), 2u);  // the banned tokens have probability 0 and are left out
      EXPECT_NEAR(std::exp(lp.top[0].logprob), 0.75, 1e-5);
      EXPECT_NEAR(std::exp(lp.top[1].logprob), 0.25, 1e-5);
    }
    EXPECT_TRUE(odd->complete());
  }
  // A constraint that leaves nothing is an error, not token 0.
  SamplerConfig c;
  c.constraint = std::make_shared<OddOnly>();
  EXPECT_THROW(Sampler(c).sample(std::vector<float>{1.0f}), Error);
}

TEST(SamplerLogits, GreedyWithoutChangesIsArgmax) {
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  SamplerConfig with_logprobs;
  with_logprobs.logprobs = 5;
  Sampler plain({}), lp(with_logprobs);
  for (int trial = 0; trial < 100; ++trial) {
    std::vector<float> logits(1000);
    for (float& x : logits) x = normal(gen);
    const int32_t want = argmax(logits);
    EXPECT_EQ(plain.sample(logits), want);
    EXPECT_EQ(lp.sample(logits), want);
  }
}

TEST(SamplerLogits, RejectsBadPenalties) {
  SamplerConfig c;
  c.repetition_penalty = 0.0f;
  EXPECT_THROW(Sampler{c}, Error);
  c.repetition_penalty = std::numeric_limits<float>::infinity();
  EXPECT_THROW(Sampler{c}, Error);
  c = {};
  c.frequency_penalty = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(Sampler{c}, Error);
}

}  // namespace
}  // namespace retroinfer
