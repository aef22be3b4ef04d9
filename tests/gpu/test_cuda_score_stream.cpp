// The stream score kernels (RETROINFER_SCORE=stream and =tma, score_stream.cu) against v1 (select.cu
// score_body) on the same inputs. They share the grid, the tile partition and the per-tile math, so
// everything they write must be bit-identical: logits [H, G, C], normaliser partials [H, G, score_blocks] and
// (run 10's cooperative form) the formed scores [H, C]; downstream, the decode's selection, token lists and
// outputs.
//   KernelMatchesV1: score_clusters directly, every mode (plain with and without early_loads, the
//     cooperative formation where it fits), outputs poisoned (NaN bits) first and checked written, logits
//     also against an f64 CPU dot product (bound in check_variant), -inf exactly for empty clusters, and each
//     head's scores summing to G (a softmax per query head). Shapes: D 64 / 128, G 1/2/3/4/8, C with tails
//     (1, 16, 20, 37, 600, 1000, 2051, 4099, 8188; both ways of copying the sizes: C % 4 == 0 or not), all-empty
//     heads, 128K's 8188 clusters at batch 1 (8 heads)
//     and 4 (32 heads, issue #4's grid), 900 heads (the formation does not fit: every variant must say so).
//   DecodeMatchesV1(BenchShapes): RetroLayer decodes under RETROINFER_SCORE=v1, stream and tma, on run 9's
//     path (plain score kernel + form_scores) and run 10's (the cooperative formation; the default),
//     bit-identical; graph replays and the stage-timing decode bit-identical to the eager decode. Batch
//     1/3/4, D 64/128, G 1/3/4/8, outliers, 128K x 8 heads at batch 1 and 4.
//   VariantSwitch / BadVariantThrowsInDecode: RETROINFER_SCORE read at every call; unknown values throw
//     (directly and from a decode); misaligned centroids refused by the bulk-copy kernels.
//   KernelMatchesV1 runs every stream variant with the query staged in shared memory (run 24, the default) and
//     read from global; QueryFromSharedMemory: RETROINFER_SCORE_QUERY, decodes both ways, a misaligned query.
// One "[score stream]" line per case.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
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
using gputest::EnvGuard;

struct KernelCase {
  int H, G, D, C;
  double empty;  // fraction of clusters with size 0 (1.0: every cluster of every head)
};

struct KernelInputs {
  std::vector<float> q;         // [H, G, D] f32
  std::vector<uint16_t> cent;   // [H, C, D] bf16
  std::vector<int32_t> sizes;   // [H, C]
  cuda::DeviceBuffer dq, dc, ds;
};

KernelInputs make_inputs(const KernelCase& kc, uint64_t seed) {
  KernelInputs in;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  std::uniform_int_distribution<int> su(1, 60);
  in.q.resize(size_t(kc.H) * kc.G * kc.D);
  for (auto& x : in.q) x = n01(rng);
  in.cent.resize(size_t(kc.H) * kc.C * kc.D);
  for (auto& x : in.cent) x = f32_to_bf16(n01(rng));
  in.sizes.resize(size_t(kc.H) * kc.C);
  for (auto& s : in.sizes) s = u01(rng) < kc.empty ? 0 : su(rng);
  in.dq = gputest::upload(in.q);
  in.dc = gputest::upload(in.cent);
  in.ds = gputest::upload(in.sizes);
  return in;
}

using KernelOut = gputest::ScoreOut;

// One score_clusters launch of `variant` into poisoned outputs (form: the cooperative formation).
KernelOut run_kernel(const KernelCase& kc, const KernelInputs& in, float scale, int variant, bool early, bool form,
                     bool query_smem = true) {
  gputest::ScoreInputs si;
  si.q = in.dq.as<float>();
  si.centroids = in.dc.as<uint16_t>();
  si.sizes = in.ds.as<int>();
  return gputest::run_score_kernel({kc.H, kc.G, kc.D, kc.C}, si, scale, variant, early, form, query_smem);
}

