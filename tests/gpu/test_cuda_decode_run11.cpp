// Run 11's decode path (RETROINFER_DECODE=run11, layer_common.h decode_path: run 9's exact-attention grid
// reshaped, decode.cu decode_run11_kernel: exact splits per head from RETROINFER_RUN11_SPLITS, estimation
// CTAs of RETROINFER_RUN11_EST_CHUNK clusters, the CTA order RETROINFER_RUN11_ORDER, the wide fused merge)
// against run 9 on the same layer and query:
//   - logits, scores, retrieval / estimation ids and token lists bit-identical (run 11 changes only the
//     attention grid);
//   - with run 9's split count and 128-cluster chunks (RETROINFER_RUN11_SPLITS=x1, EST_CHUNK=128; also the
//     defaults) the outputs bit-identical to run 9's in every order (the same terms in the same order: the
//     order only moves CTAs in time, the wide merge keeps the merge's summation order);
//   - every other setting swept below within run 9's bounds against run 8
//     (decode_path_test_util.h kMaxAbsReorder / kNmseReorder: the splits and chunks regroup the same sums);
//   - outputs poisoned before every decode and checked written; two graph replays and an eager decode after
//     them bit-identical to the eager decode; the knobs given in the path name (RETROINFER_DECODE=run11-x1-
//     c128-ohead, run11-n3-c64-oest) as the variables; a bad knob value throws before any launch.
// Shapes: batch 1/3/4/16, head_dim 64/128, GQA groups 1/3/4/8, k_e < 64, < 128 and just past 128, no
// estimation, all steady, 128K x 8 heads, 32K x 32 heads. One "[decode run11]" line per case.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "decode_path_test_util.h"
#include "gpu_test_util.h"
#include "retroinfer/error.h"

