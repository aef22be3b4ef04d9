// retro's outlier zone (index::split_outliers, AttentionConfig::outlier_fraction): the split keeps the index
// consistent (partition, centroids = means of the remaining members, value sums, sizes), takes the tokens
// of largest residual, the outlier tokens are read exactly, and an isolated key that dominates attention
// (a "needle" that k-means folds into a cluster of ordinary keys) is read exactly instead of averaged away.
// Zone coverage during index updates is checked in test_retro.cpp (IndexUpdatesWhileDecoding).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "attention/retro.h"
#include "index/kmeans.h"
#include "index/wave_index.h"
#include "retroinfer/attention.h"
#include "retroinfer/error.h"
#include "test_util.h"

using retroinfer::AttentionConfig;
using retroinfer::AttentionKind;
using retroinfer::AttentionShape;
using retroinfer::AttentionStats;
using retroinfer::DType;
using retroinfer::KvCache;
using retroinfer::attention::RetroAttention;
using retroinfer::index::ClusterIndex;
using retroinfer::index::Zone;

namespace {

// n keys around `centers` random centres (spread 1.5, noise 0.5), values N(0, 1); [n, d] f32 row-major.
void clustered_rows(int64_t n, int d, int centers, uint32_t seed, std::vector<float>& keys,
                    std::vector<float>& values) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> c(static_cast<size_t>(centers) * d);
  for (auto& x : c) x = 1.5f * nd(rng);
  std::uniform_int_distribution<int> pick(0, centers - 1);
  keys.resize(static_cast<size_t>(n) * d);
  values.resize(static_cast<size_t>(n) * d);
  for (int64_t t = 0; t < n; ++t) {
    const int j = pick(rng);
    for (int i = 0; i < d; ++i) {
      keys[t * d + i] = c[static_cast<size_t>(j) * d + i] + 0.5f * nd(rng);
      values[t * d + i] = nd(rng);
    }
  }
}

double sq_dist(const float* a, const float* b, int d) {
  double s = 0.0;
  for (int i = 0; i < d; ++i) s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return s;
}

using retroinfer::test::nmse;

}  // namespace