constexpr uint32_t kPoisonBits = 0xffffffffu;  // poisoned(): 0xff bytes (a NaN no kernel writes)

// Bitwise equality of two outputs, and none of `a` left poisoned; returns the first mismatch or -1.
int64_t first_difference(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b, int64_t* unwritten) {
  *unwritten = 0;
  int64_t first = -1;
  for (size_t i = 0; i < a.size(); ++i) {
    *unwritten += a[i] == kPoisonBits;
    if (first < 0 && a[i] != b[i]) first = int64_t(i);
  }
  return first;
}


// `b` (a stream variant's outputs) against `a` (v1's): bit-identical and all written; with form, each head's
// scores sum to G; in plain mode the logits against f64. Returns the worst |logit - ref| / bound.
double check_variant(const KernelCase& kc, const KernelInputs& in, float scale, const KernelOut& a,
                     const KernelOut& b, bool form, bool check_logits) {
  int64_t unwritten = 0;
  EXPECT_EQ(first_difference(b.logits, a.logits, &unwritten), -1) << "logits differ";
  EXPECT_EQ(unwritten, 0) << "logits unwritten";
  EXPECT_EQ(first_difference(b.partial, a.partial, &unwritten), -1) << "normaliser partials differ";
  EXPECT_EQ(unwritten, 0) << "normaliser partials unwritten";
  if (form) {
    EXPECT_EQ(first_difference(b.scores, a.scores, &unwritten), -1) << "scores differ";
    EXPECT_EQ(unwritten, 0) << "scores unwritten";
    gputest::expect_scores_sum_to_group(b.scores, kc.H, kc.C, kc.G);
  }
  double worst = 0.0;
  if (!check_logits) return worst;
  // Logits against f64: logit = scale q . c with q carried as bf16 hi + lo (|q - hi - lo| <= 2^-17 |q|, the
  // scaled query's f32 rounding 2^-24), bf16 x bf16 products exact in f32, and the tensor cores' f32
  // accumulation over D terms (<= D 2^-24 relative to sum |terms|: 2^-17 at D = 128): in all < 2^-15 of
  // scale * sum_i |q_i c_i|, the bound used (about 2x margin).
  for (int h = 0; h < kc.H; ++h)
    for (int g = 0; g < kc.G; ++g)
      for (int c = 0; c < kc.C; ++c) {
        const float got = bits_to_f32(b.logits[(size_t(h) * kc.G + g) * kc.C + c]);
        if (in.sizes[size_t(h) * kc.C + c] == 0) {
          EXPECT_EQ(got, -INFINITY) << "empty cluster " << c << " of head " << h;
          if (got != -INFINITY) return worst;
          continue;
        }
        double dot = 0, mag = 0;
        const float* qv = &in.q[(size_t(h) * kc.G + g) * kc.D];
        const uint16_t* cv = &in.cent[(size_t(h) * kc.C + c) * kc.D];
        for (int i = 0; i < kc.D; ++i) {
          const double t = double(qv[i]) * bf16_to_f32(cv[i]);
          dot += t;
          mag += std::abs(t);
        }
        const double bound = std::ldexp(double(scale) * mag, -15) + 1e-30;
        const double err = std::abs(double(got) - double(scale) * dot);
        worst = std::max(worst, err / bound);
        EXPECT_LE(err, bound) << "logit (" << h << ", " << g << ", " << c << ")";
        if (!(err <= bound)) return worst;
      }
  return worst;
}

