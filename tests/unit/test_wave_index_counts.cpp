// The wave index's counting rules (include/retroinfer/wave_counts.h): zone counts with their 1e-9 slack,
// clusters per segment, the steady split, the baselines' budgets, outlier counts and the planners' bound.
#include <gtest/gtest.h>

#include <vector>

#include "index/kmeans.h"
#include "retroinfer/wave_counts.h"

namespace retroinfer {
namespace {

TEST(WaveIndexCounts, ZoneCountsOfThePaperDefaults) {
  const ZoneCounts z = zone_counts(8192, 0.018, 0.232, true);  // 128K tokens at 16 per cluster
  EXPECT_EQ(z.n_retrieval, 148);                               // ceil(147.456)
  EXPECT_EQ(z.n_estimation, 1901);                             // ceil(1900.544)
  const ZoneCounts d = zone_counts(8192, AttentionConfig{});
  EXPECT_EQ(d.n_retrieval, z.n_retrieval);
  EXPECT_EQ(d.n_estimation, z.n_estimation);
}

TEST(WaveIndexCounts, SlackKeepsExactProductsExact) {
  ZoneCounts z = zone_counts(10, 0.3, 0.7, true);  // ceil(0.3 * 10) == 3
  EXPECT_EQ(z.n_retrieval, 3);
  EXPECT_EQ(z.n_estimation, 7);
  // 0.07 * 100 is 7.000000000000001 and 0.14 * 100 is 14.000000000000002 in double: a bare ceil would give
  // 8 and 15.
  volatile double c = 100;  // computed at run time, as the layers do
  EXPECT_GT(0.07 * c, 7.0);
  EXPECT_GT(0.14 * c, 14.0);
  z = zone_counts(100, 0.07, 0.14, true);
  EXPECT_EQ(z.n_retrieval, 7);
  EXPECT_EQ(z.n_estimation, 14);
  EXPECT_EQ(zone_share(100, 0.07), 7);
  EXPECT_EQ(zone_share(10, 0.31), 4);  // a real fraction still rounds up
  EXPECT_EQ(zone_share(100, 0.071), 8);
}

TEST(WaveIndexCounts, ZoneCountsAtTheEdges) {
  ZoneCounts z = zone_counts(0, 0.5, 0.5, true);  // no cluster
  EXPECT_EQ(z.n_retrieval, 0);
  EXPECT_EQ(z.n_estimation, 0);
  z = zone_counts(-3, 0.5, 0.5, true);
  EXPECT_EQ(z.n_retrieval + z.n_estimation, 0);
  z = zone_counts(10, 0.0, 0.5, true);  // fraction 0: no retrieval, the estimation unchanged
  EXPECT_EQ(z.n_retrieval, 0);
  EXPECT_EQ(z.n_estimation, 5);
  z = zone_counts(10, 0.01, 0.0, true);  // a positive fraction retrieves at least one cluster
  EXPECT_EQ(z.n_retrieval, 1);
  EXPECT_EQ(z.n_estimation, 0);
  z = zone_counts(10, 0.3, 0.7, false);  // estimation off
  EXPECT_EQ(z.n_retrieval, 3);
  EXPECT_EQ(z.n_estimation, 0);
  z = zone_counts(5, 1.0, 0.5, true);  // budgets summing past C: estimation gets what retrieval left
  EXPECT_EQ(z.n_retrieval, 5);
  EXPECT_EQ(z.n_estimation, 0);
  z = zone_counts(10, 0.6, 0.6, true);
  EXPECT_EQ(z.n_retrieval, 6);
  EXPECT_EQ(z.n_estimation, 4);
  z = zone_counts(1, 0.018, 0.232, true);  // one cluster: retrieved, nothing left to estimate
  EXPECT_EQ(z.n_retrieval, 1);
  EXPECT_EQ(z.n_estimation, 0);
  EXPECT_EQ(zone_share(10, 1.0), 10);
  EXPECT_EQ(zone_share(10, 0.0), 0);
}

TEST(WaveIndexCounts, ClustersPerSegment) {
  EXPECT_EQ(segment_clusters(16, 16), 1);
  EXPECT_EQ(segment_clusters(17, 16), 2);
  EXPECT_EQ(segment_clusters(1, 16), 1);  // a short last segment still gets one cluster
  EXPECT_EQ(segment_count(0, 4), 0);
  EXPECT_EQ(segment_count(10, 4), 3);
  EXPECT_EQ(segment_length(10, 4, 0), 4);
  EXPECT_EQ(segment_length(10, 4, 2), 2);
  EXPECT_EQ(index_clusters(0, 16, 8192), 0);
  EXPECT_EQ(index_clusters(2 * 8192 + 8, 16, 8192), 2 * 512 + 1);
  // A segment length that tokens_per_cluster does not divide rounds up per segment: 2 + 2, not ceil(8 / 3).
  EXPECT_EQ(index_clusters(8, 3, 4), 4);
  AttentionConfig c;
  c.tokens_per_cluster = 3;
  c.segment_tokens = 4;
  EXPECT_EQ(index_clusters(8, c), 4);
}

TEST(WaveIndexCounts, ClusterCountIsTheKMeans) {
  std::vector<float> keys, values;
  for (int64_t n : {1, 5, 16, 17, 40, 67}) {
    for (auto [tpc, seg] : {std::pair{3, 4}, {4, 16}, {5, 12}, {16, 32}}) {
      keys.assign(size_t(n) * 2, 0.0f);
      for (int64_t i = 0; i < n; ++i) keys[size_t(i) * 2] = float(i % 7) - 3.0f, keys[size_t(i) * 2 + 1] = float(i % 3);
      values = keys;
      index::KMeansParams p{tpc, seg, 1, 0};
      const index::ClusterIndex ci = index::segmented_kmeans(keys.data(), values.data(), n, 2, p);
      EXPECT_EQ(ci.num_clusters, index_clusters(n, tpc, seg)) << "n " << n << " tpc " << tpc << " seg " << seg;
    }
  }
}

TEST(WaveIndexCounts, SteadySplitAndTheIndexedTokens) {
  AttentionConfig c;  // sink 4, window 64
  SteadySplit s = steady_split(100, c);
  EXPECT_EQ(s.sink_end, 4);
  EXPECT_EQ(s.recent_begin, 36);
  EXPECT_EQ(s.indexed(), 32);
  EXPECT_EQ(retro_indexed_tokens(s, 16), 32);
  EXPECT_EQ(retro_indexed_tokens(s, 32), 32);
  EXPECT_EQ(retro_indexed_tokens(s, 33), 0);  // less than one cluster's worth: nothing indexed
  s = steady_split(3, c);                     // shorter than the sinks
  EXPECT_EQ(s.sink_end, 3);
  EXPECT_EQ(s.recent_begin, 3);
  EXPECT_EQ(s.indexed(), 0);
  s = steady_split(50, c);  // sinks and window overlap
  EXPECT_EQ(s.sink_end, 4);
  EXPECT_EQ(s.recent_begin, 4);
  EXPECT_EQ(retro_indexed_tokens(s, 1), 0);
}

TEST(WaveIndexCounts, BaselineBudgetsMatchRetro) {
  AttentionConfig c;
  // 1000 tokens, sink 4, window 64: 932 indexable, round(0.018 * 932) = round(16.776) = 17.
  EXPECT_EQ(baseline_budget(c, steady_split(1000, c).indexed()), 17);
  c.budget_tokens = 5;
  EXPECT_EQ(baseline_budget(c, 932), 5);
  c.budget_tokens = 0;
  EXPECT_EQ(baseline_budget(c, 932), 0);
  EXPECT_EQ(baseline_budget(-1, 0.0, 932), 0);
  EXPECT_EQ(baseline_budget(-1, 1.0, 932), 932);
  EXPECT_EQ(quest_budget_pages(0, 16), 0);
  EXPECT_EQ(quest_budget_pages(1, 16), 1);  // less than a page still reads one
  EXPECT_EQ(quest_budget_pages(31, 16), 1);
  EXPECT_EQ(quest_budget_pages(32, 16), 2);
}

TEST(WaveIndexCounts, IndexUpdatesKeepTheTailShort) {
  AttentionConfig c;  // window 64, update_tokens 1024
  EXPECT_FALSE(index_update_due(64 + 1023, c));
  EXPECT_TRUE(index_update_due(64 + 1024, c));
  EXPECT_EQ(steady_tail_max(c), 64 + 1023);
  EXPECT_FALSE(index_update_due(steady_tail_max(c), c));
  EXPECT_TRUE(index_update_due(steady_tail_max(c) + 1, c));
  // Outlier rows: round(0.01 * 1000) = 10 of the build, then round(0.01 * 1024) = 10 for each of the
  // 5000 / 1024 = 4 updates appending can trigger, and one more.
  EXPECT_EQ(outlier_capacity(0.01, 1000, 5000, 1024), 10 + 5 * 10);
  EXPECT_EQ(outlier_capacity(0.0, 1000, 5000, 1024), 0);
}

TEST(WaveIndexCounts, OutliersAndTheRetrievalBound) {
  EXPECT_EQ(outlier_split_count(0.001, 131004), 131);
  EXPECT_EQ(outlier_split_count(0.0, 131004), 0);
  EXPECT_EQ(outlier_split_count(0.5, 3), 2);  // 1.5 rounds away from zero
  EXPECT_EQ(retrieval_rows_bound(0.05, 101), 11);  // ceil(2 * 0.05 * 101 = 10.1)
  EXPECT_EQ(retrieval_rows_bound(0.05, 101, 1.0), 6);
  EXPECT_EQ(retrieval_rows_bound(0.018, 0), 0);
}

}  // namespace
}  // namespace retroinfer
