// Index updates during decode, CPU side: PageLru growth (add_clusters keeps residency, pages and LRU
// order, new clusters behave like any other) and IndexUpdatePlan (every token in exactly one zone at every
// step, one layer per step, the steady zone within its computed capacity).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "buffer/index_update.h"
#include "buffer/page_lru.h"
#include "retroinfer/error.h"

namespace retroinfer::buffer {
namespace {

TEST(PageLruGrowth, AddedClustersKeepStateAndAreAdmittable) {
  const std::vector<int32_t> sizes{8, 16, 5, 8};  // pages 1, 2, 1, 1
  PageLru lru(sizes, 8, 4);
  ASSERT_TRUE(lru.admit(0, 0));
  ASSERT_TRUE(lru.admit(1, 1));
  ASSERT_TRUE(lru.touch(0, 2));
  const auto pages0 = std::vector<int32_t>(lru.pages(0).begin(), lru.pages(0).end());
  const auto pages1 = std::vector<int32_t>(lru.pages(1).begin(), lru.pages(1).end());
  const std::vector<int32_t> extra{17, 0, 8};  // pages 3, 0, 1
  EXPECT_EQ(lru.add_clusters(extra), 4);
  EXPECT_EQ(lru.num_clusters(), 7);
  EXPECT_EQ(lru.size(4), 17);
  EXPECT_EQ(lru.pages_of(4), 3);
  EXPECT_FALSE(lru.resident(4));
  EXPECT_EQ(std::vector<int32_t>(lru.pages(0).begin(), lru.pages(0).end()), pages0);
  EXPECT_EQ(std::vector<int32_t>(lru.pages(1).begin(), lru.pages(1).end()), pages1);
  EXPECT_EQ(lru.lru_order(), (std::vector<int32_t>{1, 0}));
  lru.check_invariants();
  // New cluster 6 (1 page) fits in the free page; new cluster 4 (3 pages) evicts 1 (LRU, 2 pages) and 0.
  auto a = lru.admit(6, 3);
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(a->evicted.empty());
  a = lru.admit(4, 4);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->evicted, (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(lru.lru_order(), (std::vector<int32_t>{6, 4}));
  EXPECT_FALSE(lru.admit(5, 5).has_value());  // empty cluster: never resident
  lru.check_invariants();
  EXPECT_THROW(lru.add_clusters(std::vector<int32_t>{3, -1}), Error);
  EXPECT_EQ(lru.num_clusters(), 7);  // a refused call changes nothing
}

// Random trace with growth every few steps: invariants after every operation, capacity never exceeded.
TEST(PageLruGrowth, RandomTraceWithGrowthKeepsInvariants) {
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937_64 rng(seed);
    std::vector<int32_t> sizes(20);
    for (auto& s : sizes) s = int32_t(rng() % 30);
    PageLru lru(sizes, 8, 10);
    for (int64_t step = 0; step < 300; ++step) {
      if (step % 25 == 24) {
        std::vector<int32_t> extra(4);
        for (auto& s : extra) s = int32_t(rng() % 30);
        const int before = lru.num_clusters();
        ASSERT_EQ(lru.add_clusters(extra), before);
      }
      const int32_t c = int32_t(rng() % uint64_t(lru.num_clusters()));
      if (!lru.touch(c, step)) lru.admit(c, step);
      lru.check_invariants();
      ASSERT_LE(lru.used_pages(), 10);
    }
    EXPECT_EQ(lru.num_clusters(), 20 + 4 * 12);
  }
}

// Walks decode token by token for several layers: zones partition the tokens, blocks are due exactly once
// per layer after all their tokens left the window, at most one layer updates per step, and the steady
// zone never exceeds max_steady_rows() (which is reached).
TEST(IndexUpdatePlan, ZonesPartitionTokensAndLayersAreStaggered) {
  struct Case {
    int64_t prompt;
    int sinks, window, interval, layers;
  };
  for (const Case k : {Case{5000, 4, 64, 1024, 32}, Case{100, 4, 64, 256, 3}, Case{2, 4, 8, 16, 1},
                       Case{300, 0, 0, 32, 5}}) {
    SCOPED_TRACE(testing::Message() << "prompt " << k.prompt << " sinks " << k.sinks << " window " << k.window
                                    << " interval " << k.interval << " layers " << k.layers);
    const IndexUpdatePlan plan(k.prompt, k.sinks, k.window, k.interval, k.layers);
    std::vector<int64_t> end(size_t(k.layers));
    for (int l = 0; l < k.layers; ++l) {
      end[size_t(l)] = plan.index_end(l, k.prompt);
      EXPECT_EQ(end[size_t(l)], plan.index_end0());
    }
    int64_t max_rows = 0;
    const int64_t last = k.prompt + 4 * (k.interval + k.layers) + k.window;
    for (int64_t total = k.prompt + 1; total <= last; ++total) {
      int updating = 0;
      for (int l = 0; l < k.layers; ++l) {
        const int64_t due = plan.update_due(l, total);
        const int64_t e = plan.index_end(l, total);
        if (due >= 0) {
          ++updating;
          ASSERT_EQ(due, end[size_t(l)]) << "blocks are folded in order, each once";
          ASSERT_EQ(e, due + k.interval);
          ASSERT_LE(e + k.window, total) << "the block left the recent window";
        } else {
          ASSERT_EQ(e, end[size_t(l)]) << "the index grows only at a due update";
        }
        end[size_t(l)] = e;
        // Sinks [0, min(total, sinks)), indexed [sinks, e), steady tail [e, total): a partition.
        const int64_t sinks = std::min<int64_t>(total, k.sinks);
        ASSERT_GE(e, k.sinks);
        const int64_t indexed = std::max<int64_t>(0, std::min(e, total) - k.sinks);
        ASSERT_EQ(sinks + indexed + std::max<int64_t>(0, total - e), total);
        ASSERT_GE(total - e, std::min<int64_t>(k.window, total - k.sinks)) << "the window stays steady";
        const int64_t rows = plan.steady_rows(l, total);
        ASSERT_LE(rows, plan.max_steady_rows());
        max_rows = std::max(max_rows, rows);
      }
      ASSERT_LE(updating, 1) << "one layer per step at total " << total;
    }
    EXPECT_EQ(max_rows, plan.max_steady_rows());
    EXPECT_GT(end[size_t(k.layers - 1)], plan.index_end0()) << "updates happened";
  }
}

TEST(IndexUpdatePlan, RejectsBadArguments) {
  EXPECT_THROW(IndexUpdatePlan(100, 4, 64, 0, 32), Error);
  EXPECT_THROW(IndexUpdatePlan(100, 4, 64, 1024, 0), Error);
  EXPECT_THROW(IndexUpdatePlan(-1, 4, 64, 1024, 1), Error);
  const IndexUpdatePlan plan(100, 4, 64, 1024, 2);
  EXPECT_THROW(plan.index_end(2, 200), Error);
}

}  // namespace
}  // namespace retroinfer::buffer
