// The 4-CTA cluster selection (select_cl.cu, RETROINFER_SELECT_CL) against the one-CTA bins kernel
// (select_bins.cu; past 40960 items it reads its scores from global memory) on the same inputs in one process: retrieval and estimation ids, token lists, token counts
// and the scan scratch bit-identical (every output buffer poisoned first and compared whole), the ids equal to
// the CPU rule "sort by (score desc, id asc), cut at k_r and k_r + k_e", and with stamps on, every head's
// selection phases stamped (by rank 0).
// - Ready scores: the selection kernels' shared table (select_test_util.h kSelectCases: 1 .. 40960 items, ties
//   taken partly, signed zeros, the band whose threshold bin overflows the candidates (the counting search
//   here), pages, k_r or k_e 0 or past the finite items, > 1024 retrieval items) and 128 heads (more clusters
//   than fit at once).
// - Scores formed from logits (group 1 .. 8, empty clusters, the 128K batch 4 shape): the formed scores the
//   kernel writes bit-identical to the bins kernel's too.
// - RetroLayer decodes at 128K batch 4 (issue #4's shape) and small shapes (outliers, no estimation) under
//   RETROINFER_SELECT_CL=1 bit-identical to 0 (logits, scores, ids, token lists, outputs), graph replays and
//   the stage path too, and under run 8's path.
// - The switch's parse, the plans (4 CTAs per head up to 40960 items, 8 beyond) and the launch's refusals.
// One "[select cl]" line per case.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "decode_path_test_util.h"
#include "gpu_test_util.h"
#include "retroinfer/error.h"
#include "select_test_util.h"

