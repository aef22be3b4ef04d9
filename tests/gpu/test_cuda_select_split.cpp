// The bins selection kernel with two CTAs per head (select_bins.cu, RETROINFER_SELECT_SPLIT: the retrieval
// CTA compacts and expands the retrieval list, the estimation CTA compacts the estimation list) against the
// default one CTA per head, on the same inputs in one process: retrieval and estimation ids, token lists,
// token counts and the scan scratch bit-identical (every output buffer is poisoned first and compared
// whole, so an entry one variant leaves unwritten fails too), the ids equal to the CPU rule "sort by
// (score desc, id asc), cut at k_r and k_r + k_e", and with stamps on, every head's selection phases stamped
// (by its retrieval CTA). Modes: 0 (the default), 1 (split when all 2 H CTAs fit at once, else one CTA per
// head) and force (split always: grids of more than one wave at 128 heads). Inputs: the selection kernels'
// shared table (select_test_util.h kSelectCases, also test_cuda_select_compact.cpp's and
// test_cuda_select_grid.cpp's) and two more cases: ready scores of 1 .. 40960 items, k_r / k_e including 0 and beyond the
// finite items, all -inf items, exact ties taken partially (few levels, signed zeros, the band that sends
// the threshold bin to the radix passes), CSR clusters and pages, steady zones, more than kBinExp retrieval
// items, with and without run 8's PDL launch and prefetches. Then RetroLayer decodes at 128K batch 4 (issue
// #4's shape) and small shapes (outliers, no estimation) under the switch: logits, scores, ids, token
// lists and outputs bit-identical, graph replays and the stage path too. The parse of the switch: unknown
// values throw retroinfer::Error; with RETROINFER_SELECT_COMPACT=v1 the kernel stays one CTA per head.
// One "[select split]" line per case.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "decode_path_test_util.h"
#include "gpu_test_util.h"
#include "retroinfer/error.h"
#include "select_test_util.h"

