// The wave buffer's host tables through index updates (buffer/index_update.h WaveIndexTables) and the
// steady zone's compaction map (steady_rows_after_update): what the CUDA layer uploads after each update.
// Checked against the definitions: CSR offsets are each head's prefix sums of its sizes; page slots are
// disjoint, ceil(size / page) per cluster, within slot_stride; store blocks are disjoint, within
// store_rows, the prompt's at h * per_head + offset, and an update never moves an earlier block.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "buffer/index_update.h"
#include "retroinfer/error.h"

namespace retroinfer::buffer {
namespace {

void check_tables(const WaveIndexTables& t) {
  const size_t H = size_t(t.heads), C = size_t(t.clusters);
  ASSERT_EQ(t.sizes.size(), H * C);
  ASSERT_EQ(t.offsets.size(), H * (C + 1));
  ASSERT_EQ(t.slot_begin.size(), H * (C + 1));
  ASSERT_EQ(t.store_at.size(), H * C);
  std::vector<std::pair<int64_t, int64_t>> blocks;  // [begin, end) store rows
  for (size_t h = 0; h < H; ++h) {
    EXPECT_EQ(t.offsets[h * (C + 1)], 0);
    EXPECT_EQ(t.slot_begin[h * (C + 1)], 0);
    for (size_t c = 0; c < C; ++c) {
      const int32_t s = t.sizes[h * C + c];
      EXPECT_EQ(t.offsets[h * (C + 1) + c + 1] - t.offsets[h * (C + 1) + c], s) << "head " << h << " cluster " << c;
      EXPECT_EQ(t.slot_begin[h * (C + 1) + c + 1] - t.slot_begin[h * (C + 1) + c], (s + t.page_tokens - 1) / t.page_tokens);
      if (s > 0) blocks.emplace_back(t.store_at[h * C + c], t.store_at[h * C + c] + s);
    }
    EXPECT_EQ(t.offsets[h * (C + 1) + C], t.per_head) << "head " << h;
    EXPECT_LE(t.slot_begin[h * (C + 1) + C], t.slot_stride);
  }
  std::sort(blocks.begin(), blocks.end());
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_GE(blocks[i].first, 0);
    EXPECT_LE(blocks[i].second, t.store_rows);
    if (i > 0) {
      EXPECT_LE(blocks[i - 1].second, blocks[i].first) << "store blocks overlap";
    }
  }
  // Every store row in use belongs to exactly one block (rows = H * per_head).
  int64_t used = 0;
  for (const auto& b : blocks) used += b.second - b.first;
  EXPECT_EQ(used, int64_t(H) * t.per_head);
  EXPECT_EQ(t.store_rows, int64_t(H) * t.per_head);
  const auto abs = t.offsets_abs();
  ASSERT_EQ(abs.size(), H * C + 1);
  for (size_t i = 0; i + 1 < abs.size(); ++i) EXPECT_LE(abs[i], abs[i + 1]);
  EXPECT_EQ(abs.back(), int64_t(H) * t.per_head);
}

TEST(WaveIndexTables, BuildLayoutIsHeadByHeadInClusterOrder) {
  const std::vector<int32_t> sizes{3, 5, 8, 0,  /**/ 4, 4, 4, 4};  // 2 heads x 4 clusters, 16 tokens each
  const auto t = WaveIndexTables::from_sizes(2, 4, 8, sizes);
  check_tables(t);
  EXPECT_EQ(t.per_head, 16);
  EXPECT_EQ(t.store_at, (std::vector<int64_t>{0, 3, 8, 16, 16, 20, 24, 28}));
  EXPECT_EQ(t.slot_begin, (std::vector<int32_t>{0, 1, 2, 3, 3, /**/ 0, 1, 2, 3, 4}));
  EXPECT_EQ(t.slot_stride, 4);
  EXPECT_EQ(t.offsets_abs(), (std::vector<int32_t>{0, 3, 8, 16, 16, 20, 24, 28, 32}));
  EXPECT_EQ(t.retrieval_capacity(1), 8);
  EXPECT_EQ(t.retrieval_capacity(2), 13);
  EXPECT_EQ(t.retrieval_capacity(9), 16);  // n_r beyond C: every cluster
}

TEST(WaveIndexTables, AppendKeepsEarlierBlocksAndFillsTheTail) {
  auto t = WaveIndexTables::from_sizes(2, 2, 4, std::vector<int32_t>{6, 2, /**/ 1, 7});
  const auto at0 = t.store_at;
  t.append_block(3, std::vector<int32_t>{1, 2, 9, /**/ 4, 4, 4});  // 12 tokens per head
  check_tables(t);
  EXPECT_EQ(t.clusters, 5);
  EXPECT_EQ(t.per_head, 20);
  // Earlier clusters keep their blocks; the new ones follow at the old end (16), head by head.
  EXPECT_EQ(t.store_at, (std::vector<int64_t>{at0[0], at0[1], 16, 17, 19, /**/ at0[2], at0[3], 28, 32, 36}));
  EXPECT_EQ(t.sizes, (std::vector<int32_t>{6, 2, 1, 2, 9, /**/ 1, 7, 4, 4, 4}));
  EXPECT_EQ(t.offsets, (std::vector<int32_t>{0, 6, 8, 9, 11, 20, /**/ 0, 1, 8, 12, 16, 20}));
  // Slots: head 0 had 2 + 1 = 3, + 1 + 1 + 3; head 1 had 1 + 2 = 3, + 1 + 1 + 1.
  EXPECT_EQ(t.slot_begin, (std::vector<int32_t>{0, 2, 3, 4, 5, 8, /**/ 0, 1, 3, 4, 5, 6}));
  EXPECT_EQ(t.slot_stride, 8);
  EXPECT_EQ(t.retrieval_capacity(2), 15);  // head 0: 9 + 6
}

TEST(WaveIndexTables, RandomGrowthKeepsInvariants) {
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937_64 rng(seed);
    const int H = 1 + int(rng() % 4), C = 1 + int(rng() % 20), pt = 1 + int(rng() % 9);
    // Equal tokens per head: a random split of T tokens into C sizes (zeros allowed).
    auto split = [&](int64_t T, int k) {
      std::vector<int32_t> s(size_t(k), 0);
      for (int64_t i = 0; i < T; ++i) ++s[rng() % size_t(k)];
      return s;
    };
    const int64_t T0 = 50 + int64_t(rng() % 200);
    std::vector<int32_t> sizes;
    for (int h = 0; h < H; ++h) {
      auto s = split(T0, C);
      sizes.insert(sizes.end(), s.begin(), s.end());
    }
    auto t = WaveIndexTables::from_sizes(H, C, pt, sizes);
    check_tables(t);
    for (int u = 0; u < 4; ++u) {
      const int Cu = 1 + int(rng() % 6);
      const int64_t T = 10 + int64_t(rng() % 60);
      std::vector<int32_t> blk;
      for (int h = 0; h < H; ++h) {
        auto s = split(T, Cu);
        blk.insert(blk.end(), s.begin(), s.end());
      }
      const auto before = t;
      t.append_block(Cu, blk);
      check_tables(t);
      EXPECT_EQ(t.clusters, before.clusters + Cu);
      EXPECT_EQ(t.per_head, before.per_head + T);
      for (int h = 0; h < H; ++h)
        for (int c = 0; c < before.clusters; ++c) {
          EXPECT_EQ(t.store_at[size_t(h) * t.clusters + c], before.store_at[size_t(h) * before.clusters + c]);
          EXPECT_EQ(t.slot_begin[size_t(h) * (t.clusters + 1) + c], before.slot_begin[size_t(h) * (before.clusters + 1) + c]);
        }
    }
  }
}