namespace retroinfer {
namespace {

using cuda::detail::SelectParams;

bool all_phases_stamped(const std::vector<uint64_t>& phase, int H) {
  using cuda::detail::kPhaseSlots;
  using cuda::detail::kSelPhases;
  for (int h = 0; h < H; ++h)
    for (int j = 2; j < 2 + 2 * kSelPhases; ++j)
      if (phase[size_t(h) * kPhaseSlots + j] == ~uint64_t{0}) return false;
  return true;
}

// The reference: the bins kernel up to 40960 items, beyond them select_and_expand's 8-CTA cluster kernel
// (select_cluster.cu; no grid workspace here), whose scan scratch holds other (local) positions.
constexpr int kBinsMaxItems = 40960;

gputest::SelectOutputs run_reference(const gputest::SelectInputs& in) {
  if (in.N <= kBinsMaxItems) return gputest::run_select(in, "bins", false);
  return gputest::run_select(in, "cluster", false, {}, [](const SelectParams& p, cudaStream_t s) {
    return cuda::detail::select_and_expand(p, s);
  });
}

// The outputs of the reference and of the cluster selection compared whole (poison included); past 40960 items
// without the scan scratch (see run_reference).
bool expect_same(const gputest::SelectInputs& in, gputest::SelectOutputs a, const gputest::SelectOutputs& b) {
  if (in.N > kBinsMaxItems) a.scratch = b.scratch;
  return gputest::expect_same_outputs(a, b, "", in.N > kBinsMaxItems ? "cluster" : "bins", "cl");
}

gputest::SelectOutputs run_cl(const gputest::SelectInputs& in, bool phases) {
  return gputest::run_select(in, "cl", phases, {}, [](const SelectParams& p, cudaStream_t s) {
    return cuda::detail::select_and_expand_cl(p, s);
  });
}

void run_ready_case(const gputest::SelectCase& c, uint64_t seed) {
  SCOPED_TRACE(gputest::describe(c, seed));
  gputest::EnvGuard compact("RETROINFER_SELECT_COMPACT", nullptr);
  gputest::EnvGuard split("RETROINFER_SELECT_SPLIT", nullptr);
  const gputest::SelectInputs in = gputest::make_select_inputs(c, seed);
  const gputest::SelectOutputs a = run_reference(in);
  const gputest::SelectOutputs b = run_cl(in, c.phases);
  const bool same = expect_same(in, a, b);
  if (c.phases) {
    EXPECT_TRUE(all_phases_stamped(b.phase, in.H));
  }
  for (int h = 0; h < in.H && !::testing::Test::HasFailure(); ++h) {
    SCOPED_TRACE(testing::Message() << "head " << h);
    const std::vector<int32_t> r = gputest::expect_cpu_rule_ids(in, b, h);
    gputest::expect_token_list(in, b, h, r);
  }
  std::printf("[select cl] %s H=%d N=%d k_r=%d k_e=%d levels=%d empty=%.2f P=%d steady=%d run8=%d: ids, lists, "
              "counts, scratch vs reference %s; CPU rule and expansion %s\n",
              c.name, in.H, in.N, c.k_r, c.k_e, c.levels, c.empty, c.page_tokens, int(c.steady), int(c.run8),
              same ? "identical" : "DIFFER", ::testing::Test::HasFailure() ? "FAILED (see above)" : "ok");
}

TEST(CudaSelectCl, ReadyScoresMatchBinsAndCpuRule) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 21000;
  for (const auto& c : gputest::kSelectCases) run_ready_case(c, ++seed);
  // {name, heads, items, k_r, k_e, levels, empty, page_tokens, steady, run8, phases}
  const gputest::SelectCase extra[] = {
      {"128K shape, 128 heads (batch 16)", 128, 8188, 148, 1900, -1, 0.01, 0, true, true, true},
      {"one item, estimation", 3, 1, 0, 1, 0, 0.0, 0, true, true, true},
      {"40960 band, both thresholds searched", 2, 40960, 738, 9503, -2, 0.0, 0, true, true, false},
      // 8 CTAs per head (past 40960 items; the bins kernel reads these scores from global memory).
      {"40961 (8 CTAs)", 2, 40961, 738, 9503, -1, 0.01, 0, true, true, true},
      {"1M shape 65532", 8, 65532, 1180, 15200, -1, 0.01, 0, true, true, true},
      {"65532 ties", 2, 65532, 1180, 15200, 7, 0.0, 0, true, true, false},
      {"65532 band", 1, 65532, 1180, 15200, -2, 0.0, 0, false, true, false},
      {"81920 (max), pages", 1, 81920, 1475, 0, 0, 0.1, 2, true, false, false},
  };
  for (const auto& c : extra) run_ready_case(c, ++seed);
}

// Scores formed from logits: [H, G, N] logits (N(0, 2) scaled, -inf for the empty clusters, in all G rows)
// and [H, G, parts] normaliser partials (max, sum of e^{l - max}) over `parts` contiguous ranges, as the score
// grid writes them. Both kernels form the scores (group > 0) and select.
struct FormCase {
  const char* name;
  int heads, group, items, k_r, k_e, parts;
  double empty;
};

void run_form_case(const FormCase& fc, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << fc.name << " H=" << fc.heads << " G=" << fc.group << " N=" << fc.items
                                  << " seed=" << seed);
  gputest::EnvGuard compact("RETROINFER_SELECT_COMPACT", nullptr);
  gputest::EnvGuard split("RETROINFER_SELECT_SPLIT", nullptr);
  gputest::SelectCase c{fc.name, fc.heads, fc.items, fc.k_r, fc.k_e, -1, 0.0, 0, true, true, false};
  gputest::SelectInputs in = gputest::make_select_inputs(c, seed);
  const int H = fc.heads, G = fc.group, N = fc.items, P = fc.parts;
  std::mt19937_64 rng(seed + 7);
  std::normal_distribution<float> n01(0.0f, 2.0f);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  std::vector<float> logits(size_t(H) * G * N);
  std::vector<char> empty(size_t(H) * N);
  for (auto& e : empty) e = u01(rng) < fc.empty;
  for (int h = 0; h < H; ++h)
    for (int g = 0; g < G; ++g)
      for (int i = 0; i < N; ++i)
        logits[(size_t(h) * G + g) * N + i] = empty[size_t(h) * N + i] ? -INFINITY : n01(rng);
  std::vector<float> part(size_t(H) * G * P * 2);
  for (int hg = 0; hg < H * G; ++hg)
    for (int q = 0; q < P; ++q) {
      const int b = int(int64_t{N} * q / P), e = int(int64_t{N} * (q + 1) / P);
      float m = -INFINITY, s = 0.0f;
      for (int i = b; i < e; ++i) m = std::max(m, logits[size_t(hg) * N + i]);
      if (m != -INFINITY)
        for (int i = b; i < e; ++i) s += std::exp(logits[size_t(hg) * N + i] - m);
      part[(size_t(hg) * P + q) * 2] = m;
      part[(size_t(hg) * P + q) * 2 + 1] = s;
    }
  cuda::DeviceBuffer d_logits = gputest::upload(logits), d_part = gputest::upload(part);
  cuda::DeviceBuffer sa(size_t(H) * N * 4), sb(size_t(H) * N * 4);
  in.p.logits = d_logits.as<float>();
  in.p.norm_partial = reinterpret_cast<const float2*>(d_part.as<float>());
  in.p.norm_parts = P;
  in.p.group = G;
  sa.fill_bytes(0x7f);
  sb.fill_bytes(0x7f);
  in.p.scores = sa.as<float>();
  const gputest::SelectOutputs a = run_reference(in);
  in.p.scores = sb.as<float>();
  const gputest::SelectOutputs b = run_cl(in, true);
  const bool same = expect_same(in, a, b);
  std::vector<float> fa(size_t(H) * N), fb(size_t(H) * N);
  sa.download(fa.data(), fa.size() * 4);
  sb.download(fb.data(), fb.size() * 4);
  size_t diff = 0;
  for (size_t i = 0; i < fa.size(); ++i) diff += std::memcmp(&fa[i], &fb[i], 4) != 0;
  EXPECT_EQ(diff, 0u) << "formed scores differ";
  EXPECT_TRUE(all_phases_stamped(b.phase, H));
  // The CPU rule on the formed scores (the bins kernel's, now equal).
  in.scores = fa;
  for (int h = 0; h < H && !::testing::Test::HasFailure(); ++h) {
    SCOPED_TRACE(testing::Message() << "head " << h);
    const std::vector<int32_t> r = gputest::expect_cpu_rule_ids(in, b, h);
    gputest::expect_token_list(in, b, h, r);
  }
  std::printf("[select cl] formed %s H=%d G=%d N=%d k_r=%d k_e=%d parts=%d empty=%.2f: formed scores %s, outputs vs "
              "bins %s; CPU rule %s\n",
              fc.name, H, G, N, fc.k_r, fc.k_e, P, fc.empty, diff == 0 ? "identical" : "DIFFER",
              same ? "identical" : "DIFFER", ::testing::Test::HasFailure() ? "FAILED (see above)" : "ok");
}

