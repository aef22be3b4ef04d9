// Run 10's decode path (RETROINFER_DECODE=run10 = run10form; the default since run 15, layer_common.h
// decode_path: the selection's scores formed by the score grid itself after a grid-wide barrier, select.cu
// form_own_scores, where the one-wave grid fits at once) against run 9 on the same layer and query. Run 10
// changes where and when the scores are formed, not how (select_common.cuh form_head_score, one device
// function for both): logits, scores, retrieval / estimation ids, token lists and the outputs must all be
// bit-identical to run 9's, under both names and under the unset default. Also: the selection equals the
// CPU rule on those scores; outputs are poisoned before every decode and checked written; two graph
// replays (a cooperative score kernel with the selection as its programmatic dependent) and an eager
// decode after them bit-identical to the eager decode; the stage-timing path (phase stamps) bit-identical,
// with its phase entries. (Run 10's other parts, run10select / run10list, were removed after run 15.)
// Shapes as test_cuda_decode_run9.cpp: batch 1/3/4/16, head_dim 64/128, GQA groups 1/3/4/8, estimation
// tails, no estimation, outliers, all steady, 128K x 8 heads, 32K x 32 heads, ~700K tokens (> 40K clusters:
// the cluster selection, with run 10's formation). Run 17's run10c (combine_states by PDL instead of the
// fused merge): the same zones, outputs within the reordering bounds, repeats and graph replays bit-identical.
// Run 25's run10s (run10c with the scores formed by the bins selection): bit-identical to run10c.
// One "[decode run10]" line per case.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "attention/cuda/layer_common.h"
#include "decode_path_test_util.h"
#include "gpu_test_util.h"