void kernel_case(const KernelCase& kc, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "H=" << kc.H << " G=" << kc.G << " D=" << kc.D << " C=" << kc.C
                                  << " empty=" << kc.empty << " seed=" << seed);
  const KernelInputs in = make_inputs(kc, seed);
  const float scale = 1.0f / std::sqrt(float(kc.D));
  const bool fits_v1 = cd::score_form_fits(kc.C, kc.D, kc.H, cd::kScoreV1);
  const bool fits_stream = cd::score_form_fits(kc.C, kc.D, kc.H, cd::kScoreStream);
  const bool fits_tma = cd::score_form_fits(kc.C, kc.D, kc.H, cd::kScoreTma);
  const bool fits_wide = cd::score_form_fits(kc.C, kc.D, kc.H, cd::kScoreTmaWide);
  EXPECT_EQ(fits_stream, fits_v1) << "the stream kernel must keep v1's residency (6 CTAs per multiprocessor)";
  EXPECT_EQ(fits_tma, fits_v1) << "the tma kernel must keep v1's residency (6 CTAs per multiprocessor)";
  EXPECT_EQ(fits_wide, fits_v1) << "the wide kernel must keep v1's residency (6 CTAs per multiprocessor)";

  struct Mode {
    const char* name;
    bool early, form;
  };
  const Mode modes[] = {{"plain", false, false}, {"early", true, false}, {"form", true, true}};
  int runs = 0;
  double worst = 0.0;  // |logit - ref| / bound over all logits
  for (const Mode& m : modes) {
    if (m.form && !(fits_v1 && fits_stream && fits_tma && fits_wide)) continue;
    const KernelOut a = run_kernel(kc, in, scale, cd::kScoreV1, m.early, m.form);
    for (const int variant : {int(cd::kScoreStream), int(cd::kScoreTma), int(cd::kScoreTmaWide)})
      for (const bool query_smem : {true, false}) {  // run 24: the query from shared memory or from global
        SCOPED_TRACE(testing::Message() << m.name << " " << cd::score_variant_name(variant)
                                        << (query_smem ? " query smem" : " query global"));
        const KernelOut b = run_kernel(kc, in, scale, variant, m.early, m.form, query_smem);
        worst = std::max(worst, check_variant(kc, in, scale, a, b, m.form, !m.early && !m.form));
        ++runs;
      }
  }
  std::printf("[score stream] kernel H=%d G=%d D=%d C=%d empty=%.2f blocks=%d form_fits=%d: %d runs (modes x "
              "stream, tma, wide x query smem / global), logits, partials%s bit-identical to v1%s; logits vs f64 worst "
              "err/bound %.3f\n",
              kc.H, kc.G, kc.D, kc.C, kc.empty, cd::score_blocks(kc.C, kc.D, kc.H), int(fits_v1), runs,
              fits_v1 ? ", scores" : "", ::testing::Test::HasFailure() ? " NOT (see failures)" : "", worst);
}

TEST(CudaScoreStream, KernelMatchesV1) {
  RETROINFER_REQUIRE_GPU();
  kernel_case({3, 1, 64, 37, 0.2}, 11);     // tail of 5 rows, G 1 (C % 4 != 0: the sizes by 4-byte cp.async)
  kernel_case({2, 4, 64, 20, 0.2}, 21);     // tail of 4 rows (C % 4 == 0: the sizes by bulk copy, 16 bytes)
  kernel_case({3, 2, 128, 2052, 0.1}, 22);  // C % 4 == 0, tail of 4 rows: wide stages, a tail group per CTA
  kernel_case({4, 5, 64, 1284, 0.1}, 23);   // D 64, G 5: wide stages with whole and tail groups
  kernel_case({2, 2, 64, 1, 0.0}, 12);      // one cluster: a 1-row tile
  kernel_case({1, 4, 128, 16, 0.0}, 13);    // exactly one tile
  kernel_case({5, 3, 128, 1000, 0.1}, 14);  // G 3, tail of 8
  kernel_case({2, 8, 128, 4099, 0.3}, 15);  // G 8, tail of 3, many empty
  kernel_case({7, 4, 64, 2051, 0.05}, 16);  // D 64, tail of 3
  kernel_case({3, 4, 128, 600, 1.0}, 17);   // every cluster empty: all -inf
  kernel_case({8, 4, 128, 8188, 0.02}, 18);   // 128K batch 1 (Llama-3-8B: 8 KV heads)
  kernel_case({32, 4, 128, 8188, 0.02}, 19);  // 128K batch 4: issue #4's one-wave grid
  kernel_case({900, 1, 64, 40, 0.1}, 20);     // 900 one-CTA heads: the formation does not fit
}

