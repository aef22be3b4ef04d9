// The pieces of `retroinfer eval needle` (src/eval/needle_probe.h) that do not need a model: true
// attention probabilities, zone coverage counts and masses, cluster ranks under the sum and the max over
// the GQA group, and the retro variant specs.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "eval/needle_probe.h"
#include "retroinfer/attention.h"
#include "retroinfer/error.h"

using retroinfer::AttentionConfig;
using retroinfer::AttentionMethod;
using retroinfer::DType;
using retroinfer::Error;
using retroinfer::KvCache;
using retroinfer::eval::attention_probs;
using retroinfer::eval::cluster_ranks;
using retroinfer::eval::head_coverage;
using retroinfer::eval::retro_variant;

namespace {

// One KV head, head_dim 3: keys = rows of `keys` ([n, 3]), values zero.
KvCache cache_of(const std::vector<float>& keys) {
  KvCache kv(1, 3, DType::kF32);
  const std::vector<float> v(keys.size(), 0.0f);
  kv.append(keys.data(), v.data(), static_cast<int64_t>(keys.size() / 3));
  return kv;
}

TEST(NeedleProbe, AttentionProbsAreEachHeadsSoftmax) {
  const KvCache kv = cache_of({1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1});
  const std::vector<float> q = {1, 2, 3, -1, 0, 0.5f};  // [group 2, 3]
  std::vector<float> p;
  attention_probs(kv, 0, q.data(), 2, 0.5f, p);
  ASSERT_EQ(p.size(), 8u);
  for (int g = 0; g < 2; ++g) {
    double z = 0.0;
    std::vector<double> e(4);
    for (int t = 0; t < 4; ++t) {
      double l = 0.0;
      for (int i = 0; i < 3; ++i) l += q[g * 3 + i] * (t < 3 ? (i == t ? 1.0 : 0.0) : 1.0);
      e[t] = std::exp(0.5 * l);
      z += e[t];
    }
    for (int t = 0; t < 4; ++t) EXPECT_NEAR(p[g * 4 + t], e[t] / z, 1e-6) << "head " << g << " token " << t;
  }
}

TEST(NeedleProbe, HeadCoverageCountsAndMasses) {
  // group 2, 4 tokens; mean probabilities over the group: 0.2, 0.3, 0.1, 0.4.
  const std::vector<float> probs = {0.1f, 0.4f, 0.1f, 0.4f, 0.3f, 0.2f, 0.1f, 0.4f};
  constexpr uint8_t I = AttentionMethod::kZoneIgnored, X = AttentionMethod::kZoneExact,
                    E = AttentionMethod::kZoneEstimated;
  const std::vector<uint8_t> oracle = {X, X, I, X};
  const std::vector<uint8_t> retro = {X, E, X, X};
  const std::vector<int64_t> needle = {1, 3};
  const auto c = head_coverage(probs, 2, needle, oracle, retro);
  EXPECT_EQ(c.needle, 2);
  EXPECT_EQ(c.in_oracle, 2);
  EXPECT_EQ(c.in_retro, 1);
  EXPECT_EQ(c.in_oracle_retro, 1);
  EXPECT_EQ(c.in_retro_est, 1);
  EXPECT_NEAR(c.needle_mass, 0.7, 1e-6);
  EXPECT_NEAR(c.mass_oracle, 0.9, 1e-6);
  EXPECT_NEAR(c.mass_retro, 0.7, 1e-6);
  EXPECT_NEAR(c.mass_retro_est, 0.3, 1e-6);
  const std::vector<int64_t> bad = {4};
  EXPECT_THROW(head_coverage(probs, 2, bad, oracle, retro), Error);
  const std::vector<uint8_t> short_zones = {X, X, X};
  EXPECT_THROW(head_coverage(probs, 2, needle, short_zones, retro), Error);
}

TEST(NeedleProbe, ClusterRanksUnderSumAndMaxOverTheGroup) {
  // Three one-member clusters with one-hot centroids (tokens 0..2) and an outlier (token 3). The query
  // heads' logits are the log of the wanted per-head softmax: head A (0.6, 0.4, ~0), head B (0.3, ~0,
  // 0.7). Sum: c0 0.9 > c2 0.7 > c1 0.4; max: c2 0.7 > c0 0.6 > c1 0.4.
  const KvCache kv = cache_of({1, 0, 0, 0, 1, 0, 0, 0, 1, 2, 0, 0});
  retroinfer::index::HeadIndex hi;
  hi.head_dim = 3;
  hi.centroids = {1, 0, 0, 0, 1, 0, 0, 0, 1};
  hi.value_sums.assign(9, 0.0f);
  hi.sizes = {1, 1, 1};
  hi.offsets = {0, 1, 2, 3};
  hi.members = {0, 1, 2};
  hi.outliers = {3};
  const std::vector<float> q = {std::log(0.6f), std::log(0.4f), std::log(1e-6f),
                                std::log(0.3f), std::log(1e-6f), std::log(0.7f)};
  const std::vector<int64_t> tokens = {0, 1, 2, 3};
  const auto r = cluster_ranks(hi, kv, 0, q.data(), 2, 1.0f, tokens);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].cluster, 0);
  EXPECT_EQ(r[0].rank_sum, 0);
  EXPECT_EQ(r[0].rank_max, 1);
  EXPECT_EQ(r[1].rank_sum, 2);
  EXPECT_EQ(r[1].rank_max, 2);
  EXPECT_EQ(r[2].rank_sum, 1);
  EXPECT_EQ(r[2].rank_max, 0);
  EXPECT_EQ(r[2].size, 1);
  EXPECT_NEAR(r[0].centroid_gap, 0.0f, 1e-6f);  // the key is its centroid
  EXPECT_EQ(r[3].cluster, -1);                   // outlier: in no cluster
  // A key above its centroid: token 3 put into cluster 0 (centroid e0, key 2 e0) gives q.(k - c) per head:
  // head A log(0.6), head B log(0.3); the gap is the larger.
  hi.members = {0, 3, 1, 2};
  hi.offsets = {0, 2, 3, 4};
  hi.sizes = {2, 1, 1};
  hi.outliers.clear();
  const std::vector<int64_t> t3 = {3};
  const auto r3 = cluster_ranks(hi, kv, 0, q.data(), 2, 1.0f, t3);
  EXPECT_EQ(r3[0].cluster, 0);
  EXPECT_EQ(r3[0].size, 2);
  EXPECT_NEAR(r3[0].centroid_gap, std::log(0.6f), 1e-5f);
}

