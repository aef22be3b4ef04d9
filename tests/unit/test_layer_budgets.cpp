// Retrieval budgets by layer (src/index/layer_budgets.h): the allocation is the exact optimum at the same mean,
// the calibration's missed mass is a proper share that more retrieval only lowers, and a session with the
// calibration on gives its layers those multiples and decodes with them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "attention/retro.h"
#include "index/layer_budgets.h"
#include "retroinfer/error.h"
#include "retroinfer/model.h"
#include "tiny_model_util.h"

using retroinfer::AttentionConfig;
using retroinfer::AttentionKind;
using retroinfer::AttentionShape;
using retroinfer::DType;
using retroinfer::Error;
using retroinfer::KvCache;
using retroinfer::attention::RetroAttention;
using retroinfer::index::allocate_layer_budgets;
using retroinfer::index::kLayerBudgetMultipliers;

namespace {

constexpr size_t kM = kLayerBudgetMultipliers.size();

// A layer whose missed mass falls from `at_least` by `gain` per unit of multiplier (flat: gain 0).
std::vector<double> linear_curve(double at_least, double gain) {
  std::vector<double> c(kM);
  for (size_t m = 0; m < kM; ++m) c[m] = at_least + gain * (4.0 - kLayerBudgetMultipliers[m]);
  return c;
}

double mean(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0) / double(v.size()); }

}  // namespace

TEST(LayerBudgets, TheLayerThatGainsMostTakesTheBudgetAtTheSameMean) {
  // Layer 1 loses much mass at small budgets, layers 0 and 2 nothing: 1 takes 2.5 of the others' budget.
  const std::vector<double> m = allocate_layer_budgets({linear_curve(0.1, 0.0), linear_curve(0.0, 0.2),
                                                        linear_curve(0.05, 0.0)});
  ASSERT_EQ(m.size(), 3u);
  EXPECT_DOUBLE_EQ(m[0], 0.25);
  EXPECT_DOUBLE_EQ(m[2], 0.25);
  // 2.5 is left for it, not a multiple it may take: 2, and the other half stays unspent (ties: fewer units).
  EXPECT_DOUBLE_EQ(m[1], 2.0);
  EXPECT_LE(mean(m), 1.0);
}

TEST(LayerBudgets, EqualLayersKeepTheNominalBudgetAndTheOptimumIsExact) {
  const std::vector<double> convex = {0.40, 0.20, 0.12, 0.08, 0.05, 0.03, 0.015, 0.01};
  const std::vector<double> m = allocate_layer_budgets({convex, convex, convex, convex});
  for (double x : m) EXPECT_DOUBLE_EQ(x, 1.0);
  // Against every assignment of two layers with different curves: the allocation's sum is the least.
  const std::vector<double> steep = {0.9, 0.8, 0.7, 0.6, 0.4, 0.2, 0.1, 0.05};
  const std::vector<std::vector<double>> missed = {convex, steep};
  const std::vector<double> got = allocate_layer_budgets(missed);
  double best = 1e9;
  for (size_t a = 0; a < kM; ++a)
    for (size_t b = 0; b < kM; ++b)
      if (kLayerBudgetMultipliers[a] + kLayerBudgetMultipliers[b] <= 2.0 + 1e-9)
        best = std::min(best, convex[a] + steep[b]);
  double sum = 0.0;
  for (size_t l = 0; l < 2; ++l)
    for (size_t i = 0; i < kM; ++i)
      if (kLayerBudgetMultipliers[i] == got[l]) sum += missed[l][i];
  EXPECT_DOUBLE_EQ(sum, best);
  EXPECT_GT(got[1], got[0]);  // the steep layer gets more
}

TEST(LayerBudgets, BadCurvesAreErrors) {
  EXPECT_TRUE(allocate_layer_budgets({}).empty());
  EXPECT_THROW(allocate_layer_budgets({{0.1, 0.2}}), Error);
  std::vector<double> bad = linear_curve(0.0, 0.1);
  bad[3] = -0.5;
  EXPECT_THROW(allocate_layer_budgets({bad}), Error);
  bad[3] = std::nan("");
  EXPECT_THROW(allocate_layer_budgets({bad}), Error);
}

