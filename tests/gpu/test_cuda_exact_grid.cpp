// The variants of run 9's exact + estimation grid (RETROINFER_EXACT, kernels.h ExactVariant; decode.cu
// decode_exact_kernel / estimate_chained_kernel) against v1 (run 9's one grid; split64 is the default since
// run 16) on the same layer and query, switched in one process:
//   - split    (the estimation CTAs as a second grid chained behind the exact one, the same 128-cluster
//              chunks and code): selection and outputs bit-identical to v1;
//   - split64  (64-cluster estimation CTAs): selection identical, outputs within the reordering bounds of
//              decode_path_test_util.h (max-abs 5e-5, nmse 1e-10: the chunk maxima differ, as run 8 vs run 9);
//   - every output poisoned before the decode and checked written; two graph replays and an eager decode
//     after them bit-identical to the variant's eager decode (the merge counters reset themselves across
//     two grids); the stage-timing path (plain launches, one grid after the other) bit-identical; v1 again
//     afterwards bit-identical to its first decode (no state left behind);
//   - WaveBufferLayer (the same launch sequence with the wave buffer's kernels between the selection and the
//     attention: the exact grid launched plainly, the estimation grid chained to it) under each variant
//     against v1, and its graph replay;
//   - unknown values throw retroinfer::Error (at the decode and from exact_variant_from_env);
//   - run 17's variants (split64r / i / ri / rh / rih / e / eri: register cap, token ids ahead, half-staged
//     estimation CTAs, estimation grid first; kernels.h): selection identical, outputs bit-identical to
//     split64's (the same chunks, tiles and arithmetic; the fused merge sums in slot order), graph replays
//     and the stage path bit-identical, and, for the clustered host-side K/V, within the f64 reference's
//     bounds (test_cuda_decode_run9.cpp's); a case with one exact CTA per head and > 8 tiles per warp (the
//     ids reloaded batch by batch); the kernels' footprints (registers, shared memory) against the
//     co-residency each variant is built for;
//   - the pre-merging variants (split64ep / erp: the estimation states merged into one by each head's last
//     estimation CTA, kernels.h EstPremerge): selection identical, outputs within the reordering bounds of
//     split64's (another merge tree), bit-identical to each other, between repeats, across graph replays (the
//     estimation counters reset themselves) and on the stage path; at 128K batch 4 some output must differ from
//     split64's (the pre-merge ran).
// Shapes: batch 1/3/4/16/~50, head_dim 64/128, GQA groups 1/3/4/8, n_e < 128 and just past 128, no
// estimation, all steady, outliers, 32K x 32 heads, 128K x 8 heads and 128K x 32 heads (batch 4). One
// "[exact grid]" line per case.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>

#include "kernels/kernels.h"
#include "attention/cuda/layer_common.h"
#include "decode_path_test_util.h"
#include "gpu_test_util.h"
#include "retroinfer/error.h"
#include "retroinfer/wave_buffer.h"

