// Run 9's decode path (RETROINFER_DECODE=run9, layer_common.h decode_path: the scores formed by their own
// grid, select_scores.cu; the estimation as CTAs of the exact-attention grid, decode.cu estimate_cta) against
// run 8 (RETROINFER_DECODE=run8) on the same layer and query, and against CPU loops in f64:
//   - scores bit-identical to run 8's (the same expressions in the same order), hence retrieval /
//     estimation ids and token lists identical, and the selection equal to the CPU rule on those scores;
//   - outputs within rounding of run 8's (bounds below) and, for the clustered host-side K/V, of an f64
//     reference of the zones (exact tokens of the list + estimation from the bf16 value sums);
//   - outputs poisoned before every decode and checked written; graph replays and the stage-timing path
//     bit-identical to the eager decode.
// Shapes: batch 1/3/4/16, head_dim 64/128, GQA groups 1/3/4/8, estimation chunks with tails (k_e not a
// multiple of kEstimateFusedChunk = 128, k_e < 128), score blocks with tails (C not a multiple of 1024), no
// estimation, outliers (list_append between the selection and the attention), and the bench shapes (128K x
// 8 heads, 32K x 32 heads) and one past the one-CTA selection (> 40K clusters: the cluster kernel on formed
// scores). One "[decode run9]" line per case.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "decode_path_test_util.h"
#include "gpu_test_util.h"

