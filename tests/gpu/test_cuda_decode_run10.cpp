// Run 10's decode path (RETROINFER_DECODE=run10, layer_common.h decode_path: the selection's scores formed by
// the score grid itself after a grid-wide barrier, select.cu form_own_scores, where the one-wave grid fits
// at once; the selection's CSR offsets in shared memory, select_bins.cu kSmemOffsets; the exact attention's
// token-list entries loaded ahead, decode.cu decode_est_ahead_kernel) against run 9 on the same layer and
// query. Run 10 changes where and when values are computed, not how: logits, scores, retrieval / estimation
// ids, token lists and the outputs must all be bit-identical to run 9's (the same expressions in the same
// order; the fused merge is deterministic), and so must each part alone (run10form, run10select,
// run10list). Also: the selection equals the CPU rule on those scores; outputs are
// poisoned before every decode and checked written; two graph replays (a cooperative score kernel with the
// selection as its programmatic dependent) and an eager decode after them bit-identical to the eager
// decode; the stage-timing path (phase stamps) bit-identical, with its phase entries.
// Shapes as test_cuda_decode_run9.cpp: batch 1/3/4/16, head_dim 64/128, GQA groups 1/3/4/8, estimation
// tails, no estimation, outliers, all steady, 128K x 8 heads, 32K x 32 heads, ~700K tokens (> 40K clusters:
// the cluster selection, with run 10's formation). One "[decode run10]" line per case.
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
using gputest::PathResult;

struct Run10Case {
  int num_seqs, hkv, group, d;
  int64_t n;
  bool estimation, outliers;
  bool host_kv;  // clustered K/V from make_kv (small cases); else device random
};

void expect_same_path(const PathResult& x, const PathResult& ref, const char* what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(x.heads.size(), ref.heads.size());
  for (size_t h = 0; h < ref.heads.size(); ++h) {
    SCOPED_TRACE(testing::Message() << "flat head " << h);
    EXPECT_EQ(x.heads[h].logits, ref.heads[h].logits);
    EXPECT_EQ(x.heads[h].scores, ref.heads[h].scores);
    EXPECT_EQ(x.heads[h].retrieval_ids, ref.heads[h].retrieval_ids);
    EXPECT_EQ(x.heads[h].estimation_ids, ref.heads[h].estimation_ids);
    EXPECT_EQ(x.heads[h].token_list, ref.heads[h].token_list);
  }
  ASSERT_EQ(x.out.size(), ref.out.size());
  for (size_t i = 0; i < ref.out.size(); ++i) ASSERT_EQ(x.out[i], ref.out[i]) << what << ": output element " << i;
}

void run10_case(const Run10Case& rc, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "seqs=" << rc.num_seqs << " hkv=" << rc.hkv << " G=" << rc.group << " d="
                                  << rc.d << " n=" << rc.n << " est=" << rc.estimation << " outliers="
                                  << rc.outliers << " seed=" << seed);
  const int H = rc.num_seqs * rc.hkv, G = rc.group, d = rc.d;
  const size_t kv_elems = size_t(H) * rc.n * d, q_elems = size_t(H) * G * d;
  cuda::DeviceBuffer dk, dv, dq;
  if (rc.host_kv) {
    const gputest::KvData kv = gputest::make_kv(H, rc.n, rc.n, d, seed);
    const std::vector<float> q = gputest::make_q(kv, G, seed + 1);
    dk = gputest::upload(kv.k);
    dv = gputest::upload(kv.v);
    dq = gputest::upload(q);
  } else {
    dk = cuda::DeviceBuffer(kv_elems * 2);
    dv = cuda::DeviceBuffer(kv_elems * 2);
    dq = cuda::DeviceBuffer(q_elems * 4);
    cuda::fill_random_bf16(dk.as<uint16_t>(), kv_elems, seed, 1.0f);
    cuda::fill_random_bf16(dv.as<uint16_t>(), kv_elems, seed + 1, 1.0f);
    cuda::fill_random_f32(dq.as<float>(), q_elems, seed + 2, 1.0f);
  }
  AttentionConfig cfg;
  cfg.estimation = rc.estimation;
  if (rc.host_kv) {
    cfg.sink_tokens = 4;
    cfg.window_tokens = 16;
    cfg.segment_tokens = 1024;
  }
  cuda::RetroLayer layer(AttentionShape{rc.hkv * G, rc.hkv, d}, cfg, rc.num_seqs);
  if (rc.outliers) layer.set_outlier_zone(true);
  layer.build(dk.as<uint16_t>(), dv.as<uint16_t>(), rc.n, rc.n);

  EnvGuard env("RETROINFER_DECODE", "run9");
  const PathResult a = decode_once(layer, dq.as<float>(), q_elems, H);
  env.set("run10");
  const PathResult b = decode_once(layer, dq.as<float>(), q_elems, H);
  expect_same_path(b, a, "run10 vs run9");
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
  expect_same_path(decode_once(layer, dq.as<float>(), q_elems, H), a, "run10form vs run9");
  env.set("run10select");
  expect_same_path(decode_once(layer, dq.as<float>(), q_elems, H), a, "run10select vs run9");
  env.set("run10list");
  expect_same_path(decode_once(layer, dq.as<float>(), q_elems, H), a, "run10list vs run9");
  env.set("run10");

  // Graph replays of run 10: bit-identical to its eager decode, twice (the merge counters and the grid
  // barrier reset themselves), and an eager decode after them still matches.
  cuda::StreamHandle stream;
  auto dg = gputest::poisoned(q_elems);
  cuda::CapturedGraph graph(stream.get(), [&] { layer.decode(dq.as<float>(), dg.as<float>(), stream.get()); });
  for (int rep = 0; rep < 2; ++rep) {
    dg.fill_bytes(0xff);
    cuda::synchronize();  // the memset runs on the legacy stream, the graph on a non-blocking one
    graph.launch(stream.get());
    cuda::synchronize(stream.get());
    const auto g = gputest::download_f32(dg, q_elems);
    for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], b.out[i]) << "graph replay " << rep << " element " << i;
  }
  const PathResult e = decode_once(layer, dq.as<float>(), q_elems, H);
  expect_same_path(e, b, "eager after replays");

  // Stage timing (one stream, no programmatic launches) with phase stamps: the same kernels and merge.
  int n_phase = 0;
  {
    EnvGuard phases("RETROINFER_SELECT_PHASES", "1");
    auto ds = gputest::poisoned(q_elems);
    const auto st = layer.decode_stage_ms(dq.as<float>(), ds.as<float>());
    const auto s = gputest::download_f32(ds, q_elems);
    for (size_t i = 0; i < s.size(); ++i) ASSERT_EQ(s[i], b.out[i]) << "stage path, element " << i;
    for (const auto& [name, ms] : st) n_phase += name.rfind("phase.", 0) == 0 ? 1 : 0;
    if (C > 0 && C <= 40 * 1024) {  // the bins kernel stamps
      EXPECT_GT(n_phase, 8);
    }
  }
  std::printf("[decode run10] H=%d G=%d d=%d n=%lld C=%d n_e=%d est=%d outliers=%d: logits, scores, ids, lists "
              "and outputs vs run9 identical%s (run10form, run10select, run10list too); graph replays identical; %d phase "
              "entries\n",
              H, G, d, (long long)rc.n, C, layer.n_estimation(), int(rc.estimation), int(rc.outliers),
              ::testing::Test::HasFailure() ? " NOT (see failures)" : "", n_phase);
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