namespace retroinfer {
namespace {

using gputest::decode_once;
using gputest::EnvGuard;
using gputest::PathCase;
using gputest::f64_reference;
using gputest::PathResult;

// split64 vs v1: the same selection and exact tokens, estimation chunks of 64 instead of 128 clusters (the
// same difference as run 8 vs run 9; bounds and derivation in decode_path_test_util.h).
constexpr double kMaxAbsVsV1 = gputest::kMaxAbsReorder;
constexpr double kNmseVsV1 = gputest::kNmseReorder;
// Against the f64 reference (test_cuda_decode_run9.cpp's tolerances: f32 arithmetic on identical inputs, the
// exact part's P carried to 2^-18 by the hi/lo split).
constexpr double kNmseVsRef = 1e-9;
constexpr double kMaxAbsVsRef = 1e-4;
// Run 17's variants: each must give split64's output bit for bit.
constexpr const char* kRun17[] = {"split64r",  "split64i",  "split64ri", "split64rh",
                                  "split64rih", "split64e", "split64eri"};
// The pre-merging variants (kernels.h EstPremerge): the estimation states merged into one by the head's last
// estimation CTA, then the final merge over num_splits + 1 states. Against split64 (the same partial states, every
// state weighted against one global max) only the merge tree differs: an estimation weight is e^{m_s - M_e}
// e^{M_e - M} instead of e^{m_s - M} (two f32 exponent arguments and one more product: ~1.2e-6 relative per weight
// at |logit| <= ~20, as (1) of decode_path_test_util.h) and the states are added in another order (~S * 2^-24
// relative for S states, (2) there), so decode_path_test_util.h's reordering bounds apply (max-abs 5e-5, nmse
// 1e-10). split64ep and split64erp have the same partial states (the exact kernels differ in registers only) and
// the same merge tree: bit-identical to each other, and each bit-identical between repeats and graph replays.
constexpr const char* kPremerged[] = {"split64ep", "split64erp"};
constexpr double kMaxAbsPremerge = gputest::kMaxAbsReorder;
constexpr double kNmsePremerge = gputest::kNmseReorder;

void expect_same_selection(const PathResult& x, const PathResult& ref, const char* what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(x.heads.size(), ref.heads.size());
  for (size_t h = 0; h < ref.heads.size(); ++h) {
    SCOPED_TRACE(testing::Message() << "flat head " << h);
    EXPECT_EQ(x.heads[h].scores, ref.heads[h].scores);
    EXPECT_EQ(x.heads[h].retrieval_ids, ref.heads[h].retrieval_ids);
    EXPECT_EQ(x.heads[h].estimation_ids, ref.heads[h].estimation_ids);
    EXPECT_EQ(x.heads[h].token_list, ref.heads[h].token_list);
  }
}

// First differing element, or -1.
int64_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0) return int64_t(i);
  return -1;
}

// A variant's decode x: with host K/V within the f64 reference's bounds; graph replays and the stage path
// bit-identical to it.
void expect_reference_and_replays(gputest::PathLayer& t, const PathCase& rc, const PathResult& x) {
  if (rc.host_kv) {
    const auto cr = gputest::compare(x.out, f64_reference(t, x, rc.group, rc.d));
    EXPECT_LT(cr.nmse, kNmseVsRef);
    EXPECT_LT(cr.max_abs, kMaxAbsVsRef);
  }
  gputest::expect_graph_replays(t, x.out);
  gputest::expect_stage_path(t, x.out);
}

// Run 17's variants against split64's decode `s64` (taken with `v1` as the selection reference): selection
// identical, outputs bit-identical and written, graph replays and the stage path; with host K/V also against
// the f64 reference. Returns the number of variants that matched bit for bit.
int run17_variants(gputest::PathLayer& t, const PathCase& rc, EnvGuard& env, const PathResult& v1,
                   const PathResult& s64) {
  int identical = 0;
  for (const char* name : kRun17) {
    SCOPED_TRACE(name);
    env.set(name);
    const PathResult x = decode_once(t);
    expect_same_selection(x, v1, name);
    EXPECT_EQ(gputest::compare(x.out, x.out).unwritten, 0);
    const int64_t diff = first_difference(x.out, s64.out);
    EXPECT_EQ(diff, -1) << name << " must give split64's output bit for bit";
    identical += diff == -1;
    expect_reference_and_replays(t, rc, x);
  }
  return identical;
}

