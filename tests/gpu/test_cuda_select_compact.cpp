// The bins selection kernel's two compactions (select_bins.cu; RETROINFER_SELECT_COMPACT=v1, run 6's
// chunked block scan, and =ballot, the warp-range compaction) on the same inputs in one process: retrieval
// and estimation ids, token lists, token counts and the scan scratch must be bit-identical (every output
// buffer is poisoned first and compared whole, so an entry one variant leaves unwritten fails too), and
// equal to the CPU rule "sort by (score desc, id asc), cut at k_r and k_r + k_e" with the exact-token
// expansion. Inputs: ready scores (group 0) of 1 .. 40960 items with tails around the 128-item halves and
// 256-item steps, k_r / k_e including 0, k_r + k_e >= the finite items, many and all -inf items, exact ties
// taken partially at a threshold (few levels; signed zeros; the band that overflows the threshold bin into
// the radix passes), CSR clusters of random sizes (empty, and longer than one prefetch line) and pages
// (Quest), steady zones of 0 and > 0 tokens, more than kBinExp (1024) retrieval items, with and without
// run 8's PDL launch and prefetches and the phase stamps. Then whole layers: RetroLayer decodes (run 9 +
// run 10's formation, the default; run 8, where the bins kernel forms the scores itself) at small and bench
// shapes (128K batch 4 = issue #4's, 32K batch 4), graph replays and the stage path under ballot, and a
// QuestLayer decode: logits, scores, ids, token lists and outputs bit-identical between the variants.
// An unknown RETROINFER_SELECT_COMPACT throws retroinfer::Error naming the valid values.
// One "[select compact]" line per case.
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

constexpr char kVar[] = "RETROINFER_SELECT_COMPACT";

// The shared inputs (select_test_util.h) and, with c.phases, a phase buffer ([H, kPhaseSlots] u64, 0xff =
// unstamped) attached to p.phase: both variants stamp into it (the stamps are times, never compared).
gputest::SelectInputs make_inputs(const gputest::SelectCase& c, uint64_t seed) {
  gputest::SelectInputs in = gputest::make_select_inputs(c, seed);
  if (c.phases) {
    in.d_phase = cuda::DeviceBuffer(size_t(in.H) * cuda::detail::kPhaseSlots * 8);
    in.d_phase.fill_bytes(0xff);
    in.p.phase = in.d_phase.as<uint64_t>();
  }
  return in;
}

gputest::SelectOutputs run_variant(const gputest::SelectInputs& in, const char* variant) {
  gputest::EnvGuard env(kVar, variant);
  return gputest::run_select(in, variant, /*own_phase=*/false);
}

void run_compact_case(const gputest::SelectCase& c, uint64_t seed) {
  SCOPED_TRACE(gputest::describe(c, seed));
  const gputest::SelectInputs in = make_inputs(c, seed);
  const gputest::SelectOutputs a = run_variant(in, "v1"), b = run_variant(in, "ballot");
  const bool same = gputest::expect_same_outputs(a, b, "", "v1", "ballot");
  // The CPU rule and the expansion, on the ballot outputs (v1's are the same when `same`).
  const int H = in.H, N = in.N, P = c.page_tokens;
  int64_t max_out = 0;
  for (int h = 0; h < H && !::testing::Test::HasFailure(); ++h) {
    SCOPED_TRACE(testing::Message() << "head " << h);
    int64_t n_r = 0;
    const std::vector<int32_t> r = gputest::expect_cpu_rule_ids(in, b, h, &n_r);
    max_out = std::max(max_out, n_r);
    gputest::expect_token_list(in, b, h, r);
  }
  std::printf("[select compact] %s H=%d N=%d k_r=%d k_e=%d levels=%d empty=%.2f P=%d steady=%d run8=%d: v1 vs "
              "ballot ids, lists, counts, scratch %s; CPU rule %s; max retrieval items %lld\n",
              c.name, H, N, c.k_r, c.k_e, c.levels, c.empty, P, int(c.steady), int(c.run8),
              same ? "identical" : "DIFFER", ::testing::Test::HasFailure() ? "FAILED (see above)" : "ok",
              (long long)max_out);
}

TEST(CudaSelectCompact, BallotMatchesV1AndCpuRule) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 16000;
  for (const auto& c : gputest::kSelectCases) run_compact_case(c, ++seed);
}

