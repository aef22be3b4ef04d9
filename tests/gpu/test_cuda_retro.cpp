// RetroLayer::decode and QuestLayer::decode, stage by stage, against CPU loops on the same inputs (the
// GPU's own index, downloaded): cluster logits, scores, zone selection (exact: same rule, same scores),
// token lists, and the merged output (exact zones + estimation) in f64.
#include <gtest/gtest.h>

#include <numeric>

#include "decode_path_test_util.h"
#include "gpu_test_util.h"

namespace retroinfer {
namespace {

using gputest::cpu_select;

// Output tolerances as in test_cuda_dense.cpp (f32 vs f64 arithmetic on identical inputs).
constexpr double kNmse = 1e-9;
constexpr double kMaxAbs = 1e-4;

std::vector<int32_t> steady_tokens(int64_t n, int64_t idx_begin, int64_t n_idx) {
  std::vector<int32_t> s;
  for (int64_t t = 0; t < idx_begin; ++t) s.push_back(int32_t(t));
  for (int64_t t = idx_begin + n_idx; t < n; ++t) s.push_back(int32_t(t));
  return s;
}

struct RetroCase {
  int num_seqs, hkv, group, d;
  int64_t n;
  double retrieval, estimation;
  int seg_tokens;
};

void run_retro_case(const RetroCase& rc, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "seqs=" << rc.num_seqs << " hkv=" << rc.hkv << " group=" << rc.group
                                  << " d=" << rc.d << " n=" << rc.n << " r=" << rc.retrieval << " e="
                                  << rc.estimation << " seed=" << seed);
  const int H = rc.num_seqs * rc.hkv, G = rc.group, d = rc.d;
  auto kv = gputest::make_kv(H, rc.n, rc.n + 3, d, seed);
  auto q = gputest::make_q(kv, G, seed + 1);
  AttentionConfig cfg;
  cfg.sink_tokens = 4;
  cfg.window_tokens = 16;
  cfg.segment_tokens = rc.seg_tokens;
  cfg.retrieval_fraction = rc.retrieval;
  cfg.estimation_fraction = rc.estimation;
  cfg.estimation = rc.estimation > 0;
  cuda::RetroLayer layer(AttentionShape{rc.hkv * G, rc.hkv, d}, cfg, rc.num_seqs);
  auto dk = gputest::upload(kv.k), dv = gputest::upload(kv.v), dq = gputest::upload(q);
  auto dout = gputest::poisoned(q.size());
  layer.build(dk.as<uint16_t>(), dv.as<uint16_t>(), rc.n, rc.n + 3);
  layer.decode(dq.as<float>(), dout.as<float>());
  cuda::synchronize();
  const auto got = gputest::download_f32(dout, q.size());
  const float scale = 1.0f / std::sqrt(float(d));
  std::vector<float> ref(q.size());
  double jacc_cpu_scores = 0;
  for (int h = 0; h < H; ++h) {
    SCOPED_TRACE(testing::Message() << "flat head " << h);
    const auto st = layer.debug_state(h);
    const int C = st.num_clusters;
    const int64_t ib = layer.indexed_begin(), ni = layer.indexed_tokens();
    std::vector<int32_t> tokens = steady_tokens(rc.n, ib, ni);
    std::vector<int32_t> est;
    std::vector<std::vector<double>> logit_ref(G, std::vector<double>(C, -INFINITY));
    if (C > 0) {
      // Logits from the centroids the GPU scores with (int8 copies by default, else bf16).
      EXPECT_EQ(st.centroids_q8.size(), layer.int8_scoring() ? size_t(C) * d : 0);
      for (int g = 0; g < G; ++g)
        for (int c = 0; c < C; ++c) {
          if (st.sizes[c] == 0) {
            EXPECT_EQ(st.logits[size_t(g) * C + c], -INFINITY);
            continue;
          }
          double s = 0, mag = 0;
          for (int i = 0; i < d; ++i) {
            const double x = double(q[(size_t(h) * G + g) * d + i]) * gputest::scored_centroid(st, d, c, i);
            s += x;
            mag += std::abs(x);
          }
          logit_ref[g][c] = s * scale;
          // f32 dot of d terms: error <= d * 2^-24 * sum|x| (with margin).
          EXPECT_NEAR(st.logits[size_t(g) * C + c], logit_ref[g][c], 1e-5 * mag * scale + 1e-6) << "g " << g << " c " << c;
        }
      // Scores from the GPU's logits: sum over the group of softmax over the non-empty clusters.
      std::vector<float> sc_ref(C, -INFINITY);
      std::vector<double> acc(C, 0.0);
      for (int g = 0; g < G; ++g) {
        double mx = -INFINITY, sum = 0;
        for (int c = 0; c < C; ++c) mx = std::max<double>(mx, st.logits[size_t(g) * C + c]);
        for (int c = 0; c < C; ++c)
          if (st.sizes[c] > 0) sum += std::exp(double(st.logits[size_t(g) * C + c]) - mx);
        for (int c = 0; c < C; ++c)
          if (st.sizes[c] > 0) acc[c] += std::exp(double(st.logits[size_t(g) * C + c]) - mx) / sum;
      }
      for (int c = 0; c < C; ++c)
        if (st.sizes[c] > 0) {
          sc_ref[c] = float(acc[c]);
          // __expf vs exp: relative error ~1e-6 per term.
          EXPECT_NEAR(st.scores[c], acc[c], 1e-5 * acc[c] + 1e-7) << "cluster " << c;
        } else {
          EXPECT_EQ(st.scores[c], -INFINITY);
        }
      // Selection from the GPU's scores: exactly the CPU rule.
      std::vector<int32_t> r_ref, e_ref;
      cpu_select(st.scores, layer.n_retrieval(), layer.n_estimation(), r_ref, e_ref);
      EXPECT_EQ(st.retrieval_ids, r_ref);
      EXPECT_EQ(st.estimation_ids, e_ref);
      // Selection from the CPU's own scores: may differ only at near-ties (scores within ~1e-5).
      std::vector<int32_t> r_cpu, e_cpu;
      cpu_select(sc_ref, layer.n_retrieval(), layer.n_estimation(), r_cpu, e_cpu);
      jacc_cpu_scores = std::max(jacc_cpu_scores, gputest::jaccard_distance(r_cpu, st.retrieval_ids));
      // Token list: steady zone, then the retrieval clusters' members in cluster-id order.
      for (int32_t c : st.retrieval_ids)
        for (int i = st.offsets[c]; i < st.offsets[c + 1]; ++i) tokens.push_back(int32_t(ib + st.members[i]));
      est = st.estimation_ids;
    }
    EXPECT_EQ(st.token_list, tokens);
    // Output: exact zones + estimation (logit q.c_bf16 * scale, weight = size, value = bf16 value sum).
    for (int g = 0; g < G; ++g) {
      gputest::RefState rs(d);
      const float* qq = &q[(size_t(h) * G + g) * d];
      gputest::ref_exact(kv, qq, scale, h, tokens, rs);
      std::vector<float> vsum(d);
      for (int32_t c : est) {
        for (int i = 0; i < d; ++i) vsum[i] = bf16_to_f32(st.value_sums_bf16[size_t(c) * d + i]);
        rs.push(logit_ref[g][c], double(st.sizes[c]), vsum.data(), d);
      }
      rs.finish(&ref[(size_t(h) * G + g) * d], d);
    }
  }
  const auto c = gputest::compare(got, ref);
  EXPECT_EQ(c.unwritten, 0);
  EXPECT_LT(c.nmse, kNmse);
  EXPECT_LT(c.max_abs, kMaxAbs);
  std::printf("[retro parity] n=%lld d=%d G=%d: nmse %.2e max-abs %.2e, retrieval Jaccard vs CPU-score selection %.3f\n",
              (long long)rc.n, d, G, c.nmse, c.max_abs, jacc_cpu_scores);
  // Near-ties aside, the CPU's scores select the same clusters.
  EXPECT_LT(jacc_cpu_scores, 0.1);
}

TEST(CudaRetro, StagesMatchCpu) {
  RETROINFER_REQUIRE_GPU();
  run_retro_case({2, 2, 4, 128, 2000, 0.1, 0.3, 512}, 11);
  run_retro_case({1, 2, 8, 64, 1537, 0.05, 0.5, 256}, 12);
  run_retro_case({1, 4, 1, 128, 3001, 0.2, 0.0, 1024}, 13);
  run_retro_case({2, 1, 3, 64, 700, 0.02, 0.2, 8192}, 14);
}

TEST(CudaRetro, TailsAroundTheSteadyZone) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 40;
  for (int64_t n : {1, 3, 7, 8, 9, 15, 16, 17, 20, 21, 31, 33, 127, 128, 129})
    run_retro_case({1, 2, 4, 64, n, 0.25, 0.25, 64}, seed++);
}

