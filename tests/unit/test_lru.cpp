// PageLru: capacity is never exceeded, eviction is least-recently-used first in whole clusters, a step's
// misses never evict that step's hits; checked on hand-made cases and against a naive reference model.
#include <gtest/gtest.h>

#include <algorithm>
#include <list>
#include <map>
#include <random>

#include "buffer/page_lru.h"
#include "retroinfer/error.h"

namespace retroinfer::buffer {
namespace {

TEST(PageLru, HandsOutPagesAndEvictsLeastRecentlyUsed) {
  const std::vector<int32_t> sizes(8, 8);  // one page each
  PageLru lru(sizes, 8, 3);
  for (int c = 0; c < 3; ++c) {
    auto a = lru.admit(c, c);
    ASSERT_TRUE(a.has_value());
    EXPECT_EQ(a->pages, std::vector<int32_t>{c});  // fresh cache: pages 0, 1, 2
    EXPECT_TRUE(a->evicted.empty());
  }
  EXPECT_EQ(lru.used_pages(), 3);
  EXPECT_TRUE(lru.touch(0, 3));  // 0 becomes most recent: order 1, 2, 0
  EXPECT_EQ(lru.lru_order(), (std::vector<int32_t>{1, 2, 0}));
  auto a = lru.admit(3, 4);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->evicted, std::vector<int32_t>{1});
  EXPECT_EQ(a->pages, std::vector<int32_t>{1});  // the victim's page
  EXPECT_FALSE(lru.resident(1));
  EXPECT_EQ(lru.lru_order(), (std::vector<int32_t>{2, 0, 3}));
  a = lru.admit(4, 5);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->evicted, std::vector<int32_t>{2});
  EXPECT_EQ(lru.used_pages(), 3);
  lru.check_invariants();
}

TEST(PageLru, MultiPageClustersEvictSeveralInOrder) {
  // Sizes 16 (2 pages), 9 (2 pages), 8 (1), 24 (3), 1 (1); capacity 5 pages.
  const std::vector<int32_t> sizes{16, 9, 8, 24, 1};
  PageLru lru(sizes, 8, 5);
  EXPECT_EQ(lru.pages_of(1), 2);
  EXPECT_EQ(lru.pages_of(4), 1);
  ASSERT_TRUE(lru.admit(0, 0));
  ASSERT_TRUE(lru.admit(1, 1));
  ASSERT_TRUE(lru.admit(2, 2));
  EXPECT_EQ(lru.used_pages(), 5);
  auto a = lru.admit(3, 3);  // needs 3: evicts 0 (2 pages) then 1 (2 pages) -> 4 free
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->evicted, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(a->pages.size(), 3u);
  EXPECT_EQ(lru.used_pages(), 4);
  EXPECT_EQ(lru.lru_order(), (std::vector<int32_t>{2, 3}));
  lru.check_invariants();
}

TEST(PageLru, NeverEvictsClustersUsedInTheSameStep) {
  const std::vector<int32_t> sizes(4, 8);
  PageLru lru(sizes, 8, 2);
  ASSERT_TRUE(lru.admit(0, 0));
  ASSERT_TRUE(lru.admit(1, 0));
  EXPECT_FALSE(lru.admit(2, 0).has_value());  // both residents used at step 0
  EXPECT_EQ(lru.lru_order(), (std::vector<int32_t>{0, 1}));
  EXPECT_TRUE(lru.touch(0, 1));
  auto a = lru.admit(2, 1);  // 1 was last used at step 0: may go; 0 may not
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->evicted, std::vector<int32_t>{1});
  lru.check_invariants();
}