namespace retroinfer {
namespace {

using gputest::cpu_select;
using gputest::decode_once;
using gputest::EnvGuard;
using gputest::PathCase;
using gputest::PathResult;

// Run 9 vs run 8 (same selection, same exact tokens): they differ by rounding only (bounds and their
// derivation: decode_path_test_util.h).
constexpr double kMaxAbsVsRun8 = gputest::kMaxAbsReorder;
constexpr double kNmseVsRun8 = gputest::kNmseReorder;
// Against the f64 reference (test_cuda_retro.cpp's tolerances: f32 arithmetic on identical inputs, the
// exact part's P carried to 2^-18 by the hi/lo split).
constexpr double kNmseVsRef = 1e-9;
constexpr double kMaxAbsVsRef = 1e-4;

void run9_case(const PathCase& rc, uint64_t seed) {
  SCOPED_TRACE(gputest::describe(rc, seed));
  gputest::PathLayer t = gputest::make_path_layer(rc, seed);
  const int H = t.H, G = rc.group, d = rc.d;
  cuda::RetroLayer& layer = *t.layer;

  EnvGuard env("RETROINFER_DECODE", "run8");
  const PathResult a = decode_once(t);
  env.set("run9");
  const PathResult b = decode_once(t);
  const int C = layer.num_clusters();
  for (int h = 0; h < H; ++h) {
    SCOPED_TRACE(testing::Message() << "flat head " << h);
    EXPECT_EQ(b.heads[h].scores, a.heads[h].scores);  // bit-identical formation
    EXPECT_EQ(b.heads[h].retrieval_ids, a.heads[h].retrieval_ids);
    EXPECT_EQ(b.heads[h].estimation_ids, a.heads[h].estimation_ids);
    EXPECT_EQ(b.heads[h].token_list, a.heads[h].token_list);
    if (C > 0) {  // the CPU rule on the GPU's scores
      std::vector<int32_t> r_ref, e_ref;
      cpu_select(b.heads[h].scores, layer.n_retrieval(), layer.n_estimation(), r_ref, e_ref);
      EXPECT_EQ(b.heads[h].retrieval_ids, r_ref);
      EXPECT_EQ(b.heads[h].estimation_ids, e_ref);
    }
  }
  // The two parts alone: the formation changes no bit of run 8's output (identical scores feed the same
  // kernels), the estimation alone gives run 9's output bit for bit (run 9's formation changes nothing).
  env.set("run9form");
  const PathResult pf = decode_once(t);
  env.set("run9est");
  const PathResult pe = decode_once(t);
  env.set("run9");
  for (size_t i = 0; i < a.out.size(); ++i) {
    ASSERT_EQ(pf.out[i], a.out[i]) << "run9form vs run8, element " << i;
    ASSERT_EQ(pe.out[i], b.out[i]) << "run9est vs run9, element " << i;
  }
  const auto c8 = gputest::compare(b.out, a.out);
  EXPECT_EQ(c8.unwritten, 0);
  EXPECT_LT(c8.max_abs, kMaxAbsVsRun8);
  EXPECT_LT(c8.nmse, kNmseVsRun8);

  // f64 reference of the zones run 9 selected (host-side K/V only; decode_path_test_util.h f64_reference).
  gputest::Compare cref;
  if (rc.host_kv) {
    const std::vector<float> ref = gputest::f64_reference(t, b, G, d);
    cref = gputest::compare(b.out, ref);
    EXPECT_EQ(cref.unwritten, 0);
    EXPECT_LT(cref.nmse, kNmseVsRef);
    EXPECT_LT(cref.max_abs, kMaxAbsVsRef);
  }

  // Graph replays of run 9 and the stage-timing path: bit-identical to the eager decode.
  gputest::expect_graph_replays(t, b.out);
  gputest::expect_stage_path(t, b.out);
  std::printf("[decode run9] H=%d G=%d d=%d n=%lld C=%d n_e=%d est=%d outliers=%d: vs run8 nmse %.2e max-abs %.2e; "
              "vs f64 ref nmse %.2e max-abs %.2e%s\n",
              H, G, d, (long long)rc.n, C, layer.n_estimation(), int(rc.estimation), int(rc.outliers), c8.nmse,
              c8.max_abs, cref.nmse, cref.max_abs, rc.host_kv ? "" : " (no ref: device K/V)");
}

TEST(CudaDecodeRun9, MatchesRun8AndCpu) {
  RETROINFER_REQUIRE_GPU();
  run9_case({1, 2, 4, 128, 5000, true, false, true}, 301);   // k_e < 128: one partial estimation CTA
  run9_case({3, 2, 8, 64, 9000, true, false, true}, 302);    // batch 3, G 8, d 64: k_e just past 128
  run9_case({4, 1, 1, 128, 3001, true, false, true}, 303);   // batch 4, G 1
  run9_case({2, 1, 3, 64, 4000, true, true, true}, 304);     // G 3, outliers: list_append in between
  run9_case({1, 4, 1, 128, 2500, false, false, true}, 305);  // no estimation: exact CTAs only
  run9_case({1, 2, 4, 128, 30, true, false, true}, 306);     // all steady (dense path, run 9 unused)
  run9_case({1, 2, 8, 128, 2700, true, false, true}, 307);   // G 8, d 128
}

TEST(CudaDecodeRun9, MatchesRun8ManyHeads) {
  RETROINFER_REQUIRE_GPU();
  run9_case({16, 2, 4, 128, 3000, true, false, false}, 401);  // batch 16
  run9_case({16, 1, 8, 64, 2100, true, false, false}, 402);   // batch 16, G 8, d 64
  run9_case({1, 4, 8, 64, 16420, true, false, false}, 403);   // C ~ 1025: a score block of one item
  run9_case({3, 2, 1, 128, 20011, true, false, false}, 404);  // batch 3, G 1
}

// Bench shapes (many exact and estimation CTAs counting into one merge) and > 40K clusters.
TEST(CudaDecodeRun9, MatchesRun8BenchShapes) {
  RETROINFER_REQUIRE_GPU();
  run9_case({1, 8, 4, 128, 131072, true, false, false}, 501);  // Llama-3-8B, 128K, batch 1
  run9_case({4, 8, 4, 128, 32768, true, false, false}, 502);   // 32K, batch 4
  run9_case({1, 1, 4, 128, 700001, true, false, false}, 503);  // ~43K clusters: the cluster selection
}

}  // namespace
}  // namespace retroinfer