namespace retroinfer {
namespace {

using gputest::cpu_select;
using gputest::decode_once;
using gputest::EnvGuard;
using gputest::PathCase;
using gputest::PathResult;

void run10_case(const PathCase& rc, uint64_t seed) {
  SCOPED_TRACE(gputest::describe(rc, seed));
  gputest::PathLayer t = gputest::make_path_layer(rc, seed);
  const int H = t.H, G = rc.group, d = rc.d;
  cuda::RetroLayer& layer = *t.layer;

  EnvGuard env("RETROINFER_DECODE", "run9");
  const PathResult a = decode_once(t);
  env.set("run10");
  const PathResult b = decode_once(t);
  gputest::expect_identical(b, a, "run10 vs run9");
  const int C = layer.num_clusters();
  for (int h = 0; h < H && C > 0; ++h) {  // the CPU rule on the GPU's scores
    SCOPED_TRACE(testing::Message() << "flat head " << h);
    std::vector<int32_t> r_ref, e_ref;
    cpu_select(b.heads[h].scores, layer.n_retrieval(), layer.n_estimation(), r_ref, e_ref);
    EXPECT_EQ(b.heads[h].retrieval_ids, r_ref);
    EXPECT_EQ(b.heads[h].estimation_ids, e_ref);
  }
  const auto c9 = gputest::compare(b.out, a.out);
  EXPECT_EQ(c9.unwritten, 0);
  env.set("run10form");
  gputest::expect_identical(decode_once(t), a, "run10form vs run9");
  const PathResult dflt = [&] {
    env.set(nullptr);  // the default: run 9 + run 10's formation and, since run 17, run10c's merge
    return decode_once(t);
  }();
  // Run 17's run10c: the same zones, the partial states merged by combine_states (pairwise softmax_merge,
  // chained by PDL) instead of the fused merge: the same terms in another order, so within the reordering
  // bounds of decode_path_test_util.h; written, repeated bit for bit, graph replays and the stage path too.
  env.set("run10c");
  const PathResult c = decode_once(t);
  for (int h = 0; h < H; ++h) {
    EXPECT_EQ(c.heads[h].token_list, b.heads[h].token_list) << "run10c flat head " << h;
    EXPECT_EQ(c.heads[h].estimation_ids, b.heads[h].estimation_ids) << "run10c flat head " << h;
  }
  const auto cc = gputest::compare(c.out, b.out);
  EXPECT_EQ(cc.unwritten, 0);
  EXPECT_LT(cc.max_abs, gputest::kMaxAbsReorder) << "run10c vs run10";
  EXPECT_LT(cc.nmse, gputest::kNmseReorder) << "run10c vs run10";
  gputest::expect_identical(decode_once(t), c, "run10c repeat");
  gputest::expect_identical(dflt, cuda::detail::kRun10CombineIsDefault ? c : b, "default vs run10c / run10");
  gputest::expect_identical(gputest::expect_graph_replays(t, c.out), c, "run10c eager after replays");
  gputest::expect_stage_path(t, c.out);
  // Run 25's run10s: run10c with the scores formed by the bins selection from the logits and partials (no grid
  // barrier in the score grid): the same formation function on the same values, so bit-identical to run10c,
  // eagerly, in graph replays and on the stage path.
  env.set("run10s");
  const PathResult sel = decode_once(t);
  gputest::expect_identical(sel, c, "run10s vs run10c");
  gputest::expect_identical(gputest::expect_graph_replays(t, sel.out), c, "run10s eager after replays");
  gputest::expect_stage_path(t, sel.out);
  env.set("run10");

  // Graph replays of run 10 and the stage-timing path: bit-identical to its eager decode.
  const PathResult e = gputest::expect_graph_replays(t, b.out);
  gputest::expect_identical(e, b, "eager after replays");
  const int n_phase = gputest::expect_stage_path(t, b.out).n_phase;
  std::printf("[decode run10] H=%d G=%d d=%d n=%lld C=%d n_e=%d est=%d outliers=%d: logits, scores, ids, lists "
              "and outputs vs run9 identical%s (run10form too, the default as run10c, run10s as run10c); graph replays identical; %d phase "
              "entries; run10c vs run10 nmse %.2e max-abs %.2e\n",
              H, G, d, (long long)rc.n, C, layer.n_estimation(), int(rc.estimation), int(rc.outliers),
              ::testing::Test::HasFailure() ? " NOT (see failures)" : "", n_phase, cc.nmse, cc.max_abs);
}

TEST(CudaDecodeRun10, MatchesRun9) {
  RETROINFER_REQUIRE_GPU();
  run10_case({1, 2, 4, 128, 5000, true, false, true}, 601);   // k_e < 128
  run10_case({3, 2, 8, 64, 9000, true, false, true}, 602);    // batch 3, G 8, d 64
  run10_case({4, 1, 1, 128, 3001, true, false, true}, 603);   // batch 4, G 1
  run10_case({2, 1, 3, 64, 4000, true, true, true}, 604);     // G 3, outliers: list_append in between
  run10_case({1, 4, 1, 128, 2500, false, false, true}, 605);  // no estimation
  run10_case({1, 2, 4, 128, 30, true, false, true}, 606);     // all steady (no clusters: run 9's path)
  run10_case({1, 2, 8, 128, 2700, true, false, true}, 607);   // G 8, d 128
}

TEST(CudaDecodeRun10, MatchesRun9ManyHeads) {
  RETROINFER_REQUIRE_GPU();
  run10_case({16, 2, 4, 128, 3000, true, false, false}, 701);  // batch 16
  run10_case({16, 1, 8, 64, 2100, true, false, false}, 702);   // batch 16, G 8, d 64
  run10_case({1, 4, 8, 64, 16420, true, false, false}, 703);   // C ~ 1025
  run10_case({3, 2, 1, 128, 20011, true, false, false}, 704);  // batch 3, G 1
}

// Run 25: run10s's formation in the selection takes MUFU.EX2 alone for terms whose exponent is >= -126 and __expf's
// own path item by item below. A query scaled up so that most cluster logits fall far (> 87) below their head's
// largest: the exact path is taken for most items, and the scores, ids, lists and outputs stay run10c's bits.
TEST(CudaDecodeRun10, SelectionFormationTinyTerms) {
  RETROINFER_REQUIRE_GPU();
  for (const float gain : {30.0f, 300.0f}) {
    const gputest::PathCase pc{2, 2, 4, 128, 20000, true, false, false};
    SCOPED_TRACE(testing::Message() << "query gain " << gain);
    gputest::PathLayer t = gputest::make_path_layer(pc, 905);
    std::vector<float> q(t.q_elems);
    t.dq.download(q.data(), q.size() * 4);
    for (float& x : q) x *= gain;
    t.dq.upload(q.data(), q.size() * 4);
    EnvGuard env("RETROINFER_DECODE", "run10c");
    const PathResult c = decode_once(t);
    env.set("run10s");
    const PathResult sel = decode_once(t);
    gputest::expect_identical(sel, c, "run10s vs run10c, scaled query");
    // The case must reach the exact path: finite scores below 2^-100 (terms far below the head's largest).
    int tiny = 0, finite = 0;
    for (const auto& hd : c.heads)
      for (const float x : hd.scores) {
        finite += std::isfinite(x) ? 1 : 0;
        tiny += std::isfinite(x) && x < 0x1p-100f ? 1 : 0;
      }
    if (gain > 100.0f) {
      EXPECT_GT(tiny, finite / 10) << "the scaled query leaves too few tiny scores to test the exact path";
    }
    std::printf("[decode run10] selection formation, query gain %.0f: %d of %d finite scores below 2^-100; run10s "
                "identical to run10c%s\n", gain, tiny, finite, ::testing::Test::HasFailure() ? " NOT" : "");
  }
}

// Bench shapes (the one-wave score grid at 6 CTAs per multiprocessor) and > 40K clusters.
TEST(CudaDecodeRun10, MatchesRun9BenchShapes) {
  RETROINFER_REQUIRE_GPU();
  run10_case({1, 8, 4, 128, 131072, true, false, false}, 801);  // Llama-3-8B, 128K, batch 1
  run10_case({4, 8, 4, 128, 131072, true, false, false}, 802);  // 128K, batch 4 (issue #4's shape)
  run10_case({4, 8, 4, 128, 32768, true, false, false}, 803);   // 32K, batch 4
  run10_case({1, 1, 4, 128, 700001, true, false, false}, 804);  // ~43K clusters: the cluster selection
}

}  // namespace
}  // namespace retroinfer