TEST(NeedleProbe, RetroVariantSpecs) {
  AttentionConfig base;
  base.kind = retroinfer::AttentionKind::kFull;
  const AttentionConfig a = retro_variant(base, "c8:r0.036:noest:i3:g0:e0.2:o0.01");
  EXPECT_EQ(a.kind, retroinfer::AttentionKind::kRetro);
  EXPECT_EQ(a.tokens_per_cluster, 8);
  EXPECT_DOUBLE_EQ(a.retrieval_fraction, 0.036);
  EXPECT_DOUBLE_EQ(a.estimation_fraction, 0.2);
  EXPECT_DOUBLE_EQ(a.outlier_fraction, 0.01);
  EXPECT_FALSE(a.estimation);
  EXPECT_EQ(a.kmeans_segment_iters, 3);
  EXPECT_EQ(a.kmeans_global_iters, 0);
  const AttentionConfig d = retro_variant(base, "c16");
  EXPECT_EQ(d.tokens_per_cluster, 16);
  EXPECT_TRUE(d.estimation);
  for (const char* bad : {"", "c", "x3", "c8.5", "c8:", "r2", "c-4", "cabc", "c8::r0.1"})
    EXPECT_THROW(retro_variant(base, bad), Error) << "spec '" << bad << "'";
}

}  // namespace