namespace retroinfer {
namespace {

using gputest::decode_once;
using gputest::EnvGuard;
using gputest::PathResult;

struct Run11Case {
  int num_seqs, hkv, group, d;
  int64_t n;
  bool estimation;
  bool host_kv;  // clustered K/V from make_kv (small cases); else device random
};

void expect_same_selection(const PathResult& x, const PathResult& ref) {
  ASSERT_EQ(x.heads.size(), ref.heads.size());
  for (size_t h = 0; h < ref.heads.size(); ++h) {
    SCOPED_TRACE(testing::Message() << "flat head " << h);
    EXPECT_EQ(x.heads[h].logits, ref.heads[h].logits);
    EXPECT_EQ(x.heads[h].scores, ref.heads[h].scores);
    EXPECT_EQ(x.heads[h].retrieval_ids, ref.heads[h].retrieval_ids);
    EXPECT_EQ(x.heads[h].estimation_ids, ref.heads[h].estimation_ids);
    EXPECT_EQ(x.heads[h].token_list, ref.heads[h].token_list);
  }
}

// Knob settings of the sweep (nullptr: unset, the default) and whether the output must equal run 9's bits.
struct Knobs {
  const char* splits;
  const char* chunk;
  const char* order;
  bool bit_identical;
};
constexpr Knobs kSweep[] = {
    {"x1", "128", "exact", true},  {"x1", "128", "est", true},   {"x1", "128", "head", true},
    {nullptr, nullptr, nullptr, true},                                // the defaults: x1, 128, exact
    {"x2", "128", "exact", false}, {"x1", "64", "exact", false},  {"x4", "64", "est", false},
    {"x3", "128", "head", false},  {"1", "64", "exact", false},   {"100000", nullptr, nullptr, false},  // clamped
};

void run11_case(const Run11Case& rc, uint64_t seed, bool bad_knob = false) {
  SCOPED_TRACE(testing::Message() << "seqs=" << rc.num_seqs << " hkv=" << rc.hkv << " G=" << rc.group << " d="
                                  << rc.d << " n=" << rc.n << " est=" << rc.estimation << " seed=" << seed);
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
  layer.build(dk.as<uint16_t>(), dv.as<uint16_t>(), rc.n, rc.n);

  EnvGuard env("RETROINFER_DECODE", "run9");
  EnvGuard e_splits("RETROINFER_RUN11_SPLITS", nullptr), e_chunk("RETROINFER_RUN11_EST_CHUNK", nullptr),
      e_order("RETROINFER_RUN11_ORDER", nullptr);
  const PathResult a = decode_once(layer, dq.as<float>(), q_elems, H);
  env.set("run11");
  double worst_nmse = 0.0, worst_abs = 0.0;
  PathResult b;  // the default knobs' result
  for (const Knobs& k : kSweep) {
    SCOPED_TRACE(testing::Message() << "splits=" << (k.splits ? k.splits : "default")
                                    << " chunk=" << (k.chunk ? k.chunk : "default")
                                    << " order=" << (k.order ? k.order : "default"));
    e_splits.set(k.splits);
    e_chunk.set(k.chunk);
    e_order.set(k.order);
    const PathResult x = decode_once(layer, dq.as<float>(), q_elems, H);
    expect_same_selection(x, a);
    const auto c = gputest::compare(x.out, a.out);
    EXPECT_EQ(c.unwritten, 0);
    if (k.bit_identical) {
      for (size_t i = 0; i < a.out.size(); ++i) ASSERT_EQ(x.out[i], a.out[i]) << "output element " << i;
    } else {
      EXPECT_LT(c.max_abs, gputest::kMaxAbsReorder);
      EXPECT_LT(c.nmse, gputest::kNmseReorder);
      worst_nmse = std::max(worst_nmse, c.nmse);
      worst_abs = std::max(worst_abs, c.max_abs);
    }
    if (k.splits == nullptr && k.chunk == nullptr && k.order == nullptr) b = x;
  }
  e_splits.set(nullptr);
  e_chunk.set(nullptr);
  e_order.set(nullptr);
  const auto cb = gputest::compare(b.out, a.out);
  {  // the knobs in the path name (kernel_bench --paths run11-x2-c64 ...)
    SCOPED_TRACE("path-name knobs");
    env.set("run11-x1-c128-ohead");
    const PathResult x = decode_once(layer, dq.as<float>(), q_elems, H);
    expect_same_selection(x, a);
    for (size_t i = 0; i < a.out.size(); ++i) ASSERT_EQ(x.out[i], a.out[i]) << "run11-x1-c128-ohead, element " << i;
    env.set("run11-n3-c64-oest");
    const PathResult y = decode_once(layer, dq.as<float>(), q_elems, H);
    expect_same_selection(y, a);
    const auto c = gputest::compare(y.out, a.out);
    EXPECT_EQ(c.unwritten, 0);
    EXPECT_LT(c.max_abs, gputest::kMaxAbsReorder);
    EXPECT_LT(c.nmse, gputest::kNmseReorder);
    env.set("run11");
  }

  if (bad_knob) {  // rejected before any launch; the next decode is unaffected
    const std::pair<const char*, const char*> bad_values[] = {{"RETROINFER_RUN11_SPLITS", "x9"},
                                                              {"RETROINFER_RUN11_SPLITS", "0"},
                                                              {"RETROINFER_RUN11_EST_CHUNK", "96"},
                                                              {"RETROINFER_RUN11_ORDER", "random"},
                                                              {"RETROINFER_DECODE", "run11-q3"},
                                                              {"RETROINFER_DECODE", "run11-x2-c32"}};
    for (const auto& [name, value] : bad_values) {
      EnvGuard bad(name, value);
      auto dout = gputest::poisoned(q_elems);
      EXPECT_THROW(layer.decode(dq.as<float>(), dout.as<float>()), Error) << name << "=" << value;
      cuda::synchronize();
    }
    const PathResult again = decode_once(layer, dq.as<float>(), q_elems, H);
    for (size_t i = 0; i < b.out.size(); ++i) ASSERT_EQ(again.out[i], b.out[i]) << "after bad knobs, element " << i;
  }

  // Graph replays of run 11 (default knobs): bit-identical to its eager decode, twice (the merge counters
  // reset themselves), and an eager decode after them still matches.
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
  for (size_t i = 0; i < e.out.size(); ++i) ASSERT_EQ(e.out[i], b.out[i]) << "eager after replays, element " << i;

  std::printf("[decode run11] H=%d G=%d d=%d n=%lld C=%d n_e=%d est=%d: ids and lists vs run9 identical%s; "
              "default knobs vs run9 nmse %.2e max-abs %.2e (bit-identical), worst of the other settings nmse "
              "%.2e max-abs %.2e; x1/128 bit-identical in 3 orders; graph replays identical%s\n",
              H, G, d, (long long)rc.n, layer.num_clusters(), layer.n_estimation(), int(rc.estimation),
              ::testing::Test::HasFailure() ? " NOT (see failures)" : "", cb.nmse, cb.max_abs, worst_nmse, worst_abs,
              bad_knob ? "; bad knobs throw" : "");
}

TEST(CudaDecodeRun11, MatchesRun9) {
  RETROINFER_REQUIRE_GPU();
  run11_case({1, 2, 4, 128, 5000, true, true}, 1101, true);  // k_e < 128; bad knobs
  run11_case({3, 2, 8, 64, 9000, true, true}, 1102);         // batch 3, G 8, d 64: k_e just past 128
  run11_case({4, 1, 1, 128, 3001, true, true}, 1103);        // batch 4, G 1
  run11_case({2, 1, 3, 64, 4000, true, true}, 1104);         // G 3
  run11_case({1, 4, 1, 128, 2500, false, true}, 1105);       // no estimation: exact CTAs only
  run11_case({1, 2, 4, 128, 30, true, true}, 1106);          // all steady (dense path, run 11 unused)
  run11_case({1, 2, 8, 128, 2700, true, true}, 1107);        // G 8, d 128
}

TEST(CudaDecodeRun11, MatchesRun9ManyHeads) {
  RETROINFER_REQUIRE_GPU();
  run11_case({16, 2, 4, 128, 3000, true, false}, 1201);  // batch 16
  run11_case({16, 1, 8, 64, 2100, true, false}, 1202);   // batch 16, G 8, d 64
  run11_case({3, 2, 1, 128, 20011, true, false}, 1203);  // batch 3, G 1
}

// Bench shapes: many exact and estimation CTAs counting into one merge, states past the wide merge's
// register-held scalars (> 128 splits per head at x4).
TEST(CudaDecodeRun11, MatchesRun9BenchShapes) {
  RETROINFER_REQUIRE_GPU();
  run11_case({1, 8, 4, 128, 131072, true, false}, 1301);  // Llama-3-8B, 128K, batch 1
  run11_case({4, 8, 4, 128, 131072, true, false}, 1302);  // 128K, batch 4 (the shape)
  run11_case({4, 8, 4, 128, 32768, true, false}, 1303);   // 32K, batch 4
}

}  // namespace
}  // namespace retroinfer
