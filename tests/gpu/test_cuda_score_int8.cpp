// Cluster scoring against int8 copies of the centroids (select_kernels.h quantize_centroids,
// ScoreParams::centroids_q8; AttentionConfig::int8_centroid_scoring, the layers' default, when they keep no bf16
// centroids) against the bf16 centroids' scoring.
//   QuantizeMatchesHostRule: quantize_centroids bit for bit against the host rule (s = max |c| / 127 in f32,
//     u = rint(c / s) + 128), rows of D 64 / 128 with zero rows, one-element rows and +-127 saturation.
//   KernelMatchesDequantized: score_clusters on the int8 copies, outputs poisoned first and checked written:
//     logits against f64 dot products with the dequantized centroids (bound below), -inf exactly for empty
//     clusters, each CTA's normaliser partial against its own logits; the scores formed by the same grid
//     (where score_form_fits) with the same logits, each head's scores summing to G. Where C % 4 == 0 the
//     CTA-wide stages run; the per-warp stages (sizes and scales not 16-byte aligned) then give the same
//     logits bit for bit and the partial sums and formed scores within 1e-5 (a CTA's last group in half tiles
//     sums in another order); where C % 4 != 0 both are the per-warp stages, bit for bit. Given bf16 centroids
//     too, the copies are scored (the same bits). Shapes: tails, G 1-8, D 64 / 128, all-empty heads, 128K
//     batch 1 and 4, queries of ~1e6 (the per-row power of two that keeps the f16 query parts finite).
//   DecodeInt8: a RetroLayer with int8 scoring: the debug state has no bf16 centroids and its int8 copies are
//     the host rule applied to the bf16 centroids of the bf16-scoring layer over the same K/V; graph replays
//     and the stage path identical to the eager decode; the output against the f64 reference of the zones it
//     selected; against full attention no worse than the bf16-scoring layer's.
//   OptionAtConstruction: int8 scoring is the default and AttentionConfig::int8_centroid_scoring = false turns
//     it off.
// One "[score int8]" line per case.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "decode_path_test_util.h"
#include "gpu_test_util.h"
#include "score_test_util.h"
#include "retroinfer/dtype.h"
#include "retroinfer/error.h"

