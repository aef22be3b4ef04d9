// Issue #4's value-sum prefetch during the selection (RETROINFER_SELECT_PREFETCH, select_bins.cu
// prefetch_estimation_rows): extra CTAs of the bins selection put the likely estimation clusters' value-sum
// rows into L2 (prefetch.global.L2 only, no stores outside their shared memory), so a decode with the
// prefetch on must be bit-identical to one with it off: per flat head the logits, scores, retrieval and
// estimation ids and token list, and every output element, under on (2 CTAs per head), 1 and 16 CTAs per
// head; two graph replays captured with it on, and an eager decode after them, bit-identical too. Shapes:
// batch 1/4, head_dim 64/128, groups 1/4/8, a 128K x 8-head case (Llama-3-8B, batch 1 and 4: issue #4's),
// no estimation zone (n_e = 0: no prefetch CTA), all steady (no clusters). The switch itself: off / empty /
// unset = 0, on = 2, numbers 0..16, anything else throws retroinfer::Error (also from
// RetroLayer::decode_bytes_moved, which adds the prefetch's bound when on). One "[select prefetch]" line per
// case.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "backend/cuda/kernels.h"
#include "decode_path_test_util.h"
#include "gpu_test_util.h"
#include "retroinfer/error.h"

namespace retroinfer {
namespace {

using gputest::decode_once;
using gputest::EnvGuard;
using gputest::PathCase;
using gputest::PathResult;

constexpr const char* kEnv = "RETROINFER_SELECT_PREFETCH";

void prefetch_case(const PathCase& rc, uint64_t seed) {
  SCOPED_TRACE(gputest::describe(rc, seed));
  gputest::PathLayer t = gputest::make_path_layer(rc, seed);
  cuda::RetroLayer& layer = *t.layer;

  EnvGuard env(kEnv, "off");
  const PathResult off = decode_once(t);
  const double req = layer.decode_bytes_required(), moved_off = layer.decode_bytes_moved();
  env.set("on");
  const PathResult on = decode_once(t);
  gputest::expect_identical(on, off, "prefetch on vs off");
  const double moved_on = layer.decode_bytes_moved();
  if (layer.n_estimation() > 0 && layer.num_clusters() > 0) {
    EXPECT_GT(moved_on, moved_off);  // the prefetch's bound is counted
  } else {
    EXPECT_EQ(moved_on, moved_off);
  }
  const auto cmp = gputest::compare(on.out, off.out);
  EXPECT_EQ(cmp.unwritten, 0);
  env.set("1");
  gputest::expect_identical(decode_once(t), off, "1 prefetch CTA per head vs off");
  env.set("16");
  gputest::expect_identical(decode_once(t), off, "16 prefetch CTAs per head vs off");
  env.set("on");
  // Graph replays captured with the prefetch on (the switch is read at capture) and an eager decode after.
  const PathResult e = gputest::expect_graph_replays(t, off.out);
  gputest::expect_identical(e, off, "eager after replays (on)");
  env.set("bogus");
  if (layer.num_clusters() > 0) {  // all steady: the dense bytes, no switch read
    EXPECT_THROW(layer.decode_bytes_moved(), Error);
  }
  std::printf("[select prefetch] H=%d G=%d d=%d n=%lld C=%d n_r=%d n_e=%d: logits, scores, ids, lists and outputs "
              "with prefetch on / 1 / 16 CTAs vs off identical%s; graph replays identical; moved/required "
              "off %.3f on %.3f\n",
              t.H, rc.group, rc.d, (long long)rc.n, layer.num_clusters(), layer.n_retrieval(), layer.n_estimation(),
              ::testing::Test::HasFailure() ? " NOT (see failures)" : "", moved_off / req, moved_on / req);
}

TEST(CudaSelectPrefetch, Switch) {
  // The parse needs no device.
  EnvGuard env(kEnv, nullptr);
  EXPECT_EQ(cuda::detail::select_prefetch_ctas(), 0);
  env.set("");
  EXPECT_EQ(cuda::detail::select_prefetch_ctas(), 0);
  env.set("off");
  EXPECT_EQ(cuda::detail::select_prefetch_ctas(), 0);
  env.set("on");
  EXPECT_EQ(cuda::detail::select_prefetch_ctas(), 2);
  env.set("0");
  EXPECT_EQ(cuda::detail::select_prefetch_ctas(), 0);
  env.set("3");
  EXPECT_EQ(cuda::detail::select_prefetch_ctas(), 3);
  env.set("16");
  EXPECT_EQ(cuda::detail::select_prefetch_ctas(), 16);
  for (const char* bad : {"17", "-1", "+2", "2x", "ON", "yes", " 2", "100"}) {
    env.set(bad);
    EXPECT_THROW(cuda::detail::select_prefetch_ctas(), Error) << "value '" << bad << "'";
  }
  env.set("maybe");
  try {
    cuda::detail::select_prefetch_ctas();
    ADD_FAILURE() << "no throw";
  } catch (const Error& err) {
    const std::string what = err.what();
    EXPECT_NE(what.find("RETROINFER_SELECT_PREFETCH"), std::string::npos) << what;
    EXPECT_NE(what.find("off"), std::string::npos) << what;
    EXPECT_NE(what.find("on"), std::string::npos) << what;
  }
  std::printf("[select prefetch] switch: unset/empty/off/0 -> 0, on -> 2, 3 / 16 -> 3 / 16, bad values throw\n");
}

TEST(CudaSelectPrefetch, MatchesOff) {
  RETROINFER_REQUIRE_GPU();
  prefetch_case({1, 2, 4, 128, 5000, true, false, true}, 901);   // batch 1, G 4, d 128
  prefetch_case({4, 1, 1, 128, 3001, true, false, true}, 902);   // batch 4, G 1
  prefetch_case({1, 2, 8, 64, 9000, true, false, true}, 903);    // G 8, d 64
  prefetch_case({4, 2, 4, 64, 20011, true, false, false}, 904);  // batch 4, d 64, ~1250 clusters
  prefetch_case({1, 4, 1, 128, 2500, false, false, true}, 905);  // no estimation (n_e = 0): no prefetch CTA
  prefetch_case({1, 2, 4, 128, 30, true, false, true}, 906);     // all steady (no clusters)
}

// Llama-3-8B at 128K: issue #4's shape (batch 4) and batch 1.
TEST(CudaSelectPrefetch, MatchesOffBenchShapes) {
  RETROINFER_REQUIRE_GPU();
  prefetch_case({1, 8, 4, 128, 131072, true, false, false}, 911);
  prefetch_case({4, 8, 4, 128, 131072, true, false, false}, 912);
}

}  // namespace
}  // namespace retroinfer
