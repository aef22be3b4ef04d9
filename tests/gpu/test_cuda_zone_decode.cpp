// The decode of the wave index (layer_common.h launch_zone_decode: score, select, exact attention with the
// estimation grid chained behind it, combine) on RetroLayer and WaveBufferLayer, against CPU loops in f64:
//   - the selection equal to the CPU rule on the GPU's scores (decode_path_test_util.h cpu_select);
//   - outputs poisoned before every decode and checked written; for the clustered host-side K/V within the
//     bounds of an f64 reference of the zones the decode selected (exact tokens of the list + estimation from
//     the bf16 value sums);
//   - a second decode, two graph replays (programmatic launches, the chained estimation grid) and an eager
//     decode after them bit-identical to the first decode (nothing left behind between decodes); the
//     stage-timing path (plain launches, events between the stages, phase stamps) bit-identical too;
//   - WaveBufferLayer whose cache holds every cluster (the lookup and gather between the selection and the exact
//     grid, the estimation grid chained behind it): RetroLayer's output bit for bit, also from graph replays;
//   - the exact and estimation kernels' registers and shared memory against the co-residency they are built for.
// Shapes: batch 1/3/4/16/~34, head_dim 64/128, GQA groups 1/3/4/8 (so every score formation of
// layer_common.h: in the selection, in the score grid, by its own grid), estimation chunks with tails
// (k_e < 64, just past 128), score blocks with tails (C ~ 1025), no estimation, outliers (list_append between
// the selection and the attention), all steady (the dense decode), one exact CTA per head with long splits,
// the bench shapes (128K x 8 heads at batch 1 and 4, 32K x 32 heads) and > 40K clusters (the cluster
// selection). One "[zone decode]" line per case.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "decode_path_test_util.h"
#include "gpu_test_util.h"
#include "kernels/kernels.h"
#include "retroinfer/wave_buffer.h"

