// default_tokens_per_cluster (include/retroinfer/attention.h): the paper's 16 from head_dim 128 on, 2 below
// (docs/accuracy.md, "Why retro misses needles"); the result is a valid AttentionConfig cluster size.
#include <gtest/gtest.h>

#include "retroinfer/attention.h"
#include "retroinfer/error.h"

namespace {

TEST(ClusterDefault, ByHeadDim) {
  EXPECT_EQ(retroinfer::default_tokens_per_cluster(64), 2);
  EXPECT_EQ(retroinfer::default_tokens_per_cluster(127), 2);
  EXPECT_EQ(retroinfer::default_tokens_per_cluster(128), 16);
  EXPECT_EQ(retroinfer::default_tokens_per_cluster(256), 16);
  EXPECT_EQ(retroinfer::default_tokens_per_cluster(1), 2);
  for (int d : {1, 64, 128}) {
    retroinfer::AttentionConfig c;
    c.tokens_per_cluster = retroinfer::default_tokens_per_cluster(d);
    EXPECT_NO_THROW(retroinfer::validate(c)) << "head_dim " << d;
  }
  EXPECT_THROW(retroinfer::default_tokens_per_cluster(0), retroinfer::Error);
  EXPECT_THROW(retroinfer::default_tokens_per_cluster(-64), retroinfer::Error);
}

}  // namespace
