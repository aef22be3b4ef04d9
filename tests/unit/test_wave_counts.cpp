// The wave buffer's counters add field by field (WaveBufferStats, WaveStepCounts: summed over host-tier layers
// by the runner; CacheManagerStats: a manager's counts carried over a protocol rebuild; WaveStageTimes: the
// stage times bench decode --stage-times reports by name).
#include <gtest/gtest.h>

#include "buffer/cache_manager.h"
#include "retroinfer/wave_buffer.h"

namespace retroinfer {
namespace {

TEST(WaveCounts, StageTimesAddAndNameEveryStage) {
  WaveStageTimes a, b;
  double x = 1.0;
  for (const auto& [name, field] : WaveStageTimes::kStages) a.*field = x++;  // 1 .. 8
  for (const auto& [name, field] : WaveStageTimes::kStages) b.*field = 10.0 * (x++);  // 90 .. 160
  a.steps = 2;
  b.steps = 3;
  a += b;
  EXPECT_EQ(a.steps, 5);
  const auto named = a.named();
  const std::vector<std::string> order = {"apply",  "select",    "apply_wait", "lookup",
                                          "gather", "attention", "ring_wait",  "step"};
  ASSERT_EQ(named.size(), order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    EXPECT_EQ(named[i].first, order[i]);
    EXPECT_DOUBLE_EQ(named[i].second, double(i + 1) + 10.0 * double(i + 9));
  }
  EXPECT_DOUBLE_EQ(a.apply, 1.0 + 90.0);
  EXPECT_DOUBLE_EQ(a.step, 8.0 + 160.0);
}

TEST(WaveCounts, StatsAddFieldByField) {
  WaveBufferStats a{1, 2, 3, 4, 5, 6, 7, 8}, b{10, 20, 30, 40, 50, 60, 70, 80};
  a += b;
  EXPECT_EQ(a.steps_seen, 11u);
  EXPECT_EQ(a.steps_lost, 22u);
  EXPECT_EQ(a.hits, 33u);
  EXPECT_EQ(a.misses, 44u);
  EXPECT_EQ(a.updates, 55u);
  EXPECT_EQ(a.updates_dropped, 66u);
  EXPECT_EQ(a.admitted, 77u);
  EXPECT_EQ(a.evicted, 88u);

  WaveStepCounts s{1, 2, 3, 4, 5};
  s += WaveStepCounts{10, 20, 30, 40, 50};
  EXPECT_EQ(s.hit_clusters, 11);
  EXPECT_EQ(s.miss_clusters, 22);
  EXPECT_EQ(s.hit_rows, 33);
  EXPECT_EQ(s.miss_rows, 44);
  EXPECT_EQ(s.steady_rows, 55);

  buffer::CacheManagerStats m{1, 2, 3, 4, 5, 6, 7, 8};
  m += buffer::CacheManagerStats{1, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_EQ(m.steps_seen + m.steps_lost + m.hits + m.misses + m.updates + m.updates_dropped + m.admitted + m.evicted,
            36u + 8u);
  EXPECT_EQ(m.evicted, 9u);
}

}  // namespace
}  // namespace retroinfer