// The pre-merging variants against split64's decode `s64` (v1: the selection reference): selection identical,
// outputs written and within the reordering bounds of s64, a repeat, two graph replays and the stage path
// bit-identical to the variant's first decode, split64ep and split64erp bit-identical to each other; with host
// K/V also the f64 reference's bounds.
struct PremergeStats {
  int within = 0;           // variants within the bounds of split64 and bit-identical on repeats
  int64_t differing = 0;    // output elements of split64ep that differ from split64's (> 0: the pre-merge ran)
  double nmse = 0.0, max_abs = 0.0;  // the worst over the variants, against split64
};
PremergeStats premerge_variants(gputest::PathLayer& t, const PathCase& rc, EnvGuard& env, const PathResult& v1,
                                const PathResult& s64) {
  // The pre-merge counts into the fused merge: run 10's path (the default merges by combine_states since run 17).
  EnvGuard path("RETROINFER_DECODE", "run10");
  PremergeStats st;
  std::vector<float> first;
  for (const char* name : kPremerged) {
    SCOPED_TRACE(name);
    env.set(name);
    const PathResult x = decode_once(t);
    expect_same_selection(x, v1, name);
    const auto c = gputest::compare(x.out, s64.out);
    EXPECT_EQ(c.unwritten, 0);
    EXPECT_LT(c.max_abs, kMaxAbsPremerge);
    EXPECT_LT(c.nmse, kNmsePremerge);
    st.nmse = std::max(st.nmse, c.nmse);
    st.max_abs = std::max(st.max_abs, c.max_abs);
    const PathResult again = decode_once(t);
    const int64_t repeat = first_difference(again.out, x.out);
    EXPECT_EQ(repeat, -1) << name << " must repeat bit for bit";
    if (first.empty()) {
      first = x.out;
      for (size_t i = 0; i < x.out.size(); ++i) st.differing += std::memcmp(&x.out[i], &s64.out[i], 4) != 0;
    } else {
      EXPECT_EQ(first_difference(x.out, first), -1) << name << " vs " << kPremerged[0];
    }
    st.within += c.unwritten == 0 && c.max_abs < kMaxAbsPremerge && c.nmse < kNmsePremerge && repeat == -1;
    expect_reference_and_replays(t, rc, x);
  }
  return st;
}

PremergeStats exact_grid_case(const PathCase& rc, uint64_t seed) {
  SCOPED_TRACE(gputest::describe(rc, seed));
  gputest::PathLayer t = gputest::make_path_layer(rc, seed);
  cuda::RetroLayer& layer = *t.layer;

  EnvGuard env("RETROINFER_EXACT", "v1");
  const PathResult a = decode_once(t);
  EXPECT_EQ(gputest::compare(a.out, a.out).unwritten, 0);  // every element written (poison is NaN)

  env.set("split");
  const PathResult b = decode_once(t);
  expect_same_selection(b, a, "split vs v1");
  const auto cb = gputest::compare(b.out, a.out);
  EXPECT_EQ(cb.unwritten, 0);
  EXPECT_EQ(first_difference(b.out, a.out), -1) << "split must give v1's output bit for bit";
  gputest::expect_graph_replays(t, b.out);
  gputest::expect_stage_path(t, b.out);

  env.set("split64");
  const PathResult c = decode_once(t);
  expect_same_selection(c, a, "split64 vs v1");
  const auto cc = gputest::compare(c.out, a.out);
  EXPECT_EQ(cc.unwritten, 0);
  EXPECT_LT(cc.max_abs, kMaxAbsVsV1);
  EXPECT_LT(cc.nmse, kNmseVsV1);
  gputest::expect_graph_replays(t, c.out);
  gputest::expect_stage_path(t, c.out);
  gputest::Compare cref;  // split64 vs the f64 reference (host K/V only)
  if (rc.host_kv) {
    cref = gputest::compare(c.out, f64_reference(t, c, rc.group, rc.d));
    EXPECT_LT(cref.nmse, kNmseVsRef);
    EXPECT_LT(cref.max_abs, kMaxAbsVsRef);
  }
  const int run17_identical = run17_variants(t, rc, env, a, c);
  const PremergeStats pm = premerge_variants(t, rc, env, a, c);

  env.set("v1");  // back to v1 in the same process: its first output again
  const PathResult a2 = decode_once(t);
  EXPECT_EQ(first_difference(a2.out, a.out), -1) << "v1 after the split variants";
  env.set(nullptr);  // unset: the default (kExactDefault)
  const PathResult d = decode_once(t);
  if (cuda::detail::kExactDefault == cuda::detail::kExactV1) {
    EXPECT_EQ(first_difference(d.out, a.out), -1) << "the unset default";
  }
  const int n_e = layer.n_estimation();
  std::printf("[exact grid] H=%d G=%d d=%d n=%lld C=%d n_e=%d est=%d outliers=%d: split vs v1 identical=%d; "
              "split64 vs v1 nmse %.2e max-abs %.2e; split64 vs f64 ref nmse %.2e max-abs %.2e%s; run17 variants "
              "identical to split64 %d/%d; pre-merged (ep, erp) within bounds + repeatable %d/%d, vs split64 nmse "
              "%.2e max-abs %.2e, %lld of %zu elements differ; graph replays + stage path identical per variant; "
              "est CTAs per head v1/split %d split64* %d\n",
              t.H, rc.group, rc.d, (long long)rc.n, layer.num_clusters(), n_e, int(rc.estimation),
              int(rc.outliers), int(first_difference(b.out, a.out) == -1), cc.nmse, cc.max_abs, cref.nmse,
              cref.max_abs, rc.host_kv ? "" : " (no ref: device K/V)", run17_identical, int(std::size(kRun17)),
              pm.within, int(std::size(kPremerged)), pm.nmse, pm.max_abs, (long long)pm.differing, c.out.size(),
              n_e > 0 ? (n_e + 127) / 128 : 0, n_e > 0 ? (n_e + 63) / 64 : 0);
  return pm;
}