namespace retroinfer {
namespace {

constexpr char kVar[] = "RETROINFER_SELECT_SPLIT";

// One launch under RETROINFER_SELECT_SPLIT=mode (the default compaction, ballot), with fresh phase stamps
// when `phases`; per_head: the CTAs per head select_bins_ctas_per_head reports for the launch's parameters.
gputest::SelectOutputs run_mode(const gputest::SelectInputs& in, const char* mode, bool phases) {
  gputest::EnvGuard env(kVar, mode);
  gputest::EnvGuard compact("RETROINFER_SELECT_COMPACT", nullptr);  // the default (ballot)
  return gputest::run_select(in, mode, phases, [&](const cuda::detail::SelectParams& p, gputest::SelectOutputs& o) {
    EXPECT_EQ(cuda::detail::select_bins_ctas_per_head(p, &o.per_head), cudaSuccess) << mode;
  });
}

// Whether every head has all its selection phase stamps (slots 2 .. 2 + 2 kSelPhases; 0xff.. = unwritten).
bool all_phases_stamped(const std::vector<uint64_t>& phase, int H) {
  using cuda::detail::kPhaseSlots;
  using cuda::detail::kSelPhases;
  for (int h = 0; h < H; ++h)
    for (int j = 2; j < 2 + 2 * kSelPhases; ++j)
      if (phase[size_t(h) * kPhaseSlots + j] == ~uint64_t{0}) return false;
  return true;
}

void run_split_case(const gputest::SelectCase& c, uint64_t seed) {
  SCOPED_TRACE(gputest::describe(c, seed));
  const gputest::SelectInputs in = gputest::make_select_inputs(c, seed);
  const gputest::SelectOutputs a = run_mode(in, "0", c.phases);
  EXPECT_EQ(a.per_head, 1);
  const char* modes[2] = {"1", "force"};
  gputest::SelectOutputs b[2];
  bool same = true;
  for (int m = 0; m < 2; ++m) {
    b[m] = run_mode(in, modes[m], c.phases);
    if (m == 1) {
      EXPECT_EQ(b[m].per_head, c.k_e > 0 ? 2 : 1) << "force";
    }
    if (!gputest::expect_same_outputs(a, b[m], std::string("mode ") + modes[m] + ": ", "default", "split")) {
      same = false;
    }
    if (c.phases) {
      EXPECT_TRUE(all_phases_stamped(b[m].phase, in.H)) << "mode " << modes[m];
    }
  }
  if (c.phases) {
    EXPECT_TRUE(all_phases_stamped(a.phase, in.H)) << "default";
  }
  // The CPU rule on the forced split's ids (the default's are the same when `same`).
  const int H = in.H, N = in.N;
  for (int h = 0; h < H && !::testing::Test::HasFailure(); ++h) {
    SCOPED_TRACE(testing::Message() << "head " << h);
    (void)gputest::expect_cpu_rule_ids(in, b[1], h);
  }
  std::printf("[select split] %s H=%d N=%d k_r=%d k_e=%d levels=%d empty=%.2f P=%d steady=%d run8=%d phases=%d: "
              "CTAs per head mode 1 %d, force %d; ids, lists, counts, scratch vs default %s; CPU rule %s\n",
              c.name, H, N, c.k_r, c.k_e, c.levels, c.empty, c.page_tokens, int(c.steady), int(c.run8),
              int(c.phases), b[0].per_head, b[1].per_head, same ? "identical" : "DIFFER",
              ::testing::Test::HasFailure() ? "FAILED (see above)" : "ok");
}

// The cases the shared table (select_test_util.h kSelectCases) does not hold.
// {name, heads, items, k_r, k_e, levels, empty, page_tokens, steady, run8, phases}
const gputest::SelectCase kExtraCases[] = {
    {"one item, estimation", 3, 1, 0, 1, 0, 0.0, 0, true, true, true},
    {"128K shape, 128 heads (batch 16)", 128, 8188, 148, 1900, -1, 0.01, 0, true, true, true},
};

TEST(CudaSelectSplit, MatchesDefaultAndCpuRule) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 18000;
  for (const auto& c : gputest::kSelectCases) run_split_case(c, ++seed);
  for (const auto& c : kExtraCases) run_split_case(c, ++seed);
}

// The parse needs no device (it throws before any CUDA call); the CTA counts do.
TEST(CudaSelectSplit, SwitchParse) {
  cuda::detail::SelectParams p;
  p.num_heads = 1;
  p.num_items = 100;
  p.k_retrieval = 2;
  p.k_estimation = 10;
  int per_head = 0;
  gputest::EnvGuard compact("RETROINFER_SELECT_COMPACT", nullptr);
  gputest::EnvGuard env(kVar, "2");
  for (const char* bad : {"2", "yes", "on", " 1"}) {
    env.set(bad);
    try {
      (void)cuda::detail::select_bins_ctas_per_head(p, &per_head);
      ADD_FAILURE() << "RETROINFER_SELECT_SPLIT='" << bad << "' did not throw";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string("'") + bad + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("force"), std::string::npos) << what;
    }
  }
  // v1 (run 6's compaction) has no split: one CTA per head under any mode (no CUDA call on that path).
  compact.set("v1");
  for (const char* mode : {"1", "force"}) {
    env.set(mode);
    per_head = -1;
    EXPECT_EQ(cuda::detail::select_bins_ctas_per_head(p, &per_head), cudaSuccess);
    EXPECT_EQ(per_head, 1) << "RETROINFER_SELECT_SPLIT=" << mode << " with RETROINFER_SELECT_COMPACT=v1";
  }
  compact.set("fast");  // an unknown compaction still throws with the split on
  EXPECT_THROW((void)cuda::detail::select_bins_ctas_per_head(p, &per_head), Error);
  compact.set(nullptr);
  std::printf("[select split] RETROINFER_SELECT_SPLIT=2|yes|on|' 1' throw retroinfer::Error naming 0, 1, force; "
              "1 / force with RETROINFER_SELECT_COMPACT=v1 -> one CTA per head %s\n",
              ::testing::Test::HasFailure() ? "FAILED" : "ok");
  RETROINFER_REQUIRE_GPU();
  const struct {
    const char* mode;
    int heads, k_e, want;
  } rows[] = {{"", 1, 10, 1},   {"0", 1, 10, 1},    {"1", 1, 10, 2},      {"force", 1, 10, 2},
              {"1", 1, 0, 1},   {"force", 1, 0, 1}, {"1", 1 << 20, 10, 1}, {"force", 1 << 20, 10, 2}};
  for (const auto& r : rows) {
    env.set(r.mode);
    p.num_heads = r.heads;
    p.k_estimation = r.k_e;
    per_head = -1;
    EXPECT_EQ(cuda::detail::select_bins_ctas_per_head(p, &per_head), cudaSuccess);
    EXPECT_EQ(per_head, r.want) << "mode '" << r.mode << "' heads " << r.heads << " k_e " << r.k_e;
  }
  // The batch 16 shape of issue #4 (128 flat heads of 8188 clusters): what mode 1 picks on this device.
  env.set("1");
  p.num_heads = 128;
  p.num_items = 8188;
  p.k_estimation = 1900;
  EXPECT_EQ(cuda::detail::select_bins_ctas_per_head(p, &per_head), cudaSuccess);
  int sms = 0;
  EXPECT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  std::printf("[select split] CTAs per head: unset/0 -> 1; 1 -> 2 (1 head), 1 (2^20 heads, or k_e = 0); force -> 2 "
              "(1 when k_e = 0) %s; mode 1 at H=128 N=8188 on %d SMs: %d\n",
              ::testing::Test::HasFailure() ? "FAILED" : "ok", sms, per_head);
}