TEST(LayerBudgets, MissedMassIsAShareThatMoreRetrievalOnlyLowers) {
  const AttentionShape shape{4, 2, 32};
  AttentionConfig cfg;
  cfg.tokens_per_cluster = 4;
  cfg.window_tokens = 16;
  cfg.retrieval_fraction = 0.05;
  const int64_t n = 1024;
  KvCache kv(shape.num_heads_kv, shape.head_dim, DType::kF32);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> k(n * shape.num_heads_kv * shape.head_dim), v(k.size());
  for (auto& x : k) x = 2.0f * nd(rng);
  for (auto& x : v) x = nd(rng);
  kv.append(k.data(), v.data(), n);
  RetroAttention retro(cfg, shape);
  const int64_t rows = 8;
  std::vector<float> q(rows * shape.num_heads_q * shape.head_dim);
  for (auto& x : q) x = nd(rng);
  EXPECT_TRUE(retro.calibration_missed_mass(kv, q.data(), rows).empty());  // no index yet
  retro.on_prefill(kv);
  const std::vector<double> missed = retro.calibration_missed_mass(kv, q.data(), rows);
  ASSERT_EQ(missed.size(), kM);
  for (size_t m = 0; m < kM; ++m) {
    EXPECT_GE(missed[m], 0.0);
    EXPECT_LE(missed[m], 1.0);
    if (m > 0) {
      EXPECT_LE(missed[m], missed[m - 1] + 1e-12);
    }
  }
  EXPECT_GT(missed.front(), missed.back());  // random keys: the extra clusters hold mass
  for (double x : retro.calibration_missed_mass(kv, q.data(), 0)) EXPECT_EQ(x, 0.0);
  EXPECT_THROW(retro.calibration_missed_mass(kv, q.data(), n + 1), Error);
  // The multiplier scales the retrieval zone and a new prefill restores the nominal one.
  std::vector<float> out(shape.num_heads_q * shape.head_dim);
  const int64_t nominal = retro.decode(kv, q.data(), out.data()).retrieved_clusters;
  retro.on_prefill(kv);
  retro.set_retrieval_multiplier(4.0);
  EXPECT_GT(retro.decode(kv, q.data(), out.data()).retrieved_clusters, 3 * nominal);
  retro.on_prefill(kv);
  EXPECT_DOUBLE_EQ(retro.retrieval_multiplier(), 1.0);
  EXPECT_EQ(retro.decode(kv, q.data(), out.data()).retrieved_clusters, nominal);
  EXPECT_THROW(retro.set_retrieval_multiplier(0.0), Error);
}

TEST(LayerBudgets, SessionCalibratesItsLayersAndItsForksDoToo) {
  const retroinfer::Model* model = retroinfer::test::tiny_llama3();
  if (model == nullptr) GTEST_SKIP() << "tiny-llama3 fixture absent";
  retroinfer::SessionOptions so;
  so.attention.kind = AttentionKind::kRetro;
  so.attention.tokens_per_cluster = 2;
  so.attention.window_tokens = 16;
  so.attention.retrieval_fraction = 0.05;
  so.prefill_chunk = 100;  // the kept queries span chunks
  so.max_context = 400;
  const std::vector<int32_t> prompt = retroinfer::test::token_stream(360, 11);
  retroinfer::Session uniform(*model, so);
  uniform.prefill(prompt);
  EXPECT_TRUE(uniform.layer_budget_multipliers().empty());

  so.attention.layer_budget_queries = 16;
  retroinfer::Session calibrated(*model, so);
  std::vector<float> logits = calibrated.prefill(prompt);
  const std::vector<double>& m = calibrated.layer_budget_multipliers();
  ASSERT_EQ(m.size(), static_cast<size_t>(model->config().num_layers));
  EXPECT_LE(mean(m), 1.0 + 1e-12);
  for (double x : m) EXPECT_NE(std::find(kLayerBudgetMultipliers.begin(), kLayerBudgetMultipliers.end(), x),
                               kLayerBudgetMultipliers.end());
  std::vector<float> step(model->config().vocab_size);
  calibrated.decode(1, step);
  for (float x : step) ASSERT_TRUE(std::isfinite(x));

  // A fork of a full-attention prefill with the calibration on gets the same multiples (same prompt, same K/V).
  retroinfer::SessionOptions full = so;
  full.attention.kind = AttentionKind::kFull;
  full.attention.layer_budget_queries = 0;
  retroinfer::Session base(*model, full);
  base.prefill(prompt);
  const auto fork = base.fork(so.attention);
  EXPECT_EQ(fork->layer_budget_multipliers(), m);
  // After a decode step the kept queries are no longer the cache's last: a fork then keeps uniform budgets.
  base.decode(1, step);
  EXPECT_TRUE(base.fork(so.attention)->layer_budget_multipliers().empty());
}

TEST(LayerBudgets, OnlyRetroWithTheCalibrationAndFullKeepPromptQueries) {
  using retroinfer::index::prompt_queries_to_keep;
  AttentionConfig a;
  a.kind = AttentionKind::kRetro;
  EXPECT_EQ(prompt_queries_to_keep(a), 0);  // uniform budgets need none
  a.layer_budget_queries = 32;
  EXPECT_EQ(prompt_queries_to_keep(a), 64);  // at least what a fork of full may ask for
  a.layer_budget_queries = 200;
  EXPECT_EQ(prompt_queries_to_keep(a), 200);
  a.kind = AttentionKind::kFull;
  EXPECT_EQ(prompt_queries_to_keep(a), 64);  // the eval's shared prefill: its retro forks calibrate from these
  a.kind = AttentionKind::kQuest;
  EXPECT_EQ(prompt_queries_to_keep(a), 0);
  a.kind = AttentionKind::kStreaming;
  EXPECT_EQ(prompt_queries_to_keep(a), 0);
}