TEST(CudaExactGrid, VariantsMatchV1) {
  RETROINFER_REQUIRE_GPU();
  exact_grid_case({1, 2, 4, 128, 5000, true, false, true}, 901);   // n_e < 128: one v1 CTA, split64 two
  exact_grid_case({3, 2, 8, 64, 9000, true, false, true}, 902);    // batch 3, G 8, d 64: n_e just past 128
  exact_grid_case({4, 1, 1, 128, 3001, true, false, true}, 903);   // batch 4, G 1
  exact_grid_case({2, 1, 3, 64, 4000, true, true, true}, 904);     // G 3, outliers: list_append in between
  exact_grid_case({1, 4, 1, 128, 2500, false, false, true}, 905);  // no estimation: the exact grid only
  exact_grid_case({1, 2, 4, 128, 30, true, false, true}, 906);     // all steady (dense path, grid unused)
  exact_grid_case({1, 2, 8, 128, 2700, true, false, true}, 907);   // G 8, d 128
}

TEST(CudaExactGrid, VariantsMatchV1ManyHeads) {
  RETROINFER_REQUIRE_GPU();
  exact_grid_case({16, 2, 4, 128, 3000, true, false, false}, 911);  // batch 16
  exact_grid_case({16, 1, 8, 64, 2100, true, false, false}, 912);   // batch 16, G 8, d 64
  exact_grid_case({4, 8, 4, 128, 32768, true, false, false}, 913);  // 32K x 32 heads (batch 4)
}

TEST(CudaExactGrid, VariantsMatchV1At128K) {
  RETROINFER_REQUIRE_GPU();
  exact_grid_case({1, 8, 4, 128, 131072, true, false, false}, 921);  // Llama-3-8B, 128K x 8 heads
  // 128K batch 4: issue #4's shape. 16,384 outputs from 12 exact + 30 estimation states per head: under another
  // merge tree some of them round differently, so split64ep must differ from split64 somewhere, else the
  // pre-merge did not run (the variant fell back to split64e, which is split64 bit for bit).
  const PremergeStats pm = exact_grid_case({4, 8, 4, 128, 131072, true, false, false}, 922);
  EXPECT_GT(pm.differing, 0) << "split64ep gave split64's output bit for bit: was the pre-merge skipped?";
}

