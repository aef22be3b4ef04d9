// The split count of the dense decode's streaming kernels (kernels/decode_dense.h dense_stream_splits), on the
// CPU (CUDA builds, no device needed).
#if defined(RETROINFER_WITH_CUDA)
#include <gtest/gtest.h>

#include <algorithm>

#include "kernels/decode_dense.h"

namespace retroinfer::cuda::detail {
namespace {

// H200: 132 multiprocessors, 2 CTAs each. Llama-3-8B's 8 KV heads per sequence.
TEST(CudaDenseSplits, OneWaveAtMostOnePerTile) {
  EXPECT_EQ(dense_stream_splits(131072, 8, 132), 33);    // batch 1: 264 CTAs
  EXPECT_EQ(dense_stream_splits(131072, 32, 132), 8);    // batch 4: 256
  EXPECT_EQ(dense_stream_splits(131072, 128, 132), 2);   // batch 16: 256
  EXPECT_EQ(dense_stream_splits(131072, 24, 132), 11);   // batch 3: 264
  EXPECT_EQ(dense_stream_splits(131072, 512, 132), 1);   // more heads than CTA slots: one split each
  EXPECT_EQ(dense_stream_splits(1, 8, 132), 1);          // at most one split per 64-token tile
  EXPECT_EQ(dense_stream_splits(64, 8, 132), 1);
  EXPECT_EQ(dense_stream_splits(65, 8, 132), 2);
  EXPECT_EQ(dense_stream_splits(4097, 2, 132), 65);
  EXPECT_EQ(dense_stream_splits(0, 0, 132), 1);          // degenerate input still gives one split
  EXPECT_EQ(dense_stream_splits(131072, 8, 132, 1), 16);  // one CTA per multiprocessor fits: 128 CTAs
  EXPECT_EQ(dense_stream_splits(131072, 8, 132, 0), 16);  // a failed occupancy (0) counts as 1
  for (int64_t n : {1, 2, 63, 64, 65, 1000, 4097, 32785, 131072})
    for (int h : {1, 2, 8, 24, 128}) {
      const int s = dense_stream_splits(n, h, 132);
      EXPECT_GE(s, 1);
      EXPECT_LE(s, n);  // every split has a token (the kernels' launcher requires it)
      EXPECT_LE(int64_t{s} * h, std::max<int64_t>(264, h));
    }
}

}  // namespace
}  // namespace retroinfer::cuda::detail
#endif
