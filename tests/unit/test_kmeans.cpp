// Segmented spherical k-means (src/index/kmeans.h): partition invariants, monotone objective, empty
// clusters, global means, segment boundaries, determinism and bad arguments.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "index/kmeans.h"
#include "index/wave_index.h"
#include "retroinfer/error.h"

using retroinfer::index::ClusterIndex;
using retroinfer::index::KMeansParams;

namespace {

// Keys around `centers` random centres (spread 2, noise 0.3) so that clustering has structure to find;
// values independent N(0, 1). Both [n, d] row-major.
struct Data {
  std::vector<float> keys, values;
};
Data clustered(int64_t n, int d, int centers, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> c(static_cast<size_t>(centers) * d);
  for (auto& x : c) x = 2.0f * nd(rng);
  Data out;
  out.keys.resize(n * d);
  out.values.resize(n * d);
  std::uniform_int_distribution<int> pick(0, centers - 1);
  for (int64_t t = 0; t < n; ++t) {
    const int j = pick(rng);
    for (int i = 0; i < d; ++i) {
      out.keys[t * d + i] = c[static_cast<size_t>(j) * d + i] + 0.3f * nd(rng);
      out.values[t * d + i] = nd(rng);
    }
  }
  return out;
}

int64_t expected_clusters(int64_t n, const KMeansParams& p) {
  int64_t k = 0;
  for (int64_t b = 0; b < n; b += p.segment_tokens) {
    const int64_t len = std::min<int64_t>(p.segment_tokens, n - b);
    k += std::max<int64_t>(1, (len + p.tokens_per_cluster - 1) / p.tokens_per_cluster);
  }
  return k;
}

// Every token in exactly one cluster and the four views (assignment, sizes, offsets, members) agree.
void expect_partition(const ClusterIndex& ci, int64_t n) {
  ASSERT_EQ(static_cast<int64_t>(ci.assignment.size()), n);
  ASSERT_EQ(static_cast<int64_t>(ci.members.size()), n);
  ASSERT_EQ(static_cast<int>(ci.sizes.size()), ci.num_clusters);
  ASSERT_EQ(static_cast<int>(ci.offsets.size()), ci.num_clusters + 1);
  ASSERT_EQ(ci.centroids.size(), static_cast<size_t>(ci.num_clusters) * ci.head_dim);
  ASSERT_EQ(ci.value_sums.size(), static_cast<size_t>(ci.num_clusters) * ci.head_dim);
  EXPECT_EQ(ci.offsets.front(), 0);
  EXPECT_EQ(ci.offsets.back(), n);
  std::vector<int> seen(n, 0);
  int64_t total = 0;
  for (int j = 0; j < ci.num_clusters; ++j) {
    ASSERT_LE(ci.offsets[j], ci.offsets[j + 1]);
    EXPECT_EQ(ci.sizes[j], ci.offsets[j + 1] - ci.offsets[j]) << "cluster " << j;
    total += ci.sizes[j];
    for (int32_t m = ci.offsets[j]; m < ci.offsets[j + 1]; ++m) {
      const int32_t t = ci.members[m];
      ASSERT_TRUE(t >= 0 && t < n) << "member " << t;
      ++seen[t];
      EXPECT_EQ(ci.assignment[t], j) << "token " << t;
      if (m > ci.offsets[j]) {
        EXPECT_LT(ci.members[m - 1], t) << "members not ascending in cluster " << j;
      }
    }
  }
  EXPECT_EQ(total, n);
  for (int64_t t = 0; t < n; ++t) EXPECT_EQ(seen[t], 1) << "token " << t;
  for (float v : ci.centroids) ASSERT_TRUE(std::isfinite(v));
  for (float v : ci.value_sums) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace

TEST(KMeans, PartitionAndClusterCountAcrossShapes) {
  for (int64_t n : {1, 7, 17, 300, 1025}) {
    for (int seg : {64, 256, 8192}) {
      for (int tpc : {1, 5, 16}) {
        if (seg < tpc) continue;
        SCOPED_TRACE(testing::Message() << "n " << n << " segment " << seg << " tpc " << tpc);
        const int d = 24;
        Data data = clustered(n, d, 9, static_cast<uint32_t>(n * 31 + seg + tpc));
        KMeansParams p{tpc, seg, 3, 1};
        const ClusterIndex ci = retroinfer::index::segmented_kmeans(data.keys.data(), data.values.data(), n, d, p);
        EXPECT_EQ(ci.num_clusters, expected_clusters(n, p));
        EXPECT_EQ(ci.head_dim, d);
        expect_partition(ci, n);
      }
    }
  }
}

TEST(KMeans, SphericalObjectiveNeverDecreases) {
  const int64_t n = 1000;
  const int d = 64;
  Data data = clustered(n, d, 40, 7);
  double prev = -INFINITY, first = 0.0;
  for (int it = 0; it <= 9; ++it) {
    KMeansParams p{16, 256, it, 0};
    const ClusterIndex ci = retroinfer::index::segmented_kmeans(data.keys.data(), data.values.data(), n, d, p);
    const double obj = retroinfer::index::kmeans_objective(data.keys.data(), n, d, ci);
    if (it == 0) first = obj;
    // The objective is a sum of n = 1000 terms of size ~|k - mu| ~ 16 computed from f32 centroids that
    // were normalised, de-centred and re-centred (relative rounding ~1e-7 each): 1e-6 relative slack.
    EXPECT_GE(obj, prev - 1e-6 * std::fabs(prev)) << "iteration " << it;
    prev = obj;
  }
  // And the iterations do something: on clustered data the initial evenly spaced picks are far from optimal.
  EXPECT_GT(prev, first * 1.01);
}

TEST(KMeans, SegmentsRespectedWithoutGlobalStep) {
  const int64_t n = 700;
  const int d = 16;
  Data data = clustered(n, d, 5, 11);  // few centres: every segment shares them, so a global step would mix
  for (int global : {0, 1}) {
    KMeansParams p{10, 200, 4, global};
    const ClusterIndex ci = retroinfer::index::segmented_kmeans(data.keys.data(), data.values.data(), n, d, p);
    expect_partition(ci, n);
    int64_t crossing = 0, base = 0;
    for (int64_t b = 0; b < n; b += p.segment_tokens) {
      const int64_t len = std::min<int64_t>(p.segment_tokens, n - b);
      const int64_t k = (len + p.tokens_per_cluster - 1) / p.tokens_per_cluster;
      for (int64_t t = b; t < b + len; ++t) crossing += ci.assignment[t] < base || ci.assignment[t] >= base + k;
      base += k;
    }
    if (global == 0)
      EXPECT_EQ(crossing, 0);
    else
      EXPECT_GT(crossing, 0);  // shows the check above can fail
  }
}

TEST(KMeans, GlobalStepAssignsTheBestCentroid) {
  // A run with global_iters = 0 exposes the centroids the global step assigns against (the runs are
  // prefixes of each other); every token must then sit in the cluster of largest inner product. Cluster
  // counts with tails around the 8-lane argmax: 1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 127, 129.
  const int64_t n = 600;
  const int d = 20;
  Data data = clustered(n, d, 25, 17);
  std::vector<double> mu(d, 0.0);
  for (int64_t t = 0; t < n; ++t)
    for (int i = 0; i < d; ++i) mu[i] += data.keys[t * d + i] / static_cast<double>(n);
  for (int k : {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 127, 129}) {
    SCOPED_TRACE(testing::Message() << "clusters " << k);
    const ClusterIndex before =
        retroinfer::index::block_kmeans(data.keys.data(), data.values.data(), n, d, k, {16, 8192, 2, 0});
    const ClusterIndex after =
        retroinfer::index::block_kmeans(data.keys.data(), data.values.data(), n, d, k, {16, 8192, 2, 1});
    std::vector<double> u(static_cast<size_t>(k) * d);  // unit centred centroids before the global step
    for (int j = 0; j < k; ++j) {
      double nrm = 0.0;
      for (int i = 0; i < d; ++i) {
        u[j * d + i] = before.centroids[j * d + i] - mu[i];
        nrm += u[j * d + i] * u[j * d + i];
      }
      for (int i = 0; i < d; ++i) u[j * d + i] /= std::sqrt(nrm);
    }
    for (int64_t t = 0; t < n; ++t) {
      double best = -INFINITY, norm = 0.0;
      std::vector<double> sc(k);
      for (int j = 0; j < k; ++j) {
        sc[j] = 0.0;
        for (int i = 0; i < d; ++i) sc[j] += (data.keys[t * d + i] - mu[i]) * u[j * d + i];
        best = std::max(best, sc[j]);
      }
      for (int i = 0; i < d; ++i) norm += (data.keys[t * d + i] - mu[i]) * (data.keys[t * d + i] - mu[i]);
      // f32 scores of |x| ~ 10 (d = 20, spread 2) carry ~1e-6 relative rounding, and the centroids were
      // de-centred and re-centred in f32: 1e-5 * |x| separates near-ties from a wrong pick.
      EXPECT_GE(sc[after.assignment[t]], best - 1e-5 * std::sqrt(norm)) << "token " << t;
    }
  }
}

TEST(KMeans, CentroidsAreMemberMeansAfterGlobalStep) {
  const int64_t n = 900;
  const int d = 32;
  Data data = clustered(n, d, 30, 3);
  KMeansParams p{12, 256, 5, 1};
  const ClusterIndex ci = retroinfer::index::segmented_kmeans(data.keys.data(), data.values.data(), n, d, p);
  expect_partition(ci, n);
  int nonempty = 0;
  for (int j = 0; j < ci.num_clusters; ++j) {
    if (ci.sizes[j] == 0) continue;
    ++nonempty;
    for (int i = 0; i < d; ++i) {
      double ks = 0.0, vs = 0.0;
      for (int32_t m = ci.offsets[j]; m < ci.offsets[j + 1]; ++m) {
        ks += data.keys[static_cast<size_t>(ci.members[m]) * d + i];
        vs += data.values[static_cast<size_t>(ci.members[m]) * d + i];
      }
      const double mean = ks / ci.sizes[j];
      // Centroid = f32 mean of centred keys + f32 mean key: a few f32 roundings of values ~|k| <= 10,
      // so 1e-5 absolute (~1e-6 relative) with margin.
      EXPECT_NEAR(ci.centroids[static_cast<size_t>(j) * d + i], mean, 1e-5 * (1.0 + std::fabs(mean)))
          << "cluster " << j << " dim " << i;
      // Value sums are accumulated in double and rounded once.
      EXPECT_NEAR(ci.value_sums[static_cast<size_t>(j) * d + i], vs, 1e-6 * (1.0 + std::fabs(vs)));
    }
  }
  EXPECT_GT(nonempty, ci.num_clusters / 2);
}

TEST(KMeans, OneTokenPerClusterReproducesKeys) {
  const int64_t n = 200;
  const int d = 16;
  Data data = clustered(n, d, 50, 5);
  KMeansParams p{1, 64, 9, 1};
  const ClusterIndex ci = retroinfer::index::segmented_kmeans(data.keys.data(), data.values.data(), n, d, p);
  ASSERT_EQ(ci.num_clusters, n);
  expect_partition(ci, n);
  for (int64_t t = 0; t < n; ++t) {
    // Random keys are never parallel, so a normalised key is its own strict best match.
    ASSERT_EQ(ci.assignment[t], t);
    for (int i = 0; i < d; ++i) {
      EXPECT_NEAR(ci.centroids[t * d + i], data.keys[t * d + i], 1e-5f);  // (k - mu) + mu in f32
      EXPECT_EQ(ci.value_sums[t * d + i], data.values[t * d + i]);
    }
  }
}

TEST(KMeans, EmptyClustersFromDuplicatedKeys) {
  const int d = 8;
  const int64_t n = 240;
  // Three distinct keys repeated in blocks of 80: the evenly spaced initial picks duplicate each other, so
  // most clusters can never win a token (ties go to the lowest id) and must stay empty without NaN.
  std::vector<float> keys(n * d), values(n * d);
  for (int64_t t = 0; t < n; ++t)
    for (int i = 0; i < d; ++i) {
      keys[t * d + i] = static_cast<float>((t / 80 + 1) * (i % 3 == t / 80 ? 1 : -1));
      values[t * d + i] = static_cast<float>(t % 5);
    }
  for (int global : {0, 1}) {
    KMeansParams p{10, 120, 9, global};
    const ClusterIndex ci = retroinfer::index::segmented_kmeans(keys.data(), values.data(), n, d, p);
    expect_partition(ci, n);
    int empty = 0;
    for (int j = 0; j < ci.num_clusters; ++j) empty += ci.sizes[j] == 0;
    EXPECT_GE(empty, ci.num_clusters - 6) << "global " << global;  // at most 3 distinct keys per segment
    // Scoring gives -inf to every empty cluster and selection never picks one.
    retroinfer::index::HeadIndex hi;
    hi.append(ci, 0);
    std::vector<float> q(d, 0.5f), logits(ci.num_clusters), scores(ci.num_clusters);
    retroinfer::index::score_clusters(hi, q.data(), 1, 0.3f, logits.data(), scores.data());
    for (int j = 0; j < ci.num_clusters; ++j) {
      if (ci.sizes[j] == 0)
        EXPECT_EQ(scores[j], -INFINITY);
      else
        EXPECT_TRUE(std::isfinite(scores[j]));
    }
    retroinfer::index::ZoneSelection sel;
    retroinfer::index::select_zones(scores.data(), ci.num_clusters, {ci.num_clusters, 0}, sel);
    EXPECT_EQ(static_cast<int>(sel.retrieval.size()), ci.num_clusters - empty);
    for (int32_t j : sel.retrieval) EXPECT_GT(ci.sizes[j], 0);
  }
  // All keys identical: centred keys are zero, every inner product is 0; still no NaN.
  std::vector<float> same(n * d, 1.5f);
  const ClusterIndex ci = retroinfer::index::segmented_kmeans(same.data(), values.data(), n, d, {10, 120, 9, 1});
  expect_partition(ci, n);
}

TEST(KMeans, DeterministicAndBlockVariant) {
  const int64_t n = 500;
  const int d = 32;
  Data data = clustered(n, d, 20, 13);
  KMeansParams p{16, 128, 9, 1};
  const ClusterIndex a = retroinfer::index::segmented_kmeans(data.keys.data(), data.values.data(), n, d, p);
  const ClusterIndex b = retroinfer::index::segmented_kmeans(data.keys.data(), data.values.data(), n, d, p);
  EXPECT_EQ(a.assignment, b.assignment);
  EXPECT_EQ(a.centroids, b.centroids);
  EXPECT_EQ(a.value_sums, b.value_sums);
  for (int k : {1, 7, 64, static_cast<int>(n)}) {
    const ClusterIndex c = retroinfer::index::block_kmeans(data.keys.data(), data.values.data(), n, d, k, p);
    EXPECT_EQ(c.num_clusters, k);
    expect_partition(c, n);
  }
  const ClusterIndex empty = retroinfer::index::segmented_kmeans(nullptr, nullptr, 0, d, p);
  EXPECT_EQ(empty.num_clusters, 0);
  EXPECT_EQ(empty.offsets, std::vector<int32_t>{0});
}

TEST(KMeans, BadArgumentsThrow) {
  std::vector<float> k(64, 1.0f), v(64, 1.0f);
  using retroinfer::Error;
  using retroinfer::index::block_kmeans;
  using retroinfer::index::segmented_kmeans;
  EXPECT_THROW(segmented_kmeans(k.data(), v.data(), 8, 0, {}), Error);
  EXPECT_THROW(segmented_kmeans(k.data(), v.data(), -1, 8, {}), Error);
  EXPECT_THROW(segmented_kmeans(nullptr, v.data(), 8, 8, {}), Error);
  EXPECT_THROW(segmented_kmeans(k.data(), v.data(), 8, 8, {0, 8192, 9, 1}), Error);
  EXPECT_THROW(segmented_kmeans(k.data(), v.data(), 8, 8, {16, 0, 9, 1}), Error);
  EXPECT_THROW(segmented_kmeans(k.data(), v.data(), 8, 8, {16, 8192, -1, 1}), Error);
  EXPECT_THROW(block_kmeans(k.data(), v.data(), 8, 8, 9, {}), Error);
  EXPECT_THROW(block_kmeans(k.data(), v.data(), 8, 8, 0, {}), Error);
  ClusterIndex ci = segmented_kmeans(k.data(), v.data(), 8, 8, {});
  EXPECT_THROW(retroinfer::index::kmeans_objective(k.data(), 7, 8, ci), Error);
}

// A head's cluster logits computed in parts (cluster_logits_range, as retro's decode splits them over threads)
// equal score_clusters' logits bit for bit, at head_dim 64 and 128 (the AVX-512 kernel's shapes on such a
// processor) and 24 (the portable loop); a range outside the clusters is an error, not a read past the end.
TEST(WaveIndex, ClusterLogitsInPartsEqualTheWhole) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  for (int d : {24, 64, 128}) {
    const int64_t n = 600;
    const int group = 3;
    std::vector<float> keys(n * d), values(n * d), q(group * d);
    for (auto& x : keys) x = nd(rng);
    for (auto& x : values) x = nd(rng);
    for (auto& x : q) x = nd(rng);
    const ClusterIndex ci = retroinfer::index::segmented_kmeans(keys.data(), values.data(), n, d, {8, 256, 1, 0});
    retroinfer::index::HeadIndex hi;
    hi.head_dim = d;
    hi.append(ci, 0);
    const int k = hi.num_clusters();
    ASSERT_GT(k, 10);
    std::vector<float> whole(group * k), scores(k), parts(group * k, std::nanf(""));
    retroinfer::index::score_clusters(hi, q.data(), group, 0.125f, whole.data(), scores.data());
    for (int p = 0; p < 3; ++p)
      retroinfer::index::cluster_logits_range(hi, q.data(), group, 0.125f, k * p / 3, k * (p + 1) / 3, parts.data());
    for (int i = 0; i < group * k; ++i) EXPECT_EQ(parts[i], whole[i]) << "d " << d << " i " << i;
    EXPECT_THROW(retroinfer::index::cluster_logits_range(hi, q.data(), group, 0.125f, 0, k + 1, parts.data()),
                 retroinfer::Error);
    EXPECT_THROW(retroinfer::index::cluster_logits_range(hi, q.data(), group, 0.125f, 5, 4, parts.data()),
                 retroinfer::Error);
  }
}