// One exact CTA per head (H > decode_ctas_per_sm() * sm_count() / 2 flat heads, so decode_splits gives 1) and
// a retrieval zone of ~30% of the clusters: each warp walks > 8 tiles, so split64i / ri / eri reload the
// warp's ids (8 tiles per batch) at least once, with tails. Device random K/V (no f64 reference): run 17's
// variants bit-identical to split64, graph replays included.
TEST(CudaExactGrid, Run17VariantsManyTilesPerWarp) {
  RETROINFER_REQUIRE_GPU();
  const int hkv = 4, G = 4, d = 128;
  const int64_t n = 4000;
  const int per_sm = cuda::detail::decode_ctas_per_sm(), sms = cuda::detail::sm_count();
  const int num_seqs = (per_sm * sms / 2) / hkv + 1;  // H = 4 * num_seqs > per_sm * sms / 2
  const int H = num_seqs * hkv;
  const int splits = std::max(1, per_sm * sms / H);  // decode_splits' bound (waves = 1)
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

  EnvGuard env("RETROINFER_EXACT", "v1");
  const PathResult a = decode_once(t);
  env.set("split64");
  const PathResult c = decode_once(t);
  expect_same_selection(c, a, "split64 vs v1");
  EXPECT_EQ(gputest::compare(c.out, c.out).unwritten, 0);
  size_t most = 0;
  for (const auto& hs : a.heads) most = std::max(most, hs.token_list.size());
  const int64_t tiles_per_warp = (int64_t(most) / splits + 63) / 64;  // tiles of 16 over 4 warps
  ASSERT_GT(tiles_per_warp, 8) << "the case must reload the ids: " << most << " tokens, " << splits << " splits";
  const PathCase rc{num_seqs, hkv, G, d, n, true, false, false};
  const int identical = run17_variants(t, rc, env, a, c);
  const PremergeStats pm = premerge_variants(t, rc, env, a, c);
  std::printf("[exact grid] many tiles per warp: H=%d G=%d d=%d n=%lld C=%d n_e=%d, <= %d splits, longest list %zu "
              "(~%lld tiles per warp): run17 variants identical to split64 %d/%d; pre-merged within bounds + "
              "repeatable %d/%d (nmse %.2e max-abs %.2e, %lld elements differ)\n",
              H, G, d, (long long)n, t.layer->num_clusters(), t.layer->n_estimation(), splits, most,
              (long long)tiles_per_warp, identical, int(std::size(kRun17)), pm.within, int(std::size(kPremerged)),
              pm.nmse, pm.max_abs, (long long)pm.differing);
}