TEST(PageLru, RefusesWhatCannotBeAdmitted) {
  const std::vector<int32_t> sizes{0, 40, 8};
  PageLru lru(sizes, 8, 4);
  EXPECT_FALSE(lru.admit(0, 0).has_value());  // empty cluster
  EXPECT_FALSE(lru.admit(1, 0).has_value());  // 5 pages > capacity 4
  ASSERT_TRUE(lru.admit(2, 0).has_value());
  EXPECT_FALSE(lru.admit(2, 1).has_value());  // already resident
  EXPECT_THROW(lru.admit(3, 0), Error);
  EXPECT_THROW(lru.admit(-1, 0), Error);
  EXPECT_FALSE(lru.touch(1, 1));
  lru.remove(2);
  EXPECT_EQ(lru.used_pages(), 0);
  EXPECT_FALSE(lru.resident(2));
  EXPECT_THROW(PageLru(sizes, 0, 4), Error);
  EXPECT_THROW(PageLru(sizes, 8, -1), Error);
  const std::vector<int32_t> bad{8, -1};
  EXPECT_THROW(PageLru(bad, 8, 4), Error);
}

TEST(PageLru, ZeroCapacityNeverAdmits) {
  const std::vector<int32_t> sizes{8, 8};
  PageLru lru(sizes, 8, 0);
  EXPECT_FALSE(lru.admit(0, 0).has_value());
  EXPECT_EQ(lru.used_pages(), 0);
}

// Naive reference: a list of (cluster, last step) in recency order and a page count.
struct RefLru {
  std::vector<int32_t> pages_of;
  int64_t capacity, used = 0;
  std::list<std::pair<int32_t, int64_t>> order;  // front = least recent
  bool resident(int32_t c) const {
    return std::any_of(order.begin(), order.end(), [&](auto& e) { return e.first == c; });
  }
  bool touch(int32_t c, int64_t s) {
    for (auto it = order.begin(); it != order.end(); ++it)
      if (it->first == c) {
        order.erase(it);
        order.emplace_back(c, s);
        return true;
      }
    return false;
  }
  std::optional<std::vector<int32_t>> admit(int32_t c, int64_t s) {
    const int64_t need = pages_of[c];
    if (resident(c) || need == 0 || need > capacity) return std::nullopt;
    int64_t avail = capacity - used;
    for (auto it = order.begin(); avail < need && it != order.end() && it->second < s; ++it) avail += pages_of[it->first];
    if (avail < need) return std::nullopt;
    std::vector<int32_t> ev;
    while (capacity - used < need) {
      ev.push_back(order.front().first);
      used -= pages_of[order.front().first];
      order.pop_front();
    }
    used += need;
    order.emplace_back(c, s);
    return ev;
  }
};

TEST(PageLru, MatchesReferenceModelOnRandomTraces) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937_64 rng(seed);
    const int C = 64;
    std::vector<int32_t> sizes(C);
    for (auto& s : sizes) s = std::uniform_int_distribution<int32_t>(0, 40)(rng);
    const int64_t cap = std::uniform_int_distribution<int64_t>(0, 40)(rng);
    PageLru lru(sizes, 8, cap);
    RefLru ref{{}, cap, 0, {}};
    for (int c = 0; c < C; ++c) ref.pages_of.push_back(lru.pages_of(c));
    for (int64_t step = 0; step < 200; ++step) {
      const int ops = std::uniform_int_distribution<int>(1, 6)(rng);
      for (int o = 0; o < ops; ++o) {
        const int32_t c = std::uniform_int_distribution<int32_t>(0, C - 1)(rng);
        if (rng() % 3 == 0) {
          ASSERT_EQ(lru.touch(c, step), ref.touch(c, step));
        } else {
          const auto a = lru.admit(c, step);
          const auto r = ref.admit(c, step);
          ASSERT_EQ(a.has_value(), r.has_value()) << "cluster " << c << " step " << step;
          if (a) {
            ASSERT_EQ(a->evicted, *r);
            ASSERT_EQ(int64_t(a->pages.size()), lru.pages_of(c));
          }
        }
        ASSERT_LE(lru.used_pages(), cap);
        ASSERT_EQ(lru.used_pages(), ref.used);
      }
      lru.check_invariants();
      std::vector<int32_t> ro;
      for (auto& e : ref.order) ro.push_back(e.first);
      ASSERT_EQ(lru.lru_order(), ro);
    }
  }
}

}  // namespace
}  // namespace retroinfer::buffer