void decode_case(const gputest::PathCase& pc, uint64_t seed) {
  SCOPED_TRACE(gputest::describe(pc, seed));
  // The variants' bit-identity is about the bf16 centroids (v1 and stream have no int8 path; the int8 one:
  // test_cuda_score_q8.cpp).
  EnvGuard fmt("RETROINFER_SCORE_CENTROIDS", "bf16");
  gputest::PathLayer t = gputest::make_path_layer(pc, seed);
  const int C = t.layer->num_clusters();
  EnvGuard path("RETROINFER_DECODE", "run9");
  EnvGuard score("RETROINFER_SCORE", "v1");
  const gputest::PathResult a9 = gputest::decode_once(t);
  path.set("run10");
  const gputest::PathResult a10 = gputest::decode_once(t);
  EXPECT_EQ(gputest::compare(a10.out, a10.out).unwritten, 0);
  for (const char* variant : {"stream", "tma", "wide"}) {
    SCOPED_TRACE(variant);
    score.set(variant);
    path.set("run9");
    gputest::expect_identical(gputest::decode_once(t), a9, "run 9 path (form_scores) vs v1");
    path.set("run10");
    const gputest::PathResult b10 = gputest::decode_once(t);
    gputest::expect_identical(b10, a10, "run 10 path (cooperative formation) vs v1");
    // Graph replays (cooperative score kernel when it fits) bit-identical to the eager decode.
    const gputest::PathResult e = gputest::expect_graph_replays(t, b10.out);
    gputest::expect_identical(e, b10, "eager after replays");
    gputest::expect_stage_path(t, b10.out);  // the stage-timing decode (phase stamps) bit-identical too
  }
  const bool fits = C > 0 && cd::score_form_fits(C, pc.d, t.H, cd::kScoreStream);
  std::printf("[score stream] decode H=%d G=%d d=%d n=%lld C=%d outliers=%d form_in_score=%d: logits, scores, "
              "ids, lists and outputs of stream, tma and wide vs v1 identical on run9 and run10 paths%s; graph replays "
              "and the stage path identical\n",
              t.H, pc.group, pc.d, (long long)pc.n, C, int(pc.outliers), int(fits),
              ::testing::Test::HasFailure() ? " NOT (see failures)" : "");
}

TEST(CudaScoreStream, DecodeMatchesV1) {
  RETROINFER_REQUIRE_GPU();
  decode_case({1, 2, 4, 128, 5000, true, false, true}, 901);  // batch 1, G 4
  decode_case({3, 2, 8, 64, 9000, true, false, true}, 902);   // batch 3, G 8, d 64
  decode_case({4, 1, 1, 128, 3001, true, false, true}, 903);  // batch 4, G 1
  decode_case({2, 1, 3, 64, 4000, true, true, true}, 904);    // G 3, outliers
}

TEST(CudaScoreStream, DecodeMatchesV1BenchShapes) {
  RETROINFER_REQUIRE_GPU();
  decode_case({1, 8, 4, 128, 131072, true, false, false}, 911);  // Llama-3-8B, 128K, batch 1
  decode_case({4, 8, 4, 128, 131072, true, false, false}, 912);  // 128K, batch 4 (issue #4's shape)
}