// WaveBufferLayer: a cache that holds every cluster, warmed by one step, so each decode reads the same
// execution buffer; each variant against v1 (split bit-identical, split64 within the bounds), then a graph
// of the step captured under split64 replayed twice, equal to its direct decode.
TEST(CudaExactGrid, WaveBufferLayerUnderEachVariant) {
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
  EnvGuard env("RETROINFER_EXACT", "v1");
  auto run = [&](const char* variant) {
    env.set(variant);
    auto out = gputest::poisoned(q_elems);
    layer.decode(dq.as<float>(), out.as<float>());
    cuda::synchronize();
    layer.wait_manager();
    return gputest::download_f32(out, q_elems);
  };
  run("v1");  // warm-up: every selected cluster admitted (applied at the next step)
  run("v1");
  layer.set_admission(false);  // the cache content stays as it is
  const auto v1 = run("v1");
  EXPECT_EQ(layer.last_step_counts().miss_clusters, 0);
  const auto s = run("split");
  const auto s64 = run("split64");
  int run17_identical = 0;
  for (const char* name : kRun17) {
    const auto x = run(name);
    EXPECT_EQ(first_difference(x, s64), -1) << name << " vs split64";
    run17_identical += first_difference(x, s64) == -1;
  }
  std::vector<std::vector<float>> pre;  // kPremerged's outputs
  int pre_within = 0;
  for (const char* name : kPremerged) {
    pre.push_back(run(name));
    const auto cp = gputest::compare(pre.back(), s64);
    EXPECT_EQ(cp.unwritten, 0) << name;
    EXPECT_LT(cp.max_abs, kMaxAbsPremerge) << name;
    EXPECT_LT(cp.nmse, kNmsePremerge) << name;
    const int64_t repeat = first_difference(run(name), pre.back());
    EXPECT_EQ(repeat, -1) << name << " repeated";
    EXPECT_EQ(first_difference(pre.back(), pre.front()), -1) << name << " vs " << kPremerged[0];
    pre_within += cp.unwritten == 0 && cp.max_abs < kMaxAbsPremerge && cp.nmse < kNmsePremerge && repeat == -1;
  }
  EXPECT_EQ(gputest::compare(v1, v1).unwritten, 0);
  EXPECT_EQ(first_difference(s, v1), -1) << "split vs v1";
  const auto c64 = gputest::compare(s64, v1);
  EXPECT_EQ(c64.unwritten, 0);
  EXPECT_LT(c64.max_abs, kMaxAbsVsV1);
  EXPECT_LT(c64.nmse, kNmseVsV1);
  EXPECT_EQ(first_difference(run("v1"), v1), -1) << "v1 again";

  // Graphs of the step under split64, split64eri and the pre-merging variants (the estimation grid launched
  // plainly after the wave buffer's kernels, the exact grid chained to it), each replayed twice: split64's output,
  // or the pre-merging variant's eager output.
  for (const char* name : {"split64", "split64eri", "split64ep", "split64erp"}) {
    const bool premerged = std::string(name) == "split64ep" || std::string(name) == "split64erp";
    const std::vector<float>& expected = premerged ? pre[std::string(name) == "split64ep" ? 0 : 1] : s64;
    env.set(name);
    cuda::StreamHandle stream;
    auto dg = gputest::poisoned(q_elems);
    layer.capture_graph(dq.as<float>(), dg.as<float>(), stream.get());
    for (int rep = 0; rep < 2; ++rep) {
      dg.fill_bytes(0xff);
      cuda::synchronize();
      layer.replay_graph(stream.get());
      cuda::synchronize(stream.get());
      layer.wait_manager();
      EXPECT_EQ(first_difference(gputest::download_f32(dg, q_elems), expected), -1) << name << " graph replay " << rep;
    }
  }
  std::printf("[exact grid] WaveBufferLayer H=%d G=%d d=%d n=%lld C=%d n_e=%d: split vs v1 identical=%d; split64 vs "
              "v1 nmse %.2e max-abs %.2e; run17 variants identical to split64 %d/%d; pre-merged within bounds + "
              "repeatable %d/%d; split64, split64eri, split64ep and split64erp graph replays identical\n",
              num_seqs * hkv, group, d, (long long)n, layer.num_clusters(), layer.n_estimation(),
              int(first_difference(s, v1) == -1), c64.nmse, c64.max_abs, run17_identical, int(std::size(kRun17)),
              pre_within, int(std::size(kPremerged)));
}