namespace retroinfer {
namespace {

using gputest::cpu_select;
using gputest::decode_once;
using gputest::PathCase;
using gputest::PathResult;

// Against the f64 reference: f32 arithmetic on identical inputs, the exact part's P carried to 2^-18 by the
// hi/lo split (test_cuda_retro.cpp's tolerances).
constexpr double kNmseVsRef = 1e-9;
constexpr double kMaxAbsVsRef = 1e-4;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// Checks one decode of t (the selection against the CPU rule, the f64 reference where the K/V are on the host,
// repeats, graph replays and the stage path) and prints its line.
void check_layer(gputest::PathLayer& t, const PathCase& pc, const char* what) {
  cuda::RetroLayer& layer = *t.layer;
  const PathResult a = decode_once(t);
  EXPECT_EQ(gputest::compare(a.out, a.out).unwritten, 0);  // every element written (poison is NaN)
  const int C = layer.num_clusters();
  for (int h = 0; h < t.H && C > 0; ++h) {
    SCOPED_TRACE(testing::Message() << "flat head " << h);
    std::vector<int32_t> r_ref, e_ref;
    cpu_select(a.heads[h].scores, layer.n_retrieval(), layer.n_estimation(), r_ref, e_ref);
    EXPECT_EQ(a.heads[h].retrieval_ids, r_ref);
    EXPECT_EQ(a.heads[h].estimation_ids, e_ref);
  }
  gputest::Compare cref;
  if (pc.host_kv) {
    cref = gputest::compare(a.out, gputest::f64_reference(t, a, pc.group, pc.d));
    EXPECT_EQ(cref.unwritten, 0);
    EXPECT_LT(cref.nmse, kNmseVsRef);
    EXPECT_LT(cref.max_abs, kMaxAbsVsRef);
  }
  gputest::expect_identical(decode_once(t), a, "second decode");
  gputest::expect_identical(gputest::expect_graph_replays(t, a.out), a, "eager after graph replays");
  const int n_phase = gputest::expect_stage_path(t, a.out).n_phase;
  std::printf("[zone decode] %s H=%d G=%d d=%d n=%lld C=%d n_r=%d n_e=%d est=%d outliers=%d: selection = CPU rule, "
              "repeats, graph replays and the stage path (%d phase entries) identical%s; vs f64 ref nmse %.2e "
              "max-abs %.2e%s\n",
              what, t.H, pc.group, pc.d, (long long)pc.n, C, layer.n_retrieval(), layer.n_estimation(),
              int(pc.estimation), int(pc.outliers), n_phase, ::testing::Test::HasFailure() ? " (see failures)" : "",
              cref.nmse, cref.max_abs, pc.host_kv ? "" : " (no ref: device K/V)");
}

void zone_case(const PathCase& pc, uint64_t seed) {
  SCOPED_TRACE(gputest::describe(pc, seed));
  gputest::PathLayer t = gputest::make_path_layer(pc, seed);
  check_layer(t, pc, "");
}

TEST(CudaZoneDecode, MatchesCpu) {
  RETROINFER_REQUIRE_GPU();
  zone_case({1, 2, 4, 128, 5000, true, false, true}, 301);   // k_e < 64: one partial estimation CTA
  zone_case({3, 2, 8, 64, 9000, true, false, true}, 302);    // batch 3, G 8, d 64: k_e just past 128
  zone_case({4, 1, 1, 128, 3001, true, false, true}, 303);   // batch 4, G 1
  zone_case({2, 1, 3, 64, 4000, true, true, true}, 304);     // G 3, outliers: list_append in between
  zone_case({1, 4, 1, 128, 2500, false, false, true}, 305);  // no estimation: the exact grid alone
  zone_case({1, 2, 4, 128, 30, true, false, true}, 306);     // 10 indexed < 16 per cluster: all steady (dense)
  zone_case({1, 2, 8, 128, 2700, true, false, true}, 307);   // G 8, d 128
}

TEST(CudaZoneDecode, ManyHeads) {
  RETROINFER_REQUIRE_GPU();
  zone_case({16, 2, 4, 128, 3000, true, false, false}, 401);  // batch 16
  zone_case({16, 1, 8, 64, 2100, true, false, false}, 402);   // batch 16, G 8, d 64
  zone_case({1, 4, 8, 64, 16420, true, false, false}, 403);   // C ~ 1025: a score block of one item
  zone_case({3, 2, 1, 128, 20011, true, false, false}, 404);  // batch 3, G 1
}

// Bench shapes (many exact and estimation CTAs per head) and > 40K clusters.
TEST(CudaZoneDecode, BenchShapes) {
  RETROINFER_REQUIRE_GPU();
  zone_case({1, 8, 4, 128, 131072, true, false, false}, 501);  // Llama-3-8B, 128K, batch 1
  zone_case({4, 8, 4, 128, 131072, true, false, false}, 502);  // 128K, batch 4
  zone_case({4, 8, 4, 128, 32768, true, false, false}, 503);   // 32K, batch 4
  zone_case({1, 1, 4, 128, 700001, true, false, false}, 504);  // ~43K clusters: the cluster selection
}

// One exact CTA per head (H > sm_count() flat heads, so exact_splits caps them at kExactCtasPerSm * sm_count() /
// H = 1) and a retrieval zone of ~30% of the clusters: each warp walks many tiles of a long split, beside the
// estimation CTAs of ~34 sequences. Device random K/V (no f64 reference).
TEST(CudaZoneDecode, OneExactCtaPerHead) {
  RETROINFER_REQUIRE_GPU();
  const int hkv = 4, G = 4, d = 128;
  const int64_t n = 4000;
  const int num_seqs = cuda::detail::sm_count() / hkv + 1;
  const int H = num_seqs * hkv;
  gputest::PathLayer t;
  t.H = H;
  t.q_elems = size_t(H) * G * d;
  const size_t kv_elems = size_t(H) * n * d;
  t.dk = cuda::DeviceBuffer(kv_elems * 2);
  t.dv = cuda::DeviceBuffer(kv_elems * 2);
  t.dq = cuda::DeviceBuffer(t.q_elems * 4);
  cuda::fill_random_bf16(t.dk.as<uint16_t>(), kv_elems, 951, 1.0f);
  cuda::fill_random_bf16(t.dv.as<uint16_t>(), kv_elems, 952, 1.0f);
  cuda::fill_random_f32(t.dq.as<float>(), t.q_elems, 953, 1.0f);
  AttentionConfig cfg;
  cfg.retrieval_fraction = 0.3;
  cfg.estimation_fraction = 0.232;
  t.layer = std::make_unique<cuda::RetroLayer>(AttentionShape{hkv * G, hkv, d}, cfg, num_seqs);
  t.layer->build(t.dk.as<uint16_t>(), t.dv.as<uint16_t>(), n, n);
  ASSERT_GT(t.layer->n_estimation(), 0);
  const PathCase pc{num_seqs, hkv, G, d, n, true, false, false};
  check_layer(t, pc, "one exact CTA per head:");
}

// WaveBufferLayer whose cache holds every cluster, warmed by two steps: each decode reads the same execution
// buffer, through the same launch sequence as RetroLayer with the wave buffer's kernels between the selection
// and the exact grid, so it gives its index's (RetroLayer's) output bit for bit, eagerly and from graph
// replays of the step.
TEST(CudaZoneDecode, WaveBufferHoldingEverythingMatchesRetroLayer) {
  RETROINFER_REQUIRE_GPU();
  const uint64_t seed = 931;
  const int num_seqs = 2, hkv = 2, group = 4, d = 128;
  const int64_t n = 9000;
  AttentionConfig cfg;
  auto kv = gputest::make_kv(num_seqs * hkv, n, n + 5, d, seed);
  auto dk = gputest::upload(kv.k), dv = gputest::upload(kv.v);
  const size_t q_elems = size_t(num_seqs) * hkv * group * d;
  WaveBufferConfig w;
  w.cache_pages = n;  // room for every cluster
  cuda::WaveBufferLayer layer(AttentionShape{hkv * group, hkv, d}, cfg, w, num_seqs);
  layer.build(dk.as<uint16_t>(), dv.as<uint16_t>(), n, n + 5);
  ASSERT_GT(layer.n_estimation(), 0);
  auto dq = gputest::upload(gputest::make_q(kv, group, seed + 1));
  auto run = [&] {
    auto out = gputest::poisoned(q_elems);
    layer.decode(dq.as<float>(), out.as<float>());
    cuda::synchronize();
    layer.wait_manager();
    return gputest::download_f32(out, q_elems);
  };
  run();  // warm-up: every selected cluster admitted (applied at the next step)
  run();
  layer.set_admission(false);  // the cache content stays as it is
  const auto x = run();
  EXPECT_EQ(layer.last_step_counts().miss_clusters, 0);
  EXPECT_EQ(gputest::compare(x, x).unwritten, 0);
  auto ref_out = gputest::poisoned(q_elems);
  layer.index().decode(dq.as<float>(), ref_out.as<float>());
  cuda::synchronize();
  EXPECT_TRUE(same_bits(x, gputest::download_f32(ref_out, q_elems))) << "the wave buffer vs RetroLayer";
  EXPECT_TRUE(same_bits(run(), x)) << "a second step";
  cuda::StreamHandle stream;
  auto dg = gputest::poisoned(q_elems);
  layer.capture_graph(dq.as<float>(), dg.as<float>(), stream.get());
  for (int rep = 0; rep < 2; ++rep) {
    dg.fill_bytes(0xff);
    cuda::synchronize();
    layer.replay_graph(stream.get());
    cuda::synchronize(stream.get());
    layer.wait_manager();
    EXPECT_TRUE(same_bits(gputest::download_f32(dg, q_elems), x)) << "graph replay " << rep;
  }
  std::printf("[zone decode] WaveBufferLayer H=%d G=%d d=%d n=%lld C=%d n_e=%d, cache holding everything: RetroLayer's "
              "output bit for bit, a second step and two graph replays identical%s\n",
              num_seqs * hkv, group, d, (long long)n, layer.num_clusters(), layer.n_estimation(),
              ::testing::Test::HasFailure() ? " NOT (see failures)" : "");
}

// The co-residency the exact and estimation grids are built for (kernels.h exact_grid_footprint; decode.cu
// decode_exact_kernel), at D 128 and G 4 / 8: registers allocated per warp in units of 256 (per thread rounded
// up to a multiple of 8), shared memory with the device's reservation per CTA. The exact kernel at <= 128
// registers and three of its CTAs on a multiprocessor with room for an estimation CTA beside them; the
// estimation kernel at <= 64 registers, eight to a multiprocessor alone. One "[zone decode] footprint" line per
// group.
TEST(CudaZoneDecode, ExactGridFootprint) {
  RETROINFER_REQUIRE_GPU();
  namespace d = cuda::detail;
  auto regs_of = [](int per_thread) { return int64_t{(per_thread + 7) / 8 * 8} * 128; };  // one 128-thread CTA
  for (const int G : {4, 8}) {
    SCOPED_TRACE(testing::Message() << "G " << G);
    d::ExactGridFootprint f;
    ASSERT_EQ(d::exact_grid_footprint(128, G, &f), cudaSuccess);
    auto fits = [&](int exact_ctas, int est_ctas) {
      const int64_t smem = int64_t(exact_ctas) * int64_t(f.exact_smem + f.cta_reserved) +
                           int64_t(est_ctas) * int64_t(f.est_smem + f.cta_reserved);
      const int64_t regs = exact_ctas * regs_of(f.exact_regs) + est_ctas * regs_of(f.est_regs);
      return smem <= int64_t(f.sm_smem) && regs <= f.sm_regs;
    };
    int beside = 0;
    while (beside < 8 && fits(3, beside + 1)) ++beside;
    int alone = 0;
    while (alone < 16 && fits(0, alone + 1)) ++alone;
    std::printf("[zone decode] footprint D=128 G=%d: exact CTA %d registers %zu bytes, estimation CTA %d registers "
                "%zu bytes (+%zu reserved each; %d registers, %zu bytes per SM): three exact CTAs fit=%d, estimation "
                "CTAs beside them %d, alone %d\n",
                G, f.exact_regs, f.exact_smem, f.est_regs, f.est_smem, f.cta_reserved, f.sm_regs, f.sm_smem,
                int(fits(3, 0)), beside, alone);
    EXPECT_LE(f.exact_regs, 128);
    EXPECT_LE(f.est_regs, 64);
    EXPECT_TRUE(fits(3, 0));
    EXPECT_GE(beside, 1);
    EXPECT_GE(alone, 8);
  }
  d::ExactGridFootprint f;
  EXPECT_EQ(d::exact_grid_footprint(96, 4, &f), cudaErrorInvalidValue);
  EXPECT_EQ(d::exact_grid_footprint(128, 9, &f), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace retroinfer