TEST(CudaSelectCl, FormedScoresMatchBins) {
  RETROINFER_REQUIRE_GPU();
  const FormCase cases[] = {
      {"128K batch 4 shape", 32, 4, 8188, 148, 1900, 99, 0.01},
      {"32K, G=1", 3, 1, 2044, 37, 475, 24, 0.0},
      {"d64 G=3 tail", 2, 3, 4097, 74, 950, 17, 0.05},
      {"G=8, 40960", 2, 8, 40960, 738, 9503, 128, 0.02},
      {"few items", 2, 2, 7, 1, 3, 1, 0.3},
      {"1M batch 1 shape (8 CTAs)", 8, 4, 65532, 1180, 15200, 132, 0.01},
  };
  uint64_t seed = 21500;
  for (const auto& fc : cases) run_form_case(fc, ++seed);
}

void layer_case(const gputest::PathCase& pc, uint64_t seed) {
  SCOPED_TRACE(gputest::describe(pc, seed));
  gputest::PathLayer t = gputest::make_path_layer(pc, seed);
  gputest::EnvGuard compact("RETROINFER_SELECT_COMPACT", nullptr);
  gputest::EnvGuard split("RETROINFER_SELECT_SPLIT", nullptr);
  const int n_phase =
      gputest::expect_switch_decodes_identical(t, "RETROINFER_SELECT_CL", {"0", "bins"}, {{"1", "cl"}}).n_phase;
  std::printf("[select cl] layer H=%d G=%d d=%d n=%lld C=%d n_r=%d n_e=%d est=%d outliers=%d: ids, lists and outputs "
              "cl vs bins %s (default path and run8); graph replays and stage path (%d phase entries) identical\n",
              t.H, pc.group, pc.d, (long long)pc.n, t.layer->num_clusters(), t.layer->n_retrieval(),
              t.layer->n_estimation(), int(pc.estimation), int(pc.outliers),
              ::testing::Test::HasFailure() ? "NOT identical (see failures)" : "identical", n_phase);
}

