// Cluster scoring against bf16 centroids (score_clusters.cu; the layers' choice with
// AttentionConfig::int8_centroid_scoring off), score_clusters called directly into poisoned outputs:
//   KernelMatchesF64: the logits against an f64 dot product (bound in expect_logits_match_f64), -inf exactly for
//     empty clusters, every output written; each CTA's normaliser partial against its own logits (the range's
//     largest logit exactly, the sum of e^{logit - max} within 1e-4); the scores formed by the same grid
//     (where score_form_fits) with the same logits and partials bit for bit, each head's scores summing to G
//     (a softmax per query head); the query read from global memory (a base that is not 16-byte aligned;
//     more than 4 query heads always) giving the same bits as from shared memory. Shapes: D 64 / 128,
//     G 1/2/3/4/5/8, C with tails (1, 16, 20, 37, 600, 1000, 1284, 2051, 2052, 4099, 8188; both ways of copying
//     the sizes: C % 4 == 0 or not), all-empty heads, 128K's 8188 clusters at batch 1 (8 heads) and 4 (32 heads),
//     900 heads (the formation does not fit and is refused).
//   NoClusters: C = 0 writes the empty partials (-inf, 0).
//   Refusals: centroids not 16-byte aligned, head_dim 96, int8 copies without scales, a formation that does not
//     fit: cudaErrorInvalidValue.
// One "[score bf16]" line per case.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/kernels.h"
#include "gpu_test_util.h"
#include "score_test_util.h"
#include "retroinfer/dtype.h"