TEST(CudaScoreStream, VariantSwitch) {
  EnvGuard score("RETROINFER_SCORE", nullptr);
  EXPECT_EQ(cd::score_variant_from_env(), cd::kDefaultScoreVariant);
  score.set("");
  EXPECT_EQ(cd::score_variant_from_env(), cd::kDefaultScoreVariant);
  score.set("v1");
  EXPECT_EQ(cd::score_variant_from_env(), cd::kScoreV1);
  score.set("stream");
  EXPECT_EQ(cd::score_variant_from_env(), cd::kScoreStream);
  score.set("tma");
  EXPECT_EQ(cd::score_variant_from_env(), cd::kScoreTma);
  score.set("wide");
  EXPECT_EQ(cd::score_variant_from_env(), cd::kScoreTmaWide);
  for (const char* bad : {"V1", "stream2", "bulk", " v1", "Wide"}) {
    score.set(bad);
    EXPECT_THROW(cd::score_variant_from_env(), Error) << bad;
  }
  EXPECT_STREQ(cd::score_variant_name(cd::kScoreV1), "v1");
  EXPECT_STREQ(cd::score_variant_name(cd::kScoreStream), "stream");
  EXPECT_STREQ(cd::score_variant_name(cd::kScoreTma), "tma");
  EXPECT_STREQ(cd::score_variant_name(cd::kScoreTmaWide), "wide");
  std::printf("[score stream] switch: unset / empty -> %s, v1, stream, tma, wide; 5 bad values throw\n",
              cd::score_variant_name(cd::kDefaultScoreVariant));
}

// Run 24: RETROINFER_SCORE_QUERY (ScoreParams::query_smem) parsed at every decode; decodes with the query staged
// in shared memory (the default) and read from global bit-identical, bf16 and int8 centroids; a query base that
// is 8- but not 16-byte aligned falls back to global (no error, the same bits as asking for global).
TEST(CudaScoreStream, QueryFromSharedMemory) {
  RETROINFER_REQUIRE_GPU();
  EnvGuard query("RETROINFER_SCORE_QUERY", nullptr);
  EXPECT_TRUE(cd::score_query_smem_from_env());
  query.set("");
  EXPECT_TRUE(cd::score_query_smem_from_env());
  query.set("smem");
  EXPECT_TRUE(cd::score_query_smem_from_env());
  query.set("global");
  EXPECT_FALSE(cd::score_query_smem_from_env());
  for (const char* bad : {"SMEM", "shared", "1", " global"}) {
    query.set(bad);
    EXPECT_THROW(cd::score_query_smem_from_env(), Error) << bad;
  }
  int decodes = 0;
  for (const char* fmt : {"bf16", "int8"}) {
    SCOPED_TRACE(fmt);
    EnvGuard centroids("RETROINFER_SCORE_CENTROIDS", fmt);
    for (const gputest::PathCase& pc : {gputest::PathCase{1, 2, 4, 128, 5000, true, false, true},
                                        gputest::PathCase{3, 2, 8, 64, 9000, true, false, true},
                                        gputest::PathCase{2, 1, 3, 64, 4000, true, true, true}}) {
      gputest::PathLayer t = gputest::make_path_layer(pc, 931 + decodes);
      query.set("global");
      const gputest::PathResult a = gputest::decode_once(t);
      query.set(nullptr);
      const gputest::PathResult b = gputest::decode_once(t);
      gputest::expect_identical(b, a, "query smem vs global");
      const gputest::PathResult e = gputest::expect_graph_replays(t, b.out);
      gputest::expect_identical(e, b, "eager after replays");
      query.set("bogus");
      auto dout = gputest::poisoned(t.q_elems);
      EXPECT_THROW(t.layer->decode(t.dq.as<float>(), dout.as<float>()), Error);
      query.set(nullptr);
      ++decodes;
    }
  }
  // A query base 8 bytes past a 16-byte aligned one (the bf16 kernels' float2 loads need 8): they read it from
  // global whatever query_smem says, with the same bits as the aligned query.
  KernelCase kc{3, 4, 128, 1000, 0.1};
  const KernelInputs in = make_inputs(kc, 939);
  std::vector<float> shifted(in.q.size() + 2, 0.0f);
  std::copy(in.q.begin(), in.q.end(), shifted.begin() + 2);
  auto dqs = gputest::upload(shifted);
  gputest::ScoreInputs si;
  si.q = dqs.as<float>() + 2;
  si.centroids = in.dc.as<uint16_t>();
  si.sizes = in.ds.as<int>();
  const float scale = 1.0f / std::sqrt(float(kc.D));
  for (const int variant : {int(cd::kScoreStream), int(cd::kScoreTma), int(cd::kScoreTmaWide)}) {
    SCOPED_TRACE(cd::score_variant_name(variant));
    const KernelOut g = gputest::run_score_kernel({kc.H, kc.G, kc.D, kc.C}, si, scale, variant, true, false, false);
    const KernelOut m = gputest::run_score_kernel({kc.H, kc.G, kc.D, kc.C}, si, scale, variant, true, false, true);
    const KernelOut aligned = run_kernel(kc, in, scale, variant, true, false, true);
    int64_t unwritten = 0;
    EXPECT_EQ(first_difference(m.logits, g.logits, &unwritten), -1) << "misaligned query: smem asked vs global";
    EXPECT_EQ(unwritten, 0);
    EXPECT_EQ(first_difference(m.logits, aligned.logits, &unwritten), -1) << "misaligned vs aligned query";
  }
  std::printf("[score stream] query switch: unset / empty / smem -> shared memory, global; 4 bad values throw; "
              "%d layers (bf16 and int8 centroids) decode bit-identically with the query in shared memory and "
              "from global, graph replays too; a query base not 16-byte aligned falls back to global%s\n",
              decodes, ::testing::Test::HasFailure() ? " NOT (see failures)" : "");
}