TEST(WaveIndexTables, RejectsUnequalHeadsAndChangesNothing) {
  auto t = WaveIndexTables::from_sizes(2, 1, 8, std::vector<int32_t>{5, 5});
  const auto before = t;
  EXPECT_THROW(t.append_block(2, std::vector<int32_t>{1, 2, /**/ 1, 1}), Error);  // 3 vs 2 tokens
  EXPECT_EQ(t.sizes, before.sizes);
  EXPECT_EQ(t.clusters, before.clusters);
  EXPECT_EQ(t.store_rows, before.store_rows);
  EXPECT_THROW(t.append_block(2, std::vector<int32_t>{1, 2, 3}), Error);   // wrong count
  EXPECT_THROW(t.append_block(1, std::vector<int32_t>{-1, -1}), Error);    // negative size
  EXPECT_THROW(WaveIndexTables::from_sizes(2, 2, 8, std::vector<int32_t>{1, 2, 3, 1}), Error);
  EXPECT_THROW(WaveIndexTables::from_sizes(0, 1, 8, std::vector<int32_t>{}), Error);
}

TEST(SteadyRowsAfterUpdate, DropsTheBlockKeepsItsOutliers) {
  // 2 heads; sinks 2, outliers 1, then tail rows 3 .. 12 (10 rows); the block = tail rows [0, 6) = rows 3 .. 8,
  // its outliers at block tokens {1, 4} (head 0) and {0, 5} (head 1).
  const auto map = steady_rows_after_update(2, 2, 1, 13, 6, 2, std::vector<int32_t>{1, 4, 0, 5});
  ASSERT_EQ(map.size(), size_t(2 * 9));
  EXPECT_EQ(std::vector<int32_t>(map.begin(), map.begin() + 9), (std::vector<int32_t>{0, 1, 2, 4, 7, 9, 10, 11, 12}));
  EXPECT_EQ(std::vector<int32_t>(map.begin() + 9, map.end()), (std::vector<int32_t>{0, 1, 2, 3, 8, 9, 10, 11, 12}));
  // No outliers in the block, nothing after it.
  EXPECT_EQ(steady_rows_after_update(1, 0, 0, 4, 4, 0, std::vector<int32_t>{}), std::vector<int32_t>{});
  EXPECT_EQ(steady_rows_after_update(1, 1, 0, 5, 3, 0, std::vector<int32_t>{}), (std::vector<int32_t>{0, 4}));
}

TEST(SteadyRowsAfterUpdate, RejectsBadArguments) {
  EXPECT_THROW(steady_rows_after_update(1, 2, 1, 8, 6, 0, std::vector<int32_t>{}), Error);      // rows < 2 + 1 + 6
  EXPECT_THROW(steady_rows_after_update(1, 0, 0, 8, 6, 1, std::vector<int32_t>{6}), Error);     // outlier outside
  EXPECT_THROW(steady_rows_after_update(1, 0, 0, 8, 6, 2, std::vector<int32_t>{3, 3}), Error);  // not ascending
  EXPECT_THROW(steady_rows_after_update(2, 0, 0, 8, 6, 1, std::vector<int32_t>{1}), Error);     // count
}

}  // namespace
}  // namespace retroinfer::buffer