TEST(CudaSelectCompact, UnknownVariantThrows) {
  RETROINFER_REQUIRE_GPU();
  const gputest::SelectCase c{"unknown", 1, 100, 2, 10, 0, 0.0, 0, true, false, false};
  const gputest::SelectInputs in = make_inputs(c, 17);
  cuda::DeviceBuffer ret(8 * 4), est(10 * 4), list(size_t(in.list_stride) * 4), count(4), scratch(3 * 4);
  cuda::detail::SelectParams p = in.p;
  p.retrieval_ids = ret.as<int>();
  p.estimation_ids = est.as<int>();
  p.token_list = list.as<int>();
  p.token_count = count.as<int>();
  p.scan_scratch = scratch.as<int>();
  gputest::EnvGuard env(kVar, "fast");
  try {
    (void)cuda::detail::select_and_expand_bins(p, nullptr);
    ADD_FAILURE() << "RETROINFER_SELECT_COMPACT=fast did not throw";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("fast"), std::string::npos) << what;
    EXPECT_NE(what.find("v1"), std::string::npos) << what;
    EXPECT_NE(what.find("ballot"), std::string::npos) << what;
  }
  env.set("");  // empty = unset: the default (ballot)
  EXPECT_EQ(cuda::detail::select_and_expand_bins(p, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::printf("[select compact] RETROINFER_SELECT_COMPACT=fast throws retroinfer::Error naming v1 and ballot; "
              "empty runs the default (ballot)\n");
}

// One layer: v1 and ballot decodes bit-identical under the default decode path and run 8's (where the bins
// kernel forms the scores itself); under ballot, two graph replays and the stage path (phase stamps)
// bit-identical to its eager decode.
void layer_case(const gputest::PathCase& pc, uint64_t seed) {
  SCOPED_TRACE(gputest::describe(pc, seed));
  gputest::PathLayer t = gputest::make_path_layer(pc, seed);
  const gputest::SwitchDecodes d =
      gputest::expect_switch_decodes_identical(t, kVar, {"v1", "v1"}, {{"ballot", "ballot"}});
  size_t retrieval = 0;
  for (const auto& hd : d.last.heads) retrieval = std::max(retrieval, hd.retrieval_ids.size());
  std::printf("[select compact] layer H=%d G=%d d=%d n=%lld C=%d n_r=%d n_e=%d est=%d outliers=%d: ids, lists and "
              "outputs ballot vs v1 %s (default path and run8); graph replays and stage path (%d phase entries) "
              "identical; max retrieval ids %zu\n",
              t.H, pc.group, pc.d, (long long)pc.n, t.layer->num_clusters(), t.layer->n_retrieval(),
              t.layer->n_estimation(), int(pc.estimation), int(pc.outliers),
              ::testing::Test::HasFailure() ? "NOT identical (see failures)" : "identical", d.n_phase, retrieval);
}

TEST(CudaSelectCompact, RetroLayerDecodesIdentical) {
  RETROINFER_REQUIRE_GPU();
  layer_case({1, 2, 4, 128, 5000, true, false, true}, 1601);   // small, host K/V
  layer_case({2, 1, 3, 64, 4000, true, true, true}, 1602);     // outliers
  layer_case({1, 4, 1, 128, 2500, false, false, true}, 1603);  // no estimation
  layer_case({4, 8, 4, 128, 32768, true, false, false}, 1604);   // 32K, batch 4
  layer_case({4, 8, 4, 128, 131072, true, false, false}, 1605);  // 128K, batch 4 (issue #4's shape)
}

TEST(CudaSelectCompact, QuestLayerDecodesIdentical) {
  RETROINFER_REQUIRE_GPU();
  const int hkv = 2, G = 4, d = 128;
  const int64_t n = 6000;
  auto kv = gputest::make_kv(hkv, n, n, d, 1701);
  auto q = gputest::make_q(kv, G, 1702);
  AttentionConfig cfg;
  cfg.sink_tokens = 4;
  cfg.window_tokens = 16;
  cfg.budget_tokens = 700;
  cuda::QuestLayer layer(AttentionShape{hkv * G, hkv, d}, cfg);
  auto dk = gputest::upload(kv.k), dv = gputest::upload(kv.v), dq = gputest::upload(q);
  layer.build(dk.as<uint16_t>(), dv.as<uint16_t>(), n, n);
  std::vector<float> out[2];
  std::vector<std::vector<int32_t>> lists[2];
  const char* variants[2] = {"v1", "ballot"};
  for (int v = 0; v < 2; ++v) {
    gputest::EnvGuard env(kVar, variants[v]);
    auto dout = gputest::poisoned(q.size());
    layer.decode(dq.as<float>(), dout.as<float>());
    cuda::synchronize();
    out[v] = gputest::download_f32(dout, q.size());
    for (int h = 0; h < hkv; ++h) lists[v].push_back(layer.token_list(h));
  }
  EXPECT_EQ(lists[1], lists[0]);
  EXPECT_EQ(gputest::compare(out[1], out[0]).unwritten, 0);
  for (size_t i = 0; i < out[0].size(); ++i) ASSERT_EQ(out[1][i], out[0][i]) << "output element " << i;
  std::printf("[select compact] quest hkv=%d G=%d d=%d n=%lld pages=%d selected=%d: token lists and outputs "
              "ballot vs v1 %s\n",
              hkv, G, d, (long long)n, layer.num_pages(), layer.selected_pages(),
              ::testing::Test::HasFailure() ? "NOT identical" : "identical");
}

}  // namespace
}  // namespace retroinfer