namespace retroinfer {
namespace {

namespace cd = cuda::detail;
using gputest::bits_to_f32;

// The host rule of quantize_centroids (IEEE f32 division and round-to-nearest-even, as the kernel's).
void host_quantize(const uint16_t* row, int D, uint8_t* q, float* s) {
  float mx = 0.0f;
  for (int i = 0; i < D; ++i) mx = std::max(mx, std::fabs(bf16_to_f32(row[i])));
  const float sc = mx / 127.0f;
  for (int i = 0; i < D; ++i) {
    const float x = sc > 0.0f ? std::min(127.0f, std::max(-127.0f, std::nearbyint(bf16_to_f32(row[i]) / sc))) : 0.0f;
    q[i] = static_cast<uint8_t>(static_cast<int>(x) + 128);
  }
  *s = sc;
}

struct Q8 {
  cuda::DeviceBuffer q8, scale;
};
Q8 quantize_on_device(const cuda::DeviceBuffer& dc, int64_t rows, int D) {
  Q8 r;
  r.q8 = cuda::DeviceBuffer(std::max<size_t>(size_t(rows) * D, 16));
  r.scale = gputest::poisoned(std::max<size_t>(size_t(rows), 4));
  cudaMemset(r.q8.data(), 0xff, r.q8.bytes());
  EXPECT_EQ(cd::quantize_centroids(dc.as<uint16_t>(), rows, D, r.q8.as<uint8_t>(), r.scale.as<float>(), nullptr),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return r;
}

TEST(CudaScoreInt8, QuantizeMatchesHostRule) {
  RETROINFER_REQUIRE_GPU();
  for (const int D : {64, 128}) {
    const int rows = 1003;
    std::mt19937_64 rng(7 + D);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::vector<uint16_t> c(size_t(rows) * D);
    for (int r = 0; r < rows; ++r) {
      const float gain = std::ldexp(1.0f, int(r % 41) - 20);  // 2^-20 .. 2^20
      for (int i = 0; i < D; ++i) c[size_t(r) * D + i] = f32_to_bf16(n01(rng) * gain);
    }
    for (int i = 0; i < D; ++i) c[size_t(5) * D + i] = 0;                       // a zero row
    for (int i = 0; i < D; ++i) c[size_t(6) * D + i] = i == 17 ? f32_to_bf16(-3.0f) : 0;  // one element
    for (int i = 0; i < D; ++i) c[size_t(7) * D + i] = f32_to_bf16(i % 2 ? 1.0f : -1.0f);  // all at +-max
    auto dc = gputest::upload(c);
    const Q8 d = quantize_on_device(dc, rows, D);
    std::vector<uint8_t> got(size_t(rows) * D);
    std::vector<float> got_s(rows);
    d.q8.download(got.data(), got.size());
    d.scale.download(got_s.data(), got_s.size() * 4);
    std::vector<uint8_t> want(D);
    int64_t bad = 0;
    for (int r = 0; r < rows; ++r) {
      float s = 0;
      host_quantize(&c[size_t(r) * D], D, want.data(), &s);
      EXPECT_EQ(std::memcmp(&s, &got_s[r], 4), 0) << "scale of row " << r;
      for (int i = 0; i < D; ++i) bad += want[i] != got[size_t(r) * D + i];
    }
    EXPECT_EQ(bad, 0) << "D " << D;
    EXPECT_EQ(got_s[5], 0.0f);
    for (int i = 0; i < D; ++i) EXPECT_EQ(got[size_t(5) * D + i], 128);
    EXPECT_EQ(got[size_t(6) * D + 17], 1);  // -127 + 128
    EXPECT_EQ(got[size_t(7) * D + 0], 1);
    EXPECT_EQ(got[size_t(7) * D + 1], 255);
    std::printf("[score int8] quantize D=%d rows=%d: bit-identical to the host rule (%lld bytes differ)\n", D, rows,
                (long long)bad);
  }
  // Refusals.
  EXPECT_EQ(cd::quantize_centroids(nullptr, 1, 12, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cd::quantize_centroids(nullptr, -1, 64, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cd::quantize_centroids(nullptr, 0, 64, nullptr, nullptr, nullptr), cudaSuccess);
}

struct KernelCase {
  int H, G, D, C;
  double empty;      // fraction of clusters with size 0
  float q_gain = 1;  // query magnitude
};


using KernelOut = gputest::ScoreOut;

// score_clusters on the int8 copies (sizes and scales as given; centroids: the bf16 centroids too, or none).
KernelOut run_scores(const KernelCase& kc, const cuda::DeviceBuffer& dq, const uint16_t* centroids, const int* sizes,
                     const uint8_t* q8, const float* q8_scale, float scale, bool form) {
  gputest::ScoreInputs in;
  in.q = dq.as<float>();
  in.centroids = centroids;
  in.sizes = sizes;
  in.q8 = q8;
  in.q8_scale = q8_scale;
  return gputest::run_score_kernel({kc.H, kc.G, kc.D, kc.C}, in, scale, form);
}

int64_t count_diff(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b, int64_t* unwritten) {
  int64_t d = 0;
  *unwritten = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += a[i] != b[i];
    *unwritten += a[i] == 0xffffffffu;
  }
  return d;
}

// Entries of a (float bits) that differ from b's by more than rel of the larger magnitude (equal bits, -inf
// included, always agree; a NaN never does). pairs: the arrays are (max, sum) pairs whose maxima must be equal.
int64_t count_close(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b, double rel, bool pairs) {
  int64_t bad = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (a[i] == b[i]) continue;
    const double x = gputest::bits_to_f32(a[i]), y = gputest::bits_to_f32(b[i]);
    const bool must_equal = pairs && i % 2 == 0;
    bad += must_equal || !(std::abs(x - y) <= rel * std::max(std::abs(x), std::abs(y)));
  }
  return bad + static_cast<int64_t>(a.size() != b.size());
}

void kernel_case(const KernelCase& kc, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "H=" << kc.H << " G=" << kc.G << " D=" << kc.D << " C=" << kc.C
                                  << " empty=" << kc.empty << " q_gain=" << kc.q_gain << " seed=" << seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  std::uniform_int_distribution<int> su(1, 60);
  std::vector<float> q(size_t(kc.H) * kc.G * kc.D);
  for (auto& x : q) x = n01(rng) * kc.q_gain;
  std::vector<uint16_t> cent(size_t(kc.H) * kc.C * kc.D);
  for (auto& x : cent) x = f32_to_bf16(n01(rng));
  std::vector<int32_t> sizes(size_t(kc.H) * kc.C);
  for (auto& s : sizes) s = u01(rng) < kc.empty ? 0 : su(rng);
  auto dq = gputest::upload(q), dc = gputest::upload(cent), ds = gputest::upload(sizes);
  const Q8 q8 = quantize_on_device(dc, int64_t(kc.H) * kc.C, kc.D);
  std::vector<uint8_t> hq(size_t(kc.H) * kc.C * kc.D);
  std::vector<float> hs(size_t(kc.H) * kc.C);
  if (!hq.empty()) q8.q8.download(hq.data(), hq.size());
  if (!hs.empty()) q8.scale.download(hs.data(), hs.size() * 4);
  const float scale = 1.0f / std::sqrt(float(kc.D));
  const bool fits = cd::score_form_fits(kc.C, kc.D, kc.H);
  const gputest::ScoreShape shape{kc.H, kc.G, kc.D, kc.C};
  const bool wide = kc.C % 4 == 0;  // the CTA-wide stages (the sizes and scales below are 16-byte aligned)
  const uint8_t* dq8 = q8.q8.as<uint8_t>();
  const float* dsc = q8.scale.as<float>();

  const KernelOut plain = run_scores(kc, dq, nullptr, ds.as<int>(), dq8, dsc, scale, false);
  int64_t unwritten = 0;
  EXPECT_EQ(count_diff(plain.logits, plain.logits, &unwritten), 0);
  EXPECT_EQ(unwritten, 0) << "logits unwritten";
  count_diff(plain.partial, plain.partial, &unwritten);
  EXPECT_EQ(unwritten, 0) << "partials unwritten";
  // Logits against f64 with the dequantized centroids: the query's f16 hi + lo parts carry x = q scale 2^-e
  // to 2^-22 |x| (plus 2^-25 absolute where lo is subnormal), the f16 x int products are exact in f32, the
  // f32 accumulation over D terms adds <= D 2^-24 of sum |terms| (2^-17 at D 128), then two f32 products
  // (scale, 2^e exact): bound 2^-15 of scale sum |q_i c_i| plus 2^-24 scale sum |c_i| for the subnormal parts.
  double worst = 0.0;
  for (int h = 0; h < kc.H; ++h)
    for (int g = 0; g < kc.G; ++g)
      for (int c = 0; c < kc.C; ++c) {
        const size_t hc = size_t(h) * kc.C + c;
        const float got = bits_to_f32(plain.logits[(size_t(h) * kc.G + g) * kc.C + c]);
        if (sizes[hc] == 0) {
          EXPECT_EQ(got, -INFINITY) << "empty cluster " << c << " of head " << h;
          continue;
        }
        double dot = 0, mag = 0, cmag = 0;
        for (int i = 0; i < kc.D; ++i) {
          const double cv = (double(hq[hc * kc.D + i]) - 128.0) * double(hs[hc]);
          const double t = double(q[(size_t(h) * kc.G + g) * kc.D + i]) * cv;
          dot += t;
          mag += std::abs(t);
          cmag += std::abs(cv);
        }
        const double bound = std::ldexp(double(scale) * mag, -15) + std::ldexp(double(scale) * cmag, -24) + 1e-30;
        const double err = std::abs(double(got) - double(scale) * dot);
        worst = std::max(worst, err / bound);
        EXPECT_LE(err, bound) << "logit (" << h << ", " << g << ", " << c << ")";
        if (!(err <= bound)) return;
      }
  const double worst_sum = gputest::expect_partials_match_logits(shape, plain, 1e-4);
  KernelOut form;
  if (fits) {
    form = run_scores(kc, dq, nullptr, ds.as<int>(), dq8, dsc, scale, true);
    EXPECT_EQ(count_diff(form.logits, plain.logits, &unwritten), 0) << "form vs plain logits";
    EXPECT_EQ(count_diff(form.partial, plain.partial, &unwritten), 0) << "form vs plain partials";
    count_diff(form.scores, form.scores, &unwritten);
    EXPECT_EQ(unwritten, 0) << "scores unwritten";
    gputest::expect_scores_sum_to_group(form.scores, kc.H, kc.C, kc.G);
  }
  // The per-warp stages: the sizes and scales 4 bytes past a 16-byte aligned base (then every tile's sizes
  // and scales come by 4-byte copies). The same per-row math, so the same logits; with the CTA-wide stages on
  // the other side, a CTA's last group of fewer than 4 tiles went to the warps in half tiles, so the partials'
  // sums add the same terms in another order: the maxima bit for bit, the sums and formed scores within 1e-5.
  {
    cuda::DeviceBuffer ds4, dsc4;
    const int* sizes4 = gputest::upload_at(sizes, 4, &ds4);
    const float* scales4 = gputest::upload_at(hs, 4, &dsc4);
    const KernelOut w = run_scores(kc, dq, nullptr, sizes4, dq8, scales4, scale, false);
    EXPECT_EQ(count_diff(w.logits, plain.logits, &unwritten), 0) << "per-warp vs default logits";
    if (wide) {
      EXPECT_EQ(count_close(w.partial, plain.partial, 1e-5, true), 0) << "per-warp vs CTA-wide partials";
    } else {
      EXPECT_EQ(count_diff(w.partial, plain.partial, &unwritten), 0) << "per-warp partials (both per-warp)";
    }
    if (fits) {
      const KernelOut wf = run_scores(kc, dq, nullptr, sizes4, dq8, scales4, scale, true);
      EXPECT_EQ(count_diff(wf.logits, plain.logits, &unwritten), 0) << "per-warp form logits";
      EXPECT_EQ(count_close(wf.scores, form.scores, 1e-5, false), 0) << "per-warp vs default formed scores";
      gputest::expect_scores_sum_to_group(wf.scores, kc.H, kc.C, kc.G);
    }
  }
  // Given the bf16 centroids too, the int8 copies are what is scored.
  const KernelOut both = run_scores(kc, dq, dc.as<uint16_t>(), ds.as<int>(), dq8, dsc, scale, false);
  EXPECT_EQ(count_diff(both.logits, plain.logits, &unwritten), 0) << "with bf16 centroids too vs copies only";
  std::printf("[score int8] kernel H=%d G=%d D=%d C=%d empty=%.2f q_gain=%g blocks=%d form_fits=%d wide=%d: logits "
              "vs f64 (dequantized) worst err/bound %.3f; partial sums vs host worst rel %.2e; formed scores and "
              "the per-warp stages identical or within 1e-5%s\n",
              kc.H, kc.G, kc.D, kc.C, kc.empty, double(kc.q_gain), cd::score_blocks(kc.C, kc.D, kc.H), int(fits),
              int(wide), worst, worst_sum, ::testing::Test::HasFailure() ? " NOT (see failures)" : "");
}

TEST(CudaScoreInt8, KernelMatchesDequantized) {
  RETROINFER_REQUIRE_GPU();
  kernel_case({3, 1, 64, 37, 0.2}, 31);      // tail of 5 rows, G 1 (sizes / scales by 4-byte cp.async)
  kernel_case({2, 4, 64, 20, 0.2}, 32);      // tail of 4 (C % 4 == 0: by bulk copy)
  kernel_case({2, 2, 64, 1, 0.0}, 33);       // one cluster
  kernel_case({1, 4, 128, 16, 0.0}, 34);     // one tile
  kernel_case({5, 3, 128, 1000, 0.1}, 35);   // G 3, tail of 8
  kernel_case({2, 8, 128, 4099, 0.3}, 36);   // G 8, tail of 3
  kernel_case({7, 4, 64, 2051, 0.05}, 37);   // D 64, tail of 3
  kernel_case({3, 4, 128, 600, 1.0}, 38);    // every cluster empty
  kernel_case({8, 4, 128, 8188, 0.02}, 39);  // 128K batch 1
  kernel_case({32, 4, 128, 8188, 0.02}, 40);  // 128K batch 4
  kernel_case({2, 4, 128, 300, 0.0, 1e6f}, 41);  // |q scale| ~ 1e5 > f16's range: 2^-e
  kernel_case({2, 2, 64, 100, 0.0, 3e7f}, 42);
  kernel_case({3, 4, 64, 2052, 0.1}, 43);    // D 64, C % 4 == 0: wide stages with whole and tail groups
  kernel_case({2, 8, 128, 4100, 0.3}, 45);   // G 8 on wide stages
  kernel_case({3, 1, 128, 2048, 0.1}, 46);   // G 1 on wide stages, whole groups only
}

// A RetroLayer over t's K/V as make_path_layer builds one for pc, scoring the clusters against bf16 centroids.
std::unique_ptr<cuda::RetroLayer> bf16_scoring_layer(const gputest::PathLayer& t, const gputest::PathCase& pc) {
  AttentionConfig cfg;
  cfg.estimation = pc.estimation;
  if (pc.host_kv) {
    cfg.sink_tokens = 4;
    cfg.window_tokens = 16;
    cfg.segment_tokens = 1024;
  }
  cfg.int8_centroid_scoring = false;
  auto layer = std::make_unique<cuda::RetroLayer>(AttentionShape{pc.hkv * pc.group, pc.hkv, pc.d}, cfg, pc.num_seqs);
  if (pc.outliers) layer->set_outlier_zone(true);
  layer->build(t.dk.as<uint16_t>(), t.dv.as<uint16_t>(), pc.n, pc.n);
  return layer;
}

TEST(CudaScoreInt8, DecodeInt8) {
  RETROINFER_REQUIRE_GPU();
  const gputest::PathCase cases[] = {{1, 2, 4, 128, 5000, true, false, true},
                                     {3, 2, 8, 64, 9000, true, false, true},
                                     {2, 1, 3, 64, 4000, true, true, true}};
  uint64_t seed = 950;
  for (const auto& pc : cases) {
    SCOPED_TRACE(gputest::describe(pc, seed));
    gputest::PathLayer t = gputest::make_path_layer(pc, seed);
    ASSERT_TRUE(t.layer->int8_scoring());
    const int C = t.layer->num_clusters(), d = pc.d;
    const gputest::PathResult a = gputest::decode_once(t);
    gputest::expect_identical(gputest::expect_graph_replays(t, a.out), a, "eager after replays");
    gputest::expect_stage_path(t, a.out);
    const auto cref = gputest::compare(a.out, gputest::f64_reference(t, a, pc.group, d));
    EXPECT_EQ(cref.unwritten, 0);
    EXPECT_LT(cref.nmse, 1e-9);  // the decode path tests' bounds against the same reference
    EXPECT_LT(cref.max_abs, 1e-4);
    // The bf16-scoring layer over the same K/V (the same k-means: nearly the same retrieval clusters).
    const std::unique_ptr<cuda::RetroLayer> u = bf16_scoring_layer(t, pc);
    ASSERT_FALSE(u->int8_scoring());
    const gputest::PathResult b = gputest::decode_once(*u, t.dq.as<float>(), t.q_elems, t.H);
    // The int8 copies are the host rule applied to the bf16 centroids (the bf16 layer's: the int8 layer keeps
    // none).
    int64_t bad = 0;
    for (size_t h = 0; h < a.heads.size(); ++h) {
      const auto &st = a.heads[h], &sb = b.heads[h];
      EXPECT_TRUE(st.centroids_bf16.empty());
      ASSERT_EQ(st.centroids_q8.size(), size_t(C) * d);
      ASSERT_EQ(st.centroid_scale.size(), size_t(C));
      ASSERT_EQ(sb.centroids_bf16.size(), size_t(C) * d);
      std::vector<uint8_t> want(d);
      for (int c = 0; c < C; ++c) {
        float s = 0;
        host_quantize(&sb.centroids_bf16[size_t(c) * d], d, want.data(), &s);
        bad += std::memcmp(&s, &st.centroid_scale[c], 4) != 0;
        for (int i = 0; i < d; ++i) bad += want[i] != st.centroids_q8[size_t(c) * d + i];
      }
    }
    EXPECT_EQ(bad, 0) << "int8 copies differ from the host rule";
    double jacc = 0;
    for (size_t h = 0; h < a.heads.size(); ++h) {
      EXPECT_TRUE(b.heads[h].centroids_q8.empty());
      jacc = std::max(jacc, gputest::jaccard_distance(a.heads[h].retrieval_ids, b.heads[h].retrieval_ids));
    }
    // Both against full attention (f64): the int8 scores' selection is no worse. On these small clustered
    // cases a few retrieval clusters change (n_r is 6 to 11: one swap is a Jaccard distance of 0.15 to 0.29)
    // and the two outputs differ as much as either differs from full; the bound is on the error.
    const float scale = 1.0f / std::sqrt(float(d));
    std::vector<int32_t> all(size_t(pc.n));
    for (int64_t i = 0; i < pc.n; ++i) all[size_t(i)] = int32_t(i);
    std::vector<float> full(t.q_elems);
    for (int h = 0; h < t.H; ++h)
      for (int g = 0; g < pc.group; ++g) {
        gputest::RefState rs(d);
        gputest::ref_exact(t.kv, &t.q[(size_t(h) * pc.group + g) * d], scale, h, all, rs);
        rs.finish(&full[(size_t(h) * pc.group + g) * d], d);
      }
    const auto e8 = gputest::compare(a.out, full), e16 = gputest::compare(b.out, full);
    EXPECT_LT(jacc, 0.5);
    EXPECT_LE(e8.nmse, 2.0 * e16.nmse + 1e-3);
    std::printf("[score int8] decode H=%d G=%d d=%d n=%lld C=%d: copies = host rule; graphs and stage path "
                "identical; vs f64 ref nmse %.2e max-abs %.2e; vs bf16 scoring: retrieval Jaccard max %.3f; "
                "nmse vs full attention int8 %.3e, bf16 %.3e\n",
                t.H, pc.group, d, (long long)pc.n, C, cref.nmse, cref.max_abs, jacc, e8.nmse, e16.nmse);
    ++seed;
  }
}

TEST(CudaScoreInt8, OptionAtConstruction) {
  RETROINFER_REQUIRE_GPU();
  AttentionConfig cfg;
  const AttentionShape shape{4, 2, 64};
  EXPECT_TRUE(cfg.int8_centroid_scoring);
  EXPECT_TRUE(cuda::RetroLayer(shape, cfg).int8_scoring());
  cfg.int8_centroid_scoring = false;
  EXPECT_FALSE(cuda::RetroLayer(shape, cfg).int8_scoring());
}

// Mismatched int8 arguments, and a query the int8 kernels cannot read, are refused by the launch.
TEST(CudaScoreInt8, Refusals) {
  RETROINFER_REQUIRE_GPU();
  cuda::DeviceBuffer buf(4096);
  cd::ScoreParams p;
  p.q = buf.as<float>();
  p.centroids_q8 = buf.as<uint8_t>();
  p.head_dim = 64;
  p.num_heads = 1;
  p.num_clusters = 1;
  p.group = 1;
  EXPECT_EQ(cd::score_clusters(p, nullptr), cudaErrorInvalidValue) << "copies without scales";
  p.centroids_q8 = nullptr;
  p.centroid_scale = buf.as<float>();
  EXPECT_EQ(cd::score_clusters(p, nullptr), cudaErrorInvalidValue) << "scales without copies";
  p.centroids_q8 = buf.as<uint8_t>();
  p.q = buf.as<float>() + 1;
  EXPECT_EQ(cd::score_clusters(p, nullptr), cudaErrorInvalidValue) << "query not 16-byte aligned";
}

}  // namespace
}  // namespace retroinfer