namespace retroinfer {
namespace {

namespace cd = cuda::detail;
using gputest::bits_to_f32;

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

KernelOut run_kernel(const KernelCase& kc, const KernelInputs& in, const float* q, float scale, bool form) {
  gputest::ScoreInputs si;
  si.q = q;
  si.centroids = in.dc.as<uint16_t>();
  si.sizes = in.ds.as<int>();
  return gputest::run_score_kernel({kc.H, kc.G, kc.D, kc.C}, si, scale, form);
}

constexpr uint32_t kPoisonBits = 0xffffffffu;  // poisoned(): 0xff bytes (a NaN no kernel writes)

// The first index where a and b differ (-1: none), and how many entries of `a` are still poisoned.
int64_t first_difference(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b, int64_t* unwritten) {
  *unwritten = 0;
  int64_t first = -1;
  for (size_t i = 0; i < a.size(); ++i) {
    *unwritten += a[i] == kPoisonBits;
    if (first < 0 && (i >= b.size() || a[i] != b[i])) first = int64_t(i);
  }
  return a.size() == b.size() ? first : std::max<int64_t>(first, 0);
}

// Logits against f64: logit = scale q . c with q carried as bf16 hi + lo (|q - hi - lo| <= 2^-17 |q|, the
// scaled query's f32 rounding 2^-24), bf16 x bf16 products exact in f32, and the tensor cores' f32
// accumulation over D terms (<= D 2^-24 relative to sum |terms|: 2^-17 at D = 128): in all < 2^-15 of
// scale * sum_i |q_i c_i|, the bound used (about 2x margin). Empty clusters: -inf exactly. Returns the worst
// |logit - ref| / bound.
double expect_logits_match_f64(const KernelCase& kc, const KernelInputs& in, float scale, const KernelOut& o) {
  double worst = 0.0;
  for (int h = 0; h < kc.H; ++h)
    for (int g = 0; g < kc.G; ++g)
      for (int c = 0; c < kc.C; ++c) {
        const float got = bits_to_f32(o.logits[(size_t(h) * kc.G + g) * kc.C + c]);
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
  const gputest::ScoreShape shape{kc.H, kc.G, kc.D, kc.C};
  const bool fits = cd::score_form_fits(kc.C, kc.D, kc.H);
  const KernelOut plain = run_kernel(kc, in, in.dq.as<float>(), scale, false);
  int64_t unwritten = 0;
  first_difference(plain.logits, plain.logits, &unwritten);
  EXPECT_EQ(unwritten, 0) << "logits unwritten";
  first_difference(plain.partial, plain.partial, &unwritten);
  EXPECT_EQ(unwritten, 0) << "normaliser partials unwritten";
  const double worst = expect_logits_match_f64(kc, in, scale, plain);
  const double worst_sum = gputest::expect_partials_match_logits(shape, plain, 1e-4);
  if (fits) {
    const KernelOut form = run_kernel(kc, in, in.dq.as<float>(), scale, true);
    EXPECT_EQ(first_difference(form.logits, plain.logits, &unwritten), -1) << "form vs plain logits";
    EXPECT_EQ(first_difference(form.partial, plain.partial, &unwritten), -1) << "form vs plain partials";
    first_difference(form.scores, form.scores, &unwritten);
    EXPECT_EQ(unwritten, 0) << "scores unwritten";
    gputest::expect_scores_sum_to_group(form.scores, kc.H, kc.C, kc.G);
  }
  // The query from global memory: a base 8 bytes past a 16-byte aligned one (with G > 4 it is read from global
  // in any case). The same fragments, so the same bits.
  cuda::DeviceBuffer shifted;
  const float* q8b = gputest::upload_at(in.q, 8, &shifted);
  const KernelOut g = run_kernel(kc, in, q8b, scale, false);
  EXPECT_EQ(first_difference(g.logits, plain.logits, &unwritten), -1) << "query from global vs shared memory: logits";
  EXPECT_EQ(first_difference(g.partial, plain.partial, &unwritten), -1) << "query from global: partials";
  std::printf("[score bf16] kernel H=%d G=%d D=%d C=%d empty=%.2f blocks=%d form_fits=%d: logits vs f64 worst "
              "err/bound %.3f; partial sums vs host worst rel %.2e; formed scores and the query from global "
              "identical%s\n",
              kc.H, kc.G, kc.D, kc.C, kc.empty, cd::score_blocks(kc.C, kc.D, kc.H), int(fits), worst, worst_sum,
              ::testing::Test::HasFailure() ? " NOT (see failures)" : "");
}

TEST(CudaScoreBf16, KernelMatchesF64) {
  RETROINFER_REQUIRE_GPU();
  kernel_case({3, 1, 64, 37, 0.2}, 11);     // tail of 5 rows, G 1 (C % 4 != 0: the sizes by 4-byte cp.async)
  kernel_case({2, 4, 64, 20, 0.2}, 21);     // tail of 4 rows (C % 4 == 0: the sizes by bulk copy, 16 bytes)
  kernel_case({3, 2, 128, 2052, 0.1}, 22);  // C % 4 == 0, tail of 4 rows
  kernel_case({4, 5, 64, 1284, 0.1}, 23);   // D 64, G 5 (the query from global)
  kernel_case({2, 2, 64, 1, 0.0}, 12);      // one cluster: a 1-row tile
  kernel_case({1, 4, 128, 16, 0.0}, 13);    // exactly one tile
  kernel_case({5, 3, 128, 1000, 0.1}, 14);  // G 3, tail of 8
  kernel_case({2, 8, 128, 4099, 0.3}, 15);  // G 8, tail of 3, many empty
  kernel_case({7, 4, 64, 2051, 0.05}, 16);  // D 64, tail of 3
  kernel_case({3, 4, 128, 600, 1.0}, 17);   // every cluster empty: all -inf
  kernel_case({8, 4, 128, 8188, 0.02}, 18);   // 128K batch 1 (Llama-3-8B: 8 KV heads)
  kernel_case({32, 4, 128, 8188, 0.02}, 19);  // 128K batch 4: the one-wave grid
  kernel_case({900, 1, 64, 40, 0.1}, 20);     // 900 one-CTA heads: the formation does not fit
}

TEST(CudaScoreBf16, NoClusters) {
  RETROINFER_REQUIRE_GPU();
  const KernelCase kc{2, 3, 128, 0, 0.0};
  const KernelInputs in = make_inputs(kc, 24);
  const KernelOut o = run_kernel(kc, in, in.dq.as<float>(), 1.0f, false);
  ASSERT_EQ(o.partial.size(), size_t(2) * 3 * 2);
  for (size_t i = 0; i < o.partial.size(); i += 2) {
    EXPECT_EQ(bits_to_f32(o.partial[i]), -INFINITY) << i;
    EXPECT_EQ(bits_to_f32(o.partial[i + 1]), 0.0f) << i;
  }
}

TEST(CudaScoreBf16, Refusals) {
  RETROINFER_REQUIRE_GPU();
  const KernelCase kc{1, 1, 64, 16, 0.0};
  const KernelInputs in = make_inputs(kc, 922);
  auto dl = gputest::poisoned(16), dp = gputest::poisoned(2 * cd::score_blocks(16, 64, 1));
  cd::ScoreParams p;
  p.q = in.dq.as<float>();
  p.centroids_bf16 = in.dc.as<uint16_t>();
  p.sizes = in.ds.as<int>();
  p.logits = dl.as<float>();
  p.norm_partial = dp.as<float2>();
  p.num_heads = 1;
  p.group = 1;
  p.head_dim = 64;
  p.num_clusters = 16;
  p.scale = 1.0f;
  cd::ScoreParams bad = p;
  bad.centroids_bf16 = p.centroids_bf16 + 1;  // 2 bytes past an aligned base: the copies need 16
  EXPECT_EQ(cd::score_clusters(bad, nullptr), cudaErrorInvalidValue) << "misaligned centroids";
  bad = p;
  bad.head_dim = 96;
  EXPECT_EQ(cd::score_clusters(bad, nullptr), cudaErrorInvalidValue) << "head_dim 96";
  bad = p;
  bad.centroids_q8 = reinterpret_cast<const uint8_t*>(in.dc.data());  // copies without their scales
  EXPECT_EQ(cd::score_clusters(bad, nullptr), cudaErrorInvalidValue) << "int8 copies without scales";
  bad = p;
  bad.num_heads = 70000;  // more heads than a grid's y dimension: the formation cannot fit
  bad.scores = dl.as<float>();
  EXPECT_FALSE(cd::score_form_fits(16, 64, 70000));
  EXPECT_EQ(cd::score_clusters(bad, nullptr), cudaErrorInvalidValue) << "formation that does not fit";
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // The parameters refused above are fine otherwise.
  EXPECT_EQ(cd::score_clusters(p, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace retroinfer
