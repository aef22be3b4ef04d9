// Host-side pieces of the dense decode (src/backend/cuda/decode_dense.h), on the CPU (CUDA builds, no
// device needed): the RETROINFER_FULL_DECODE switch and the split count of the streaming kernels.
#if defined(RETROINFER_WITH_CUDA)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include "kernels/decode_dense.h"
#include "retroinfer/error.h"

namespace retroinfer::cuda::detail {
namespace {

TEST(CudaDenseSwitch, EnvironmentSwitch) {
  const char* old = std::getenv("RETROINFER_FULL_DECODE");
  const std::string saved = old ? old : "";
  unsetenv("RETROINFER_FULL_DECODE");
  EXPECT_EQ(dense_kernel(), kDefaultDenseKernel);
  setenv("RETROINFER_FULL_DECODE", "", 1);
  EXPECT_EQ(dense_kernel(), kDefaultDenseKernel);
  setenv("RETROINFER_FULL_DECODE", "bulk", 1);
  EXPECT_EQ(dense_kernel(), DenseKernel::kBulk);
  setenv("RETROINFER_FULL_DECODE", "v1", 1);
  EXPECT_EQ(dense_kernel(), DenseKernel::kV1);
  const std::pair<const char*, DenseKernel> kernels[] = {
      {"bulk", DenseKernel::kBulk}, {"v1", DenseKernel::kV1}, {"tma2d", DenseKernel::kTma2d}};
  for (const auto& [name, k] : kernels) {
    setenv("RETROINFER_FULL_DECODE", name, 1);
    EXPECT_EQ(dense_kernel(), k) << name;
    EXPECT_STREQ(dense_kernel_name(k), name);
  }
  // Unknown names throw, naming the valid ones; so do the variants removed after run 15 and wrong case.
  for (const char* bad : {"bulk16", "V1", "async", "bulkw", "bulk8", "bulk8w", "bulk12"}) {
    setenv("RETROINFER_FULL_DECODE", bad, 1);
    try {
      dense_kernel();
      ADD_FAILURE() << "RETROINFER_FULL_DECODE=" << bad << " did not throw";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(bad), std::string::npos) << what;
      for (const char* valid : {"tma2d", "bulk", "v1"}) EXPECT_NE(what.find(valid), std::string::npos) << what;
    }
  }
  if (old != nullptr) setenv("RETROINFER_FULL_DECODE", saved.c_str(), 1);
  else unsetenv("RETROINFER_FULL_DECODE");
}

// H200: 132 multiprocessors, 2 CTAs each. Llama-3-8B's 8 KV heads per sequence.
TEST(CudaDenseSwitch, StreamSplits) {
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