TEST(CudaScoreStream, BadVariantThrowsInDecode) {
  RETROINFER_REQUIRE_GPU();
  EnvGuard fmt("RETROINFER_SCORE_CENTROIDS", "bf16");  // the stream variant below reads bf16 centroids
  gputest::PathLayer t = gputest::make_path_layer({1, 2, 4, 128, 3000, true, false, true}, 921);
  EnvGuard score("RETROINFER_SCORE", "nope");
  auto dout = gputest::poisoned(t.q_elems);
  EXPECT_THROW(t.layer->decode(t.dq.as<float>(), dout.as<float>()), Error);
  score.set("stream");  // the layer still decodes after the refusal
  const gputest::PathResult r = gputest::decode_once(t);
  EXPECT_EQ(gputest::compare(r.out, r.out).unwritten, 0);
  // The stream kernel refuses centroids that are not 16-byte aligned (its bulk copies need them).
  KernelCase kc{1, 1, 64, 16, 0.0};
  const KernelInputs in = make_inputs(kc, 922);
  auto dl = gputest::poisoned(16), dp = gputest::poisoned(2 * cd::score_blocks(16, 64, 1));
  cd::ScoreParams p;
  p.q = in.dq.as<float>();
  p.centroids_bf16 = in.dc.as<uint16_t>() + 1;
  p.sizes = in.ds.as<int>();
  p.logits = dl.as<float>();
  p.norm_partial = dp.as<float2>();
  p.num_heads = 1;
  p.group = 1;
  p.head_dim = 64;
  p.num_clusters = 1;
  p.scale = 1.0f;
  for (const int variant : {int(cd::kScoreStream), int(cd::kScoreTma), int(cd::kScoreTmaWide)}) {
    p.variant = variant;
    EXPECT_EQ(cd::score_clusters(p, nullptr), cudaErrorInvalidValue) << cd::score_variant_name(variant);
  }
  std::printf("[score stream] bad RETROINFER_SCORE throws in a decode; misaligned centroids refused%s\n",
              ::testing::Test::HasFailure() ? " NOT (see failures)" : "");
}

}  // namespace
}  // namespace retroinfer