// The footprints the run 17 variants are built on (kernels.h exact_grid_footprint; decode.cu "Run 17
// exact-grid variants"), at the 128K batch 4 shape (D 128, G 4, 12 exact + 30 estimation states per head) and
// G 8, with the default two stages: how many estimation CTAs fit on a multiprocessor beside three exact CTAs
// (registers allocated per warp in units of 256, i.e. per thread rounded up to a multiple of 8; shared
// memory with the device's reservation per CTA). r / ri / eri / erp: the exact kernel at <= 128 registers and one
// estimation CTA beside three exact ones; rh / rih: two at G <= 4; every 64-cluster estimation kernel: eight
// to a multiprocessor alone. One "[exact grid] footprint" line per variant and group.
TEST(CudaExactGrid, Run17Footprints) {
  RETROINFER_REQUIRE_GPU();
  namespace d = cuda::detail;
  auto regs_of = [](int per_thread) { return int64_t{(per_thread + 7) / 8 * 8} * 128; };  // one 128-thread CTA
  for (const int G : {4, 8}) {
    for (int v = d::kExactSplit64; v < d::kExactVariants; ++v) {
      SCOPED_TRACE(testing::Message() << d::exact_variant_name(v) << " G " << G);
      d::ExactGridFootprint f;
      ASSERT_EQ(d::exact_grid_footprint(v, 128, G, 42, &f), cudaSuccess);
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
      std::printf("[exact grid] footprint %s D=128 G=%d (stages %d): exact CTA %d registers %zu bytes, "
                  "estimation CTA %d registers %zu bytes (+%zu reserved each; %d registers, %zu bytes per SM): "
                  "three exact CTAs fit=%d, estimation CTAs beside them %d, alone %d\n",
                  d::exact_variant_name(v), G, d::decode_stages(), f.exact_regs, f.exact_smem, f.est_regs, f.est_smem,
                  f.cta_reserved, f.sm_regs, f.sm_smem, int(fits(3, 0)), beside, alone);
      if (d::decode_stages() != 2) continue;  // the arithmetic below is the two-stage one
      EXPECT_TRUE(fits(3, 0));
      EXPECT_LE(f.est_regs, 64);
      EXPECT_GE(alone, 8);
      if (d::exact_caps_registers(v)) {
        EXPECT_LE(f.exact_regs, 128);
        EXPECT_GE(beside, 1);
      }
      if (d::exact_est_halves(v) && G <= 4) {
        EXPECT_GE(beside, 2);
      }
    }
  }
  d::ExactGridFootprint f;
  EXPECT_EQ(d::exact_grid_footprint(d::kExactV1, 128, 4, 42, &f), cudaErrorInvalidValue);
  EXPECT_EQ(d::exact_grid_footprint(d::kExactSplit64, 96, 4, 42, &f), cudaErrorInvalidValue);
  EXPECT_EQ(d::exact_grid_footprint(d::kExactSplit64, 128, 9, 42, &f), cudaErrorInvalidValue);
}

// Bad values: a clear error at the decode (before any launch) and from the parser; the names round-trip.
TEST(CudaExactGrid, UnknownVariantThrows) {
  {
    EnvGuard env("RETROINFER_EXACT", "split32");
    EXPECT_THROW(cuda::detail::exact_variant_from_env(), Error);
    env.set("V1");
    EXPECT_THROW(cuda::detail::exact_variant_from_env(), Error);
    env.set("");
    EXPECT_EQ(cuda::detail::exact_variant_from_env(), cuda::detail::kExactDefault);
    for (int v = 0; v < cuda::detail::kExactVariants; ++v) {
      env.set(cuda::detail::exact_variant_name(v));
      EXPECT_EQ(cuda::detail::exact_variant_from_env(), v);
    }
  }
  RETROINFER_REQUIRE_GPU();
  gputest::PathLayer t = gputest::make_path_layer({1, 2, 4, 128, 5000, true, false, true}, 941);
  EnvGuard env("RETROINFER_EXACT", "fast");
  auto out = gputest::poisoned(t.q_elems);
  EXPECT_THROW(t.layer->decode(t.dq.as<float>(), out.as<float>()), Error);
  cuda::synchronize();
  env.set("split");  // the layer still decodes after the error
  const PathResult r = decode_once(t);
  EXPECT_EQ(gputest::compare(r.out, r.out).unwritten, 0);
  std::printf("[exact grid] unknown RETROINFER_EXACT values throw; the layer decodes afterwards\n");
}

}  // namespace
}  // namespace retroinfer