TEST(CudaSelectCl, RetroLayerDecodesIdentical) {
  RETROINFER_REQUIRE_GPU();
  layer_case({1, 2, 4, 128, 5000, true, false, true}, 2101);     // small, host K/V
  layer_case({2, 1, 3, 64, 4000, true, true, true}, 2102);       // outliers
  layer_case({1, 4, 1, 128, 2500, false, false, true}, 2103);    // no estimation
  layer_case({4, 8, 4, 128, 131072, true, false, false}, 2104);  // 128K, batch 4 (issue #4's shape)
  layer_case({1, 8, 4, 128, 524288, true, false, false}, 2105);  // 512K, batch 1 (4 CTAs, 16 items per thread)
  layer_case({1, 8, 4, 128, 1048576, true, false, false}, 2106); // 1M, batch 1 (8 CTAs per head)
}

TEST(CudaSelectCl, SwitchAndRefusals) {
  using cuda::detail::SelectClMode;
  gputest::EnvGuard env("RETROINFER_SELECT_CL", nullptr);
  EXPECT_EQ(cuda::detail::select_cl_mode(), SelectClMode::kAuto);
  env.set("");
  EXPECT_EQ(cuda::detail::select_cl_mode(), SelectClMode::kAuto);
  env.set("0");
  EXPECT_EQ(cuda::detail::select_cl_mode(), SelectClMode::kOff);
  env.set("1");
  EXPECT_EQ(cuda::detail::select_cl_mode(), SelectClMode::kOn);
  for (const char* bad : {"2", "on", "yes", " 1", "auto"}) {
    env.set(bad);
    try {
      (void)cuda::detail::select_cl_mode();
      ADD_FAILURE() << "RETROINFER_SELECT_CL='" << bad << "' did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos) << e.what();
    }
  }
  SelectParams p;
  p.num_heads = 1;
  p.k_retrieval = 2;
  float dummy = 0.0f;
  p.scores = &dummy;
  for (const int n : {0, -1, cuda::detail::kSelectClMaxItems + 1}) {
    p.num_items = n;
    EXPECT_EQ(cuda::detail::select_cl_ctas(n), 0) << n;
    EXPECT_EQ(cuda::detail::select_cl_ipt(p), 0) << n;
    EXPECT_EQ(cuda::detail::select_and_expand_cl(p, nullptr), cudaErrorInvalidValue) << n;
  }
  const struct {
    int items, ctas, ipt;
  } rows[] = {{1, 4, 1}, {8188, 4, 4}, {40960, 4, 20}, {40961, 8, 11}, {65532, 8, 16}, {81920, 8, 20}};
  for (const auto& r : rows) {
    p.num_items = r.items;
    EXPECT_EQ(cuda::detail::select_cl_ctas(r.items), r.ctas) << r.items;
    EXPECT_EQ(cuda::detail::select_cl_ipt(p), r.ipt) << r.items;
  }
  std::printf("[select cl] RETROINFER_SELECT_CL parse (unset/'' auto, 0 off, 1 on, 2|on|yes|' 1'|auto throw), "
              "refusals (0, -1, 81921 items) and plans (4 CTAs up to 40960 items, 8 beyond) %s\n",
              ::testing::Test::HasFailure() ? "FAILED" : "ok");
}

}  // namespace
}  // namespace retroinfer