// Exactness invariant (DESIGN.md §2): retrieval over all clusters with no estimation is dense attention.
TEST(CudaRetro, AllClustersRetrievedIsDense) {
  RETROINFER_REQUIRE_GPU();
  const int H = 2, G = 4, d = 128;
  const int64_t n = 3000;
  auto kv = gputest::make_kv(H, n, n, d, 77);
  auto q = gputest::make_q(kv, G, 78);
  AttentionConfig cfg;
  cfg.retrieval_fraction = 1.0;
  cfg.estimation = false;
  cfg.segment_tokens = 1024;
  cuda::RetroLayer layer(AttentionShape{H * G, H, d}, cfg);
  cuda::DenseDecoder dense(AttentionShape{H * G, H, d}, 1, n);
  auto dk = gputest::upload(kv.k), dv = gputest::upload(kv.v), dq = gputest::upload(q);
  auto o1 = gputest::poisoned(q.size()), o2 = gputest::poisoned(q.size());
  layer.build(dk.as<uint16_t>(), dv.as<uint16_t>(), n, n);
  layer.decode(dq.as<float>(), o1.as<float>());
  dense.run(dq.as<float>(), dk.as<uint16_t>(), dv.as<uint16_t>(), n, n, 0.0f, o2.as<float>());
  cuda::synchronize();
  const auto c = gputest::compare(gputest::download_f32(o1, q.size()), gputest::download_f32(o2, q.size()));
  EXPECT_EQ(c.unwritten, 0);
  EXPECT_LT(c.nmse, kNmse);  // same tokens, different order of summation
  EXPECT_EQ(layer.debug_state(0).token_list.size(), size_t(n));
}