TEST(RetroOutliers, SplitKeepsTheIndexConsistent) {
  const int d = 32;
  const int64_t n = 500;
  std::vector<float> keys, values;
  clustered_rows(n, d, 10, 5, keys, values);
  retroinfer::index::KMeansParams p;
  p.tokens_per_cluster = 16;
  p.segment_tokens = 256;
  const ClusterIndex before = retroinfer::index::segmented_kmeans(keys.data(), values.data(), n, d, p);
  // Residual of every token against its cluster's centroid before the split.
  std::vector<double> res(n);
  for (int64_t i = 0; i < n; ++i)
    res[i] = sq_dist(keys.data() + i * d, before.centroids.data() + static_cast<int64_t>(before.assignment[i]) * d, d);
  ClusterIndex ci = before;
  const std::vector<int32_t> out = retroinfer::index::split_outliers(ci, keys.data(), values.data(), n, 0.02);
  ASSERT_EQ(out.size(), 10u);  // round(0.02 * 500)
  ASSERT_TRUE(std::is_sorted(out.begin(), out.end()));
  // They are the 10 largest residuals.
  double min_out = INFINITY, max_kept = 0.0;
  std::vector<char> is_out(n, 0);
  for (int32_t t : out) {
    is_out[t] = 1;
    min_out = std::min(min_out, res[t]);
  }
  for (int64_t i = 0; i < n; ++i)
    if (!is_out[i]) max_kept = std::max(max_kept, res[i]);
  EXPECT_GE(min_out, max_kept);
  // Partition: every other token in exactly one cluster, CSR and assignment agree, members ascending.
  ASSERT_EQ(ci.num_clusters, before.num_clusters);
  ASSERT_EQ(ci.offsets.back(), n - 10);
  std::vector<int> seen(n, 0);
  for (int j = 0; j < ci.num_clusters; ++j) {
    EXPECT_EQ(ci.offsets[j + 1] - ci.offsets[j], ci.sizes[j]) << "cluster " << j;
    std::vector<double> mean(d, 0.0), vsum(d, 0.0);
    for (int32_t m = ci.offsets[j]; m < ci.offsets[j + 1]; ++m) {
      const int32_t t = ci.members[m];
      if (m > ci.offsets[j]) {
        EXPECT_LT(ci.members[m - 1], t);
      }
      EXPECT_EQ(ci.assignment[t], j);
      ++seen[t];
      for (int i = 0; i < d; ++i) {
        mean[i] += keys[static_cast<int64_t>(t) * d + i];
        vsum[i] += values[static_cast<int64_t>(t) * d + i];
      }
    }
    if (ci.sizes[j] == 0) continue;
    // Centroid = mean of the remaining members, value sum = their sum (f32 sums of <= ~60 O(1) terms:
    // 1e-4 absolute is ~100x their rounding).
    for (int i = 0; i < d; ++i) {
      EXPECT_NEAR(ci.centroids[static_cast<size_t>(j) * d + i], mean[i] / ci.sizes[j], 1e-4) << "cluster " << j;
      EXPECT_NEAR(ci.value_sums[static_cast<size_t>(j) * d + i], vsum[i], 1e-4) << "cluster " << j;
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(seen[i], is_out[i] ? 0 : 1) << "token " << i;
    if (is_out[i]) {
      EXPECT_EQ(ci.assignment[i], -1);
    }
  }
  // Untouched clusters keep their centroid bit for bit.
  for (int j = 0; j < ci.num_clusters; ++j) {
    if (ci.sizes[j] != before.sizes[j]) continue;
    for (int i = 0; i < d; ++i)
      EXPECT_EQ(ci.centroids[static_cast<size_t>(j) * d + i], before.centroids[static_cast<size_t>(j) * d + i]);
  }
  // Fraction 0: nothing; bad fraction / size: Error.
  ClusterIndex same = before;
  EXPECT_TRUE(retroinfer::index::split_outliers(same, keys.data(), values.data(), n, 0.0).empty());
  EXPECT_EQ(same.members, before.members);
  EXPECT_THROW(retroinfer::index::split_outliers(same, keys.data(), values.data(), n, 1.5), retroinfer::Error);
  EXPECT_THROW(retroinfer::index::split_outliers(same, keys.data(), values.data(), n - 1, 0.1), retroinfer::Error);
}

TEST(RetroOutliers, ExactlyRepresentedTokensAreNeverOutliers) {
  // One token per cluster: every key is its own centroid, so even fraction 1 takes nothing.
  const int d = 16;
  std::vector<float> keys, values;
  clustered_rows(40, d, 4, 6, keys, values);
  retroinfer::index::KMeansParams p;
  p.tokens_per_cluster = 1;
  ClusterIndex ci = retroinfer::index::segmented_kmeans(keys.data(), values.data(), 40, d, p);
  EXPECT_TRUE(retroinfer::index::split_outliers(ci, keys.data(), values.data(), 40, 1.0).empty());
}

TEST(RetroOutliers, AllOutliersEqualsFull) {
  // outlier_fraction 1: every token with a residual is read exactly, the rest sit in clusters whose members
  // all equal the centroid, so estimating everything else reproduces full attention.
  const AttentionShape shape{8, 2, 64};
  KvCache kv(2, 64, DType::kBF16);
  std::vector<float> k1, v1, k2, v2;
  clustered_rows(400, 64, 12, 7, k1, v1);
  clustered_rows(400, 64, 12, 8, k2, v2);
  std::vector<float> k(400 * 2 * 64), v(400 * 2 * 64);
  for (int64_t t = 0; t < 400; ++t)
    for (int i = 0; i < 64; ++i) {
      k[(t * 2) * 64 + i] = k1[t * 64 + i];
      k[(t * 2 + 1) * 64 + i] = k2[t * 64 + i];
      v[(t * 2) * 64 + i] = v1[t * 64 + i];
      v[(t * 2 + 1) * 64 + i] = v2[t * 64 + i];
    }
  kv.append(k.data(), v.data(), 400);
  AttentionConfig cfg;
  cfg.window_tokens = 16;
  cfg.tokens_per_cluster = 8;
  cfg.segment_tokens = 128;
  cfg.retrieval_fraction = 0.0;
  cfg.estimation_fraction = 1.0;
  cfg.outlier_fraction = 1.0;
  RetroAttention retro(cfg, shape);
  AttentionConfig fc = cfg;
  fc.kind = AttentionKind::kFull;
  auto full = retroinfer::make_attention(fc, shape);
  retro.on_prefill(kv);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(8 * 64), out(8 * 64, NAN), ref(8 * 64);
  for (auto& x : q) x = nd(rng);
  const AttentionStats st = retro.decode(kv, q.data(), out.data());
  full->decode(kv, q.data(), ref.data());
  int64_t outliers = 0;
  for (const auto& hi : retro.wave_index().heads) outliers += static_cast<int64_t>(hi.outliers.size());
  EXPECT_GT(outliers, 2 * 370);  // of 380 indexed tokens per head, all but exact duplicates of a centroid
  EXPECT_EQ(st.exact_tokens, 2 * (4 + 16) + outliers);
  // Same tolerance as test_retro.cpp's kMaxNmse: a token missing or counted twice gives ~1e-6.
  EXPECT_LE(nmse(out, ref), 1e-9);
}

TEST(RetroOutliers, IsolatedNeedleIsReadExactly) {
  // One KV head (d 64, GQA group 4), 2000 keys around 8 centres (spread 1.5, noise 0.5) with the component
  // along a unit direction u projected out, and one needle: an ordinary key (not of centre 0) plus 6u.
  // Queries 16u + a component along centre 0 that gives centre 0's keys logit ~3: the needle's logit is
  // 16 * 6 / sqrt(64) = 12, so it holds ~96% of the mass (e^12 against ~250 e^3 + 1750 e^0). k-means puts
  // the needle in a cluster of ordinary keys of its centre, whose centroid gets only ~6/16 of the offset
  // (logit ~0.75): centre 0's clusters (logit ~3) take the retrieval zone and the needle is averaged away.
  // Its residual (~sqrt(36 + 16) = 7.2 against ~4 +- 0.35 for ordinary keys, whose residual is noise of
  // 0.5 per dimension) makes it the first outlier.
  const int d = 64;
  const AttentionShape shape{4, 1, d};
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto unit = [&](std::vector<float>& x) {
    double norm = 0.0;
    for (float v : x) norm += static_cast<double>(v) * v;
    for (auto& v : x) v = static_cast<float>(v / std::sqrt(norm));
  };
  auto project_out = [d](float* x, const std::vector<float>& dir) {
    double p = 0.0;
    for (int i = 0; i < d; ++i) p += static_cast<double>(x[i]) * dir[i];
    for (int i = 0; i < d; ++i) x[i] -= static_cast<float>(p * dir[i]);
  };
  std::vector<float> u(d);
  for (auto& x : u) x = nd(rng);
  unit(u);
  const int kCenters = 8;
  std::vector<float> c(static_cast<size_t>(kCenters) * d);
  for (auto& x : c) x = 1.5f * nd(rng);
  const int64_t n = 2000;
  std::vector<float> keys(n * d), values(n * d);
  std::vector<int> center(n);
  std::uniform_int_distribution<int> pick(0, kCenters - 1);
  for (int64_t t = 0; t < n; ++t) {
    center[t] = pick(rng);
    for (int i = 0; i < d; ++i) {
      keys[t * d + i] = c[static_cast<size_t>(center[t]) * d + i] + 0.5f * nd(rng);
      values[t * d + i] = nd(rng);
    }
    project_out(keys.data() + t * d, u);
  }
  int64_t needle = 1001;
  while (center[needle] == 0) ++needle;
  for (int i = 0; i < d; ++i) {
    keys[needle * d + i] += 6.0f * u[i];
    values[needle * d + i] = 3.0f;  // distinctive value: losing the needle moves the output far
  }
  KvCache kv(1, d, DType::kF32);
  kv.append(keys.data(), values.data(), n);
  std::vector<float> c0(c.begin(), c.begin() + d);
  project_out(c0.data(), u);
  double c0_norm = 0.0;
  for (float x : c0) c0_norm += static_cast<double>(x) * x;
  c0_norm = std::sqrt(c0_norm);
  unit(c0);
  const float t0 = static_cast<float>(3.0 * 8.0 / c0_norm);  // (t0 c0_hat) . c0 / sqrt(64) = 3
  std::vector<float> q(4 * d);
  for (int g = 0; g < 4; ++g)
    for (int i = 0; i < d; ++i) q[g * d + i] = 16.0f * u[i] + t0 * c0[i] + 0.1f * nd(rng);
  AttentionConfig cfg;  // paper defaults, short segments
  cfg.segment_tokens = 512;
  AttentionConfig fc = cfg;
  fc.kind = AttentionKind::kFull;
  auto full = retroinfer::make_attention(fc, shape);
  std::vector<float> ref(4 * d), out(4 * d);
  full->decode(kv, q.data(), ref.data());
  double err[2];
  for (int on = 0; on < 2; ++on) {
    AttentionConfig cf = cfg;
    cf.outlier_fraction = on ? 0.0025 : 0.0;  // on: round(0.0025 * 1932) = 5 outliers
    RetroAttention retro(cf, shape);
    retro.on_prefill(kv);
    const AttentionStats st = retro.decode(kv, q.data(), out.data());
    std::vector<Zone> zones;
    retro.zones(kv, q.data(), zones);
    err[on] = nmse(out, ref);
    SCOPED_TRACE(testing::Message() << "outlier zone " << (on ? "on" : "off") << " nmse " << err[on]);
    int64_t exact = 0, outlier_zone = 0;
    for (Zone z : zones) {
      exact += z == Zone::kSteady || z == Zone::kRetrieval || z == Zone::kOutlier;
      outlier_zone += z == Zone::kOutlier;
    }
    EXPECT_EQ(st.exact_tokens, exact);  // the outliers count as exact reads
    if (on) {
      EXPECT_EQ(zones[needle], Zone::kOutlier);
      EXPECT_EQ(retro.wave_index().heads[0].outliers.size(), 5u);
      EXPECT_EQ(outlier_zone, 5);
    } else {
      EXPECT_NE(zones[needle], Zone::kRetrieval);  // the premise: its cluster is not retrieved
      EXPECT_EQ(outlier_zone, 0);
    }
  }
  // The needle carries ~96% of the mass: reading it exactly must cut the error by far more than 10x.
  EXPECT_LT(err[1], 0.1 * err[0]) << "on " << err[1] << " off " << err[0];
  std::printf("isolated needle: nmse with outlier zone %.3g, without %.3g\n", err[1], err[0]);
}