// One layer: decodes under RETROINFER_SELECT_SPLIT=1 and =force bit-identical to the default (logits,
// scores, ids, token lists, outputs), under the default decode path and run 8's (where the bins kernel
// forms the scores itself: only the retrieval CTA writes them); under force, two graph replays and the
// stage path (phase stamps by the retrieval CTAs) bit-identical to its eager decode.
void layer_case(const gputest::PathCase& pc, uint64_t seed) {
  SCOPED_TRACE(gputest::describe(pc, seed));
  gputest::PathLayer t = gputest::make_path_layer(pc, seed);
  gputest::EnvGuard compact("RETROINFER_SELECT_COMPACT", nullptr);
  const int n_phase = gputest::expect_switch_decodes_identical(t, kVar, {"0", "default"},
                                                               {{"1", "split=1"}, {"force", "split=force"}})
                          .n_phase;
  std::printf("[select split] layer H=%d G=%d d=%d n=%lld C=%d n_r=%d n_e=%d est=%d outliers=%d: ids, lists and "
              "outputs split (1 and force) vs default %s (default path and run8); graph replays and stage path (%d "
              "phase entries) identical\n",
              t.H, pc.group, pc.d, (long long)pc.n, t.layer->num_clusters(), t.layer->n_retrieval(),
              t.layer->n_estimation(), int(pc.estimation), int(pc.outliers),
              ::testing::Test::HasFailure() ? "NOT identical (see failures)" : "identical", n_phase);
}

TEST(CudaSelectSplit, RetroLayerDecodesIdentical) {
  RETROINFER_REQUIRE_GPU();
  layer_case({1, 2, 4, 128, 5000, true, false, true}, 1801);     // small, host K/V
  layer_case({2, 1, 3, 64, 4000, true, true, true}, 1802);       // outliers
  layer_case({1, 4, 1, 128, 2500, false, false, true}, 1803);    // no estimation
  layer_case({4, 8, 4, 128, 131072, true, false, false}, 1804);  // 128K, batch 4 (issue #4's shape)
}

}  // namespace
}  // namespace retroinfer