// A decode captured into a CUDA graph replays the same kernels on the same inputs: bit-identical output.
TEST(CudaRetro, GraphReplayMatchesEager) {
  RETROINFER_REQUIRE_GPU();
  const int H = 2, G = 4, d = 128;
  const int64_t n = 5000;
  auto kv = gputest::make_kv(H, n, n, d, 91);
  auto q = gputest::make_q(kv, G, 92);
  AttentionConfig cfg;
  cfg.segment_tokens = 1024;
  cuda::RetroLayer layer(AttentionShape{H * G, H, d}, cfg);
  auto dk = gputest::upload(kv.k), dv = gputest::upload(kv.v), dq = gputest::upload(q);
  auto o1 = gputest::poisoned(q.size()), o2 = gputest::poisoned(q.size());
  layer.build(dk.as<uint16_t>(), dv.as<uint16_t>(), n, n);
  layer.decode(dq.as<float>(), o1.as<float>());
  cuda::synchronize();
  cuda::StreamHandle stream;
  cuda::CapturedGraph graph(stream.get(), [&] { layer.decode(dq.as<float>(), o2.as<float>(), stream.get()); });
  graph.launch(stream.get());
  cuda::synchronize(stream.get());
  const auto a = gputest::download_f32(o1, q.size()), b = gputest::download_f32(o2, q.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "element " << i;
}

void run_quest_case(int hkv, int G, int d, int64_t n, int64_t budget, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "quest hkv=" << hkv << " G=" << G << " d=" << d << " n=" << n << " budget="
                                  << budget << " seed=" << seed);
  auto kv = gputest::make_kv(hkv, n, n, d, seed);
  auto q = gputest::make_q(kv, G, seed + 1);
  AttentionConfig cfg;
  cfg.sink_tokens = 4;
  cfg.window_tokens = 16;
  cfg.budget_tokens = budget;
  cuda::QuestLayer layer(AttentionShape{hkv * G, hkv, d}, cfg);
  auto dk = gputest::upload(kv.k), dv = gputest::upload(kv.v), dq = gputest::upload(q);
  auto dout = gputest::poisoned(q.size());
  layer.build(dk.as<uint16_t>(), dv.as<uint16_t>(), n, n);
  layer.decode(dq.as<float>(), dout.as<float>());
  const auto got = gputest::download_f32(dout, q.size());
  const int64_t ib = std::min<int64_t>(4, n), ie = std::max<int64_t>(ib, n - 16), ni = ie - ib;
  const int P = int((ni + 15) / 16);
  ASSERT_EQ(layer.num_pages(), P);
  std::vector<float> ref(q.size());
  const float scale = 1.0f / std::sqrt(float(d));
  for (int h = 0; h < hkv; ++h) {
    std::vector<int32_t> tokens = steady_tokens(n, ib, ni);
    if (P > 0) {
      const auto sc = layer.page_scores(h);
      for (int p = 0; p < P; ++p) {
        double best = -INFINITY, mag = 0;
        for (int g = 0; g < G; ++g) {
          double s = 0;
          for (int i = 0; i < d; ++i) {
            float lo = INFINITY, hi = -INFINITY;
            for (int64_t t = ib + 16 * p; t < std::min<int64_t>(ie, ib + 16 * p + 16); ++t) {
              lo = std::min(lo, kv.key(h, t, i));
              hi = std::max(hi, kv.key(h, t, i));
            }
            const double qi = q[(size_t(h) * G + g) * d + i];
            s += std::max(qi * lo, qi * hi);
            mag += std::abs(qi) * std::max(std::abs(lo), std::abs(hi));
          }
          best = std::max(best, s);
        }
        EXPECT_NEAR(sc[p], best, 1e-5 * mag + 1e-6) << "page " << p;
      }
      std::vector<int32_t> r, e;
      cpu_select(sc, layer.selected_pages(), 0, r, e);
      for (int32_t p : r)
        for (int64_t t = ib + 16 * p; t < std::min<int64_t>(ie, ib + 16 * p + 16); ++t) tokens.push_back(int32_t(t));
    }
    EXPECT_EQ(layer.token_list(h), tokens);
    for (int g = 0; g < G; ++g) {
      gputest::RefState rs(d);
      gputest::ref_exact(kv, &q[(size_t(h) * G + g) * d], scale, h, tokens, rs);
      rs.finish(&ref[(size_t(h) * G + g) * d], d);
    }
  }
  const auto c = gputest::compare(got, ref);
  EXPECT_EQ(c.unwritten, 0);
  EXPECT_LT(c.nmse, kNmse);
  EXPECT_LT(c.max_abs, kMaxAbs);
}

TEST(CudaQuest, PagesSelectionAndOutput) {
  RETROINFER_REQUIRE_GPU();
  run_quest_case(2, 4, 128, 2000, 160, 5);
  run_quest_case(1, 8, 64, 1001, 40, 6);
  run_quest_case(2, 1, 64, 2000, 100000, 8);  // budget above the context: every page, i.e. dense
  uint64_t seed = 60;
  for (int64_t n : {1, 3, 7, 8, 9, 15, 16, 17, 20, 21, 31, 33, 127, 128, 129}) run_quest_case(1, 2, 64, n, 32, seed++);
}

}  // namespace
}  // namespace retroinfer
