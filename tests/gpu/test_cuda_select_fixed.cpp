// The bins selection with the score grid's fixed-bin histogram (run 21: SelectParams::fixed_bins, built by the
// cooperative score grid's formation; RETROINFER_SELECT_FIXED_BINS) against the kernel's own range-adapted
// histogram, on the same inputs in one process:
// - the selection kernels' shared table (select_test_util.h kSelectCases) with the histogram of each head's
//   finite scores over the fixed bins in the grid workspace: ids, token lists, counts and scan scratch
//   bit-identical to the kernel without it (every output buffer poisoned first and compared whole), the ids equal
//   to the CPU rule, and the workspace zero afterwards. Cases with negative scores or signed zeros take the
//   kernel's own histogram (the fixed bins hold scores >= +0 only), still zeroing the workspace;
// - RetroLayer decodes (small shapes with outliers or without estimation, 128K batch 4) under =1 bit-identical to
//   =0 (logits, scores, ids, token lists, outputs), graph replays and the stage path too, and repeated decodes
//   (a histogram left behind would change the next decode's thresholds);
// - the switch's parse.
// One "[select fixed]" line per case.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "decode_path_test_util.h"
#include "gpu_test_util.h"
#include "retroinfer/error.h"
#include "select_test_util.h"

namespace retroinfer {
namespace {

using cuda::detail::kSelectGridWsWords;

// Head h's histogram of its finite scores over the fixed bins: (bits without the sign) >> 19.
std::vector<uint32_t> fixed_hist_ws(const gputest::SelectInputs& in) {
  std::vector<uint32_t> ws(size_t(in.H) * kSelectGridWsWords, 0u);
  for (int h = 0; h < in.H; ++h)
    for (int i = 0; i < in.N; ++i) {
      const float s = in.scores[size_t(h) * in.N + i];
      if (s == -INFINITY) continue;
      uint32_t b;
      std::memcpy(&b, &s, 4);
      ++ws[size_t(h) * kSelectGridWsWords + ((b & 0x7fffffffu) >> cuda::detail::kSelectFixedShift)];
    }
  return ws;
}

bool all_nonnegative(const gputest::SelectInputs& in) {
  for (float s : in.scores)
    if (s != -INFINITY && !(s >= 0.0f && !std::signbit(s))) return false;
  return true;
}

void run_case(const gputest::SelectCase& c, uint64_t seed) {
  SCOPED_TRACE(gputest::describe(c, seed));
  gputest::EnvGuard compact("RETROINFER_SELECT_COMPACT", nullptr);
  gputest::EnvGuard split("RETROINFER_SELECT_SPLIT", nullptr);
  gputest::SelectInputs in = gputest::make_select_inputs(c, seed);
  const gputest::SelectOutputs a = gputest::run_select(in, "own histogram", false);
  cuda::DeviceBuffer ws = gputest::upload(fixed_hist_ws(in));
  in.p.grid_ws = ws.as<unsigned>();
  in.p.fixed_bins = true;
  const gputest::SelectOutputs b = gputest::run_select(in, "fixed bins", c.phases);
  const bool same = gputest::expect_same_outputs(a, b, "", "own", "fixed");
  std::vector<uint32_t> after(size_t(in.H) * kSelectGridWsWords, 1u);
  ws.download(after.data(), after.size() * 4);
  size_t nonzero = 0;
  for (uint32_t x : after) nonzero += x != 0u;
  EXPECT_EQ(nonzero, 0u) << "the workspace is not zero after the launch";
  for (int h = 0; h < in.H && !::testing::Test::HasFailure(); ++h) {
    SCOPED_TRACE(testing::Message() << "head " << h);
    (void)gputest::expect_cpu_rule_ids(in, b, h);
  }
  std::printf("[select fixed] %s H=%d N=%d k_r=%d k_e=%d levels=%d empty=%.2f P=%d: %s; ids, lists, counts, scratch vs "
              "own histogram %s; workspace zero after %s; CPU rule %s\n",
              c.name, in.H, in.N, c.k_r, c.k_e, c.levels, c.empty, c.page_tokens,
              all_nonnegative(in) ? "fixed bins" : "negative scores: own histogram", same ? "identical" : "DIFFER",
              nonzero == 0 ? "yes" : "NO", ::testing::Test::HasFailure() ? "FAILED (see above)" : "ok");
}

TEST(CudaSelectFixed, MatchesOwnHistogramAndCpuRule) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 21700;
  for (const auto& c : gputest::kSelectCases) run_case(c, ++seed);
}

void layer_case(const gputest::PathCase& pc, uint64_t seed) {
  SCOPED_TRACE(gputest::describe(pc, seed));
  gputest::PathLayer t = gputest::make_path_layer(pc, seed);
  gputest::EnvGuard compact("RETROINFER_SELECT_COMPACT", nullptr);
  gputest::EnvGuard split("RETROINFER_SELECT_SPLIT", nullptr);
  const int n_phase = gputest::expect_switch_decodes_identical(t, "RETROINFER_SELECT_FIXED_BINS", {"0", "own"},
                                                               {{"1", "fixed"}, {"", "fixed (unset)"}})
                          .n_phase;
  std::printf("[select fixed] layer H=%d G=%d d=%d n=%lld C=%d n_r=%d n_e=%d est=%d outliers=%d: ids, lists and "
              "outputs fixed vs own %s (default path and run8); graph replays and stage path (%d phase entries) "
              "identical\n",
              t.H, pc.group, pc.d, (long long)pc.n, t.layer->num_clusters(), t.layer->n_retrieval(),
              t.layer->n_estimation(), int(pc.estimation), int(pc.outliers),
              ::testing::Test::HasFailure() ? "NOT identical (see failures)" : "identical", n_phase);
}

TEST(CudaSelectFixed, RetroLayerDecodesIdentical) {
  RETROINFER_REQUIRE_GPU();
  layer_case({1, 2, 4, 128, 5000, true, false, true}, 2171);     // small, host K/V
  layer_case({2, 1, 3, 64, 4000, true, true, true}, 2172);       // outliers
  layer_case({1, 4, 1, 128, 2500, false, false, true}, 2173);    // no estimation
  layer_case({4, 8, 4, 128, 131072, true, false, false}, 2174);  // 128K, batch 4 (issue #4's shape)
}

TEST(CudaSelectFixed, SwitchParse) {
  gputest::EnvGuard env("RETROINFER_SELECT_FIXED_BINS", nullptr);
  EXPECT_TRUE(cuda::detail::select_fixed_bins_on());
  for (const char* on : {"", "1"}) {
    env.set(on);
    EXPECT_TRUE(cuda::detail::select_fixed_bins_on()) << "'" << on << "'";
  }
  env.set("0");
  EXPECT_FALSE(cuda::detail::select_fixed_bins_on());
  for (const char* bad : {"2", "on", "yes", " 1"}) {
    env.set(bad);
    try {
      (void)cuda::detail::select_fixed_bins_on();
      ADD_FAILURE() << "RETROINFER_SELECT_FIXED_BINS='" << bad << "' did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos) << e.what();
    }
  }
  std::printf("[select fixed] RETROINFER_SELECT_FIXED_BINS parse (unset/''/1 on, 0 off, 2|on|yes|' 1' throw) %s\n",
              ::testing::Test::HasFailure() ? "FAILED" : "ok");
}

}  // namespace
}  // namespace retroinfer
