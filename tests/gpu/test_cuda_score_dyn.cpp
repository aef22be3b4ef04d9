// The tmadyn score kernel (RETROINFER_SCORE=tmadyn, score_stream.cu: tma's copies and per-tile math, tiles
// handed out per head by a static share plus claims on a per-head counter, one normaliser partial per tile)
// against tma on the same inputs.
//   What must hold, and why:
//   - logits [H, G, C]: bit-identical to tma (the same per-tile math; who takes a tile does not matter);
//   - per-tile partials [H, G, ceil(C / 16)]: bit-identical between every tmadyn launch whatever the takes
//     (dynamic or static, any RETROINFER_SCORE_DYN_STATIC / _CLAIM, repeated launches, graph replays), and
//     against the logits: the max exact, the sum within kPartRel of sum_j e^{l_j - max} in f64;
//   - formed scores [H, C]: bit-identical between tmadyn launches; against tma within kScoreRel relative
//     (only the normaliser's merge order differs), -inf exactly where tma has -inf;
//   - selections (the CPU rule on the scores here, the GPU selection in the decodes): tma's ids, except at a
//     near tie (the boundary scores of tma within 2 kScoreRel), reported;
//   - the tile counter is zero after every cooperative launch (CTA 0 of each head resets it after the grid
//     barrier), so repeated launches and graph replays take the same path;
//   - decodes (RetroLayer, run 10's cooperative formation and run 9's form_scores): logits equal, scores
//     within kScoreRel, the same ids, token lists and outputs as tma (where the ids agree), run 9 and run 10
//     bit-identical to each other under tmadyn, graph replays and the stage path bit-identical.
// Shapes: D 64 / 128, G 1..8, C with tails (1, 16, 20, 37, 600, 1000, 2051, 4099, 8188; C % 4 == 0 or not),
// all-empty heads, 128K's 8188 clusters at batch 1 (8 heads) and 4 (32 heads, issue #4), 900 heads (no
// cooperative formation). One "[score dyn]" line per case.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/kernels.h"
#include "decode_path_test_util.h"
#include "gpu_test_util.h"
#include "retroinfer/error.h"
#include "score_kernel_test_util.h"

namespace retroinfer {
namespace {

namespace cd = cuda::detail;
using gputest::bits_to_f32;
using gputest::EnvGuard;
using gputest::first_difference;
using gputest::KernelCase;
using gputest::KernelInputs;
using gputest::KernelOut;

// Scores against tma. Both variants form score = sum_g e^{l_g - M_g} / L_g with the same logits l_g and the
// same max M_g (a max is exact in any order), so e^{l_g - M_g} is the same f32 and only L_g differs: the same
// per-lane tile sums rescaled by different chains of ms_merge factors __expf(m - mx). Each factor carries
// ex2.approx's 2 ulp (2^-22) plus the f32 roundings of m - mx and of its product with log2 e (2 x 2^-24 |m - mx|,
// |m - mx| <= 11 for these N(0, 1) logits: 1.3e-6), and the add 2^-24: <= 1.6e-6 per merge. A term passes
// through <= 25 merges on either path (tma: the lane's tiles <= 6, quad 2, warps 4, CTA partials <= 4 strided
// + 5 tree; tmadyn: quad 2, <= 16 strided, 5 tree), so 1 / L_g, and the score (a positive sum of such terms),
// differ by < 50 x 1.6e-6 = 8e-5 relative at the worst alignment; bound 1e-4 (run 16's try measured 2.6e-7).
constexpr double kScoreRel = 1e-4;
// A tile partial's sum against f64: each term's __expf (2^-22 + 2^-24 |l - m|, |l - m| <= 11: 9e-7), the
// lane's 4-term f32 sum (3 x 2^-24) and the 2 quad merges (1.6e-6 each): < 5e-6; bound 1e-5.
constexpr double kPartRel = 1e-5;

// Worst |b - a| / |a| over the scores (both -inf or both finite with the same sign); -1 on a mismatch of
// -inf (reported by the caller).
double score_rel_diff(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b, int64_t* bad_inf) {
  double worst = 0.0;
  *bad_inf = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const float x = bits_to_f32(a[i]), y = bits_to_f32(b[i]);
    if (x == -INFINITY || y == -INFINITY) {
      *bad_inf += (x == -INFINITY) != (y == -INFINITY);
      continue;
    }
    const double d = std::abs(double(y) - double(x)) / std::max(std::abs(double(x)), 1e-30);
    worst = std::max(worst, d);
  }
  return worst;
}

// The CPU selection rule on two score vectors of one head (budgets k1, k2): the same ids, or a near tie at a
// boundary of `ref` (the k-th and (k+1)-th best within 2 kScoreRel relative). Returns 0 equal, 1 near tie,
// 2 a real difference.
int compare_selection(const std::vector<float>& ref, const std::vector<float>& got, int k1, int k2) {
  std::vector<int32_t> r1, e1, r2, e2;
  gputest::cpu_select(ref, k1, k2, r1, e1);
  gputest::cpu_select(got, k1, k2, r2, e2);
  if (r1 == r2 && e1 == e2) return 0;
  std::vector<float> sorted;
  for (const float x : ref)
    if (x != -INFINITY) sorted.push_back(x);
  std::sort(sorted.begin(), sorted.end(), [](float a, float b) { return a > b; });
  auto tie_at = [&](size_t k) {  // the k-th best and the next within the bound (or no next: no boundary)
    if (k == 0 || k >= sorted.size()) return true;
    return double(sorted[k - 1]) - double(sorted[k]) <= 2 * kScoreRel * std::abs(double(sorted[k - 1]));
  };
  const bool ok1 = r1 == r2 || tie_at(size_t(k1));
  const bool ok2 = e1 == e2 || (tie_at(size_t(k1)) || tie_at(size_t(k1) + k2));
  return ok1 && ok2 ? 1 : 2;
}

// Every per-tile partial against the logits of its tile: max exact, sum within kPartRel of the f64 sum.
// Returns the worst relative sum error.
double check_partials(const KernelCase& kc, const KernelOut& o) {
  const int T = (kc.C + 15) / 16;
  double worst = 0.0;
  for (int h = 0; h < kc.H; ++h)
    for (int g = 0; g < kc.G; ++g)
      for (int t = 0; t < T; ++t) {
        float mx = -INFINITY;
        const size_t row = (size_t(h) * kc.G + g) * kc.C;
        const int c1 = std::min(kc.C, 16 * t + 16);
        for (int c = 16 * t; c < c1; ++c) mx = std::max(mx, bits_to_f32(o.logits[row + c]));
        double sum = 0.0;
        if (mx != -INFINITY)
          for (int c = 16 * t; c < c1; ++c) {
            const float l = bits_to_f32(o.logits[row + c]);
            if (l != -INFINITY) sum += std::exp(double(l) - double(mx));
          }
        const size_t at = ((size_t(h) * kc.G + g) * T + t) * 2;
        const float pm = bits_to_f32(o.partial[at]), ps = bits_to_f32(o.partial[at + 1]);
        EXPECT_EQ(pm, mx) << "partial max, head " << h << " g " << g << " tile " << t;
        if (mx == -INFINITY) {
          EXPECT_EQ(ps, 0.0f) << "partial sum of an empty tile, head " << h << " g " << g << " tile " << t;
        } else {
          const double rel = std::abs(double(ps) - sum) / sum;
          worst = std::max(worst, rel);
          EXPECT_LE(rel, kPartRel) << "partial sum, head " << h << " g " << g << " tile " << t;
        }
        if (::testing::Test::HasFailure()) return worst;
      }
  return worst;
}

// Head h's tile counter of a [H, kScoreCounterStride] buffer, for every head.
std::vector<int32_t> download_counter(const cuda::DeviceBuffer& b, int H) {
  std::vector<int32_t> all(size_t(H) * cd::kScoreCounterStride), v(H);
  b.download(all.data(), all.size() * 4);
  for (int h = 0; h < H; ++h) v[h] = all[size_t(h) * cd::kScoreCounterStride];
  return v;
}

// One tmadyn launch under the given take settings (null: the default), the counter checked zero after.
KernelOut run_dyn(const KernelCase& kc, const KernelInputs& in, float scale, bool early, bool form, int* counter,
                  const char* static_tiles, const char* claim) {
  EnvGuard s("RETROINFER_SCORE_DYN_STATIC", static_tiles), k("RETROINFER_SCORE_DYN_CLAIM", claim);
  return gputest::run_kernel(kc, in, scale, cd::kScoreTmaDyn, early, form, counter);
}

// The default take split of one head (score_stream.cu score_dyn_take, for the summary line): tiles from the
// static share and claimed, on the cooperative path with a counter.
std::pair<int, int> default_split(const KernelCase& kc) {
  const int T = (kc.C + 15) / 16, nw = 4 * cd::score_blocks(kc.C, kc.D, kc.H);
  const int S = std::max(2, T / nw / 2);
  const int d0 = int64_t{S} * nw < T ? S * nw : T;
  return {d0, T - d0};
}

void kernel_case(const KernelCase& kc, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "H=" << kc.H << " G=" << kc.G << " D=" << kc.D << " C=" << kc.C
                                  << " empty=" << kc.empty << " seed=" << seed);
  const KernelInputs in = gputest::make_inputs(kc, seed);
  const float scale = 1.0f / std::sqrt(float(kc.D));
  const bool fits = cd::score_form_fits(kc.C, kc.D, kc.H, cd::kScoreTma);
  EXPECT_EQ(cd::score_form_fits(kc.C, kc.D, kc.H, cd::kScoreTmaDyn), fits)
      << "tmadyn must keep tma's residency (6 CTAs per multiprocessor)";
  const int T = (kc.C + 15) / 16;
  EXPECT_EQ(cd::score_norm_parts(kc.C, kc.D, kc.H, cd::kScoreTmaDyn), T);
  EXPECT_EQ(cd::score_norm_parts(kc.C, kc.D, kc.H, cd::kScoreTma), cd::score_blocks(kc.C, kc.D, kc.H));
  EXPECT_EQ(cd::score_norm_parts_max(kc.C, kc.D, kc.H), std::max(T, cd::score_blocks(kc.C, kc.D, kc.H)));
  cuda::DeviceBuffer counter(size_t(kc.H) * cd::kScoreCounterStride * 4);
  counter.fill_bytes(0);
  int* ctr = counter.as<int>();

  // tma's reference (plain: logits; form: scores).
  const KernelOut ref = gputest::run_kernel(kc, in, scale, cd::kScoreTma, true, false);
  struct Run {
    const char* name;
    bool form, counter;
    const char* static_tiles;
    const char* claim;
  };
  const Run runs[] = {
      {"plain (static takes)", false, false, nullptr, nullptr},
      {"form, dynamic takes", true, true, nullptr, nullptr},
      {"form, dynamic takes again", true, true, nullptr, nullptr},
      {"form, static 2 claim 1", true, true, "2", "1"},
      {"form, static 3 claim 2", true, true, "3", "2"},
      {"form, all static (static 1000000)", true, true, "1000000", nullptr},
      {"form, no counter (static takes)", true, false, nullptr, nullptr},
  };
  KernelOut first;  // the first tmadyn run: every other one must match it bit for bit
  KernelOut first_form;
  int n_runs = 0, near_ties = 0;
  double worst_part = 0.0, worst_score = 0.0;
  for (const Run& r : runs) {
    if (r.form && !fits) continue;
    SCOPED_TRACE(r.name);
    const KernelOut o = run_dyn(kc, in, scale, true, r.form, r.counter ? ctr : nullptr, r.static_tiles, r.claim);
    ++n_runs;
    EXPECT_EQ(o.parts, T);
    int64_t unwritten = 0;
    EXPECT_EQ(first_difference(o.logits, ref.logits, &unwritten), -1) << "logits differ from tma";
    EXPECT_EQ(unwritten, 0) << "logits unwritten";
    if (first.logits.empty()) {
      first = o;
      EXPECT_EQ(first_difference(o.partial, o.partial, &unwritten), -1);
      EXPECT_EQ(unwritten, 0) << "per-tile partials unwritten";
      worst_part = check_partials(kc, o);
    } else {
      EXPECT_EQ(first_difference(o.partial, first.partial, &unwritten), -1) << "per-tile partials differ between takes";
    }
    if (r.counter) {
      const auto cv = download_counter(counter, kc.H);
      for (int h = 0; h < kc.H; ++h) EXPECT_EQ(cv[h], 0) << "tile counter of head " << h << " not reset";
    }
    if (!r.form) continue;
    if (first_form.scores.empty()) {
      first_form = o;
      const KernelOut tma_form = gputest::run_kernel(kc, in, scale, cd::kScoreTma, true, true);
      int64_t bad_inf = 0;
      worst_score = score_rel_diff(tma_form.scores, o.scores, &bad_inf);
      EXPECT_EQ(bad_inf, 0) << "-inf scores differ from tma";
      EXPECT_LE(worst_score, kScoreRel) << "scores against tma";
      EXPECT_EQ(first_difference(o.scores, o.scores, &unwritten), -1);
      EXPECT_EQ(unwritten, 0) << "scores unwritten";
      // Selections by the CPU rule (the GPU selection's rule, decode_path_test_util.h cpu_select) with the
      // default budgets' order of magnitude: 1.8% retrieval, 23% estimation (at least one each).
      const int k1 = std::max(1, kc.C * 18 / 1000), k2 = std::max(1, kc.C * 23 / 100);
      for (int h = 0; h < kc.H; ++h) {
        std::vector<float> a(kc.C), b(kc.C);
        for (int c = 0; c < kc.C; ++c) {
          a[c] = bits_to_f32(tma_form.scores[size_t(h) * kc.C + c]);
          b[c] = bits_to_f32(o.scores[size_t(h) * kc.C + c]);
        }
        const int cmp = compare_selection(a, b, k1, k2);
        EXPECT_NE(cmp, 2) << "selection of head " << h << " differs from tma's (not a near tie)";
        near_ties += cmp == 1;
      }
    } else {
      EXPECT_EQ(first_difference(o.scores, first_form.scores, &unwritten), -1) << "scores differ between takes";
    }
  }
  const auto [n_static, n_claimed] = default_split(kc);
  std::printf("[score dyn] kernel H=%d G=%d D=%d C=%d empty=%.2f blocks=%d tiles=%d (default: %d static, %d claimed) "
              "form_fits=%d: %d tmadyn runs (takes dynamic / static, settings), logits = tma's, per-tile partials "
              "identical (sum vs f64 worst rel %.2e, bound %.0e)%s; scores vs tma worst rel %.2e (bound %.0e), "
              "near-tie selections %d%s\n",
              kc.H, kc.G, kc.D, kc.C, kc.empty, cd::score_blocks(kc.C, kc.D, kc.H), T, n_static, n_claimed, int(fits),
              n_runs, worst_part,
              kPartRel, fits ? ", scores identical between runs" : "", worst_score, kScoreRel, near_ties,
              ::testing::Test::HasFailure() ? " NOT (see failures)" : "");
}

TEST(CudaScoreDyn, KernelMatchesTma) {
  RETROINFER_REQUIRE_GPU();
  kernel_case({3, 1, 64, 37, 0.2}, 31);     // tail of 5 rows, G 1 (C % 4 != 0: the sizes by 4-byte cp.async)
  kernel_case({2, 4, 64, 20, 0.2}, 32);     // tail of 4 rows (C % 4 == 0: the sizes by bulk copy)
  kernel_case({2, 2, 64, 1, 0.0}, 33);      // one cluster: a 1-row tile, 3 warps of 4 idle
  kernel_case({1, 4, 128, 16, 0.0}, 34);    // exactly one tile
  kernel_case({5, 3, 128, 1000, 0.1}, 35);  // G 3, tail of 8
  kernel_case({4, 5, 64, 600, 0.1}, 36);    // G 5
  kernel_case({3, 6, 128, 1000, 0.1}, 37);  // G 6
  kernel_case({2, 7, 64, 2051, 0.1}, 38);   // G 7, tail of 3
  kernel_case({2, 8, 128, 4099, 0.3}, 39);  // G 8, tail of 3, many empty
  kernel_case({7, 4, 64, 2051, 0.05}, 40);  // D 64, tail of 3
  kernel_case({3, 4, 128, 600, 1.0}, 41);   // every cluster empty: all -inf
  kernel_case({8, 4, 128, 8188, 0.02}, 42);   // 128K batch 1: 99 CTAs per head, 512 tiles (all static)
  kernel_case({32, 4, 128, 8188, 0.02}, 43);  // 128K batch 4: 24 CTAs per head, 2 static + 320 claimed tiles
  kernel_case({128, 4, 128, 8188, 0.02}, 44);  // 128K batch 16: 6 CTAs per head, 10 static per warp
  kernel_case({900, 1, 64, 40, 0.1}, 45);     // 900 one-CTA heads: no cooperative formation (static takes)
  // Many heads, few CTAs each: dynamic takes with tails (the small shapes above are all static by default;
  // the splits below are the H200's, 132 multiprocessors).
  kernel_case({128, 4, 128, 1000, 0.1}, 46);  // 6 CTAs per head, 63 tiles: 48 static, 15 claimed; tail of 8
  kernel_case({200, 3, 64, 2051, 0.05}, 47);  // 3 CTAs per head, 129 tiles: 60 static, 69 claimed; C % 4 != 0
  kernel_case({160, 8, 128, 4099, 0.3}, 48);  // G 8, 4 CTAs per head, 257 tiles: 128 static, 129 claimed
}

// Graph replays of the cooperative tmadyn launch (the counter reset in the kernel is what lets a graph
// replay without a memset): each replay into poisoned outputs, bit-identical to the eager launch, counter 0.
void graph_case(const KernelCase& kc, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "H=" << kc.H << " G=" << kc.G << " D=" << kc.D << " C=" << kc.C);
  const KernelInputs in = gputest::make_inputs(kc, seed);
  const float scale = 1.0f / std::sqrt(float(kc.D));
  ASSERT_TRUE(cd::score_form_fits(kc.C, kc.D, kc.H, cd::kScoreTmaDyn));
  cuda::DeviceBuffer counter(size_t(kc.H) * cd::kScoreCounterStride * 4);
  counter.fill_bytes(0);
  const KernelOut eager = gputest::run_kernel(kc, in, scale, cd::kScoreTmaDyn, true, true, counter.as<int>());
  const int T = (kc.C + 15) / 16;
  const size_t n_logits = size_t(kc.H) * kc.G * kc.C, n_partial = size_t(kc.H) * kc.G * T * 2,
               n_scores = size_t(kc.H) * kc.C;
  auto dl = gputest::poisoned(n_logits), dp = gputest::poisoned(n_partial), dsc = gputest::poisoned(n_scores);
  const cd::ScoreParams p = gputest::kernel_params(kc, in, scale, cd::kScoreTmaDyn, true, dl.as<float>(),
                                                   dp.as<float2>(), dsc.as<float>(), counter.as<int>());
  cuda::StreamHandle stream;
  cuda::synchronize();
  cuda::CapturedGraph graph(stream.get(), [&] {
    EXPECT_EQ(cd::score_clusters(p, static_cast<cudaStream_t>(stream.get())), cudaSuccess);
  });
  constexpr int kReplays = 3;
  for (int rep = 0; rep < kReplays; ++rep) {
    SCOPED_TRACE(testing::Message() << "replay " << rep);
    dl.fill_bytes(0xff);
    dp.fill_bytes(0xff);
    dsc.fill_bytes(0xff);
    cuda::synchronize();  // the memsets run on the legacy stream, the graph on a non-blocking one
    graph.launch(stream.get());
    cuda::synchronize(stream.get());
    int64_t unwritten = 0;
    EXPECT_EQ(first_difference(gputest::download_bits(dl, n_logits), eager.logits, &unwritten), -1) << "logits";
    EXPECT_EQ(first_difference(gputest::download_bits(dp, n_partial), eager.partial, &unwritten), -1) << "partials";
    EXPECT_EQ(first_difference(gputest::download_bits(dsc, n_scores), eager.scores, &unwritten), -1) << "scores";
    const auto cv = download_counter(counter, kc.H);
    for (int h = 0; h < kc.H; ++h) EXPECT_EQ(cv[h], 0) << "tile counter of head " << h;
  }
  std::printf("[score dyn] graph H=%d G=%d D=%d C=%d: %d replays bit-identical to the eager launch, counters 0%s\n",
              kc.H, kc.G, kc.D, kc.C, kReplays, ::testing::Test::HasFailure() ? " NOT (see failures)" : "");
}

TEST(CudaScoreDyn, GraphReplays) {
  RETROINFER_REQUIRE_GPU();
  graph_case({200, 3, 64, 2051, 0.05}, 51);  // dynamic takes with a tail of 3
  graph_case({32, 4, 128, 8188, 0.02}, 52);  // 128K batch 4
}

// RetroLayer decodes: tmadyn against tma on run 10's path, tmadyn's run 9 against its run 10.
void decode_case(const gputest::PathCase& pc, uint64_t seed) {
  SCOPED_TRACE(gputest::describe(pc, seed));
  gputest::PathLayer t = gputest::make_path_layer(pc, seed);
  const int C = t.layer->num_clusters();
  EnvGuard path("RETROINFER_DECODE", "run10");
  EnvGuard score("RETROINFER_SCORE", "tma");
  const gputest::PathResult a = gputest::decode_once(t);
  score.set("tmadyn");
  const gputest::PathResult b = gputest::decode_once(t);
  ASSERT_EQ(a.heads.size(), b.heads.size());
  double worst = 0.0;
  int near_ties = 0;
  bool ids_equal = true;
  for (size_t h = 0; h < a.heads.size(); ++h) {
    SCOPED_TRACE(testing::Message() << "flat head " << h);
    const auto& x = a.heads[h];
    const auto& y = b.heads[h];
    EXPECT_EQ(y.logits, x.logits) << "logits differ from tma";
    ASSERT_EQ(y.scores.size(), x.scores.size());
    for (size_t c = 0; c < x.scores.size(); ++c) {
      if (x.scores[c] == -INFINITY || y.scores[c] == -INFINITY) {
        EXPECT_EQ(x.scores[c], y.scores[c]) << "cluster " << c;
        continue;
      }
      worst = std::max(worst, std::abs(double(y.scores[c]) - x.scores[c]) / std::abs(double(x.scores[c])));
    }
    if (y.retrieval_ids != x.retrieval_ids || y.estimation_ids != x.estimation_ids) {
      ids_equal = false;
      const int cmp = compare_selection(x.scores, y.scores, int(x.retrieval_ids.size()), int(x.estimation_ids.size()));
      EXPECT_NE(cmp, 2) << "selection differs from tma's (not a near tie)";
      near_ties += cmp == 1;
    } else {
      EXPECT_EQ(y.token_list, x.token_list);
    }
  }
  EXPECT_LE(worst, kScoreRel) << "scores against tma";
  if (ids_equal) {  // the same selection: the same exact tokens, estimation (logits) and merge
    for (size_t i = 0; i < a.out.size(); ++i) ASSERT_EQ(b.out[i], a.out[i]) << "output element " << i;
  }
  // tmadyn is deterministic: again, on run 9's path (form_scores merges the same partials in the same
  // order), through graph replays and the stage path: bit for bit.
  gputest::expect_identical(gputest::decode_once(t), b, "tmadyn again");
  path.set("run9");
  gputest::expect_identical(gputest::decode_once(t), b, "tmadyn run 9 path vs run 10");
  path.set("run10");
  const gputest::PathResult e = gputest::expect_graph_replays(t, b.out);
  gputest::expect_identical(e, b, "eager after replays");
  gputest::expect_stage_path(t, b.out);
  const bool fits = C > 0 && cd::score_form_fits(C, pc.d, t.H, cd::kScoreTmaDyn);
  std::printf("[score dyn] decode H=%d G=%d d=%d n=%lld C=%d outliers=%d form_in_score=%d: logits = tma's, scores "
              "worst rel %.2e (bound %.0e), ids %s (near ties %d), outputs %s; run 9 = run 10, repeats, graph "
              "replays and the stage path identical%s\n",
              t.H, pc.group, pc.d, (long long)pc.n, C, int(pc.outliers), int(fits), worst, kScoreRel,
              ids_equal ? "= tma's" : "differ at near ties", near_ties, ids_equal ? "= tma's" : "not compared",
              ::testing::Test::HasFailure() ? " NOT (see failures)" : "");
}

TEST(CudaScoreDyn, DecodeMatchesTma) {
  RETROINFER_REQUIRE_GPU();
  decode_case({1, 2, 4, 128, 5000, true, false, true}, 931);  // batch 1, G 4
  decode_case({3, 2, 8, 64, 9000, true, false, true}, 932);   // batch 3, G 8, d 64
  decode_case({4, 1, 1, 128, 3001, true, false, true}, 933);  // batch 4, G 1
  decode_case({2, 1, 3, 64, 4000, true, true, true}, 934);    // G 3, outliers
  decode_case({16, 8, 4, 64, 20000, true, false, false}, 935);  // 128 heads, 6 CTAs each: dynamic takes
}

TEST(CudaScoreDyn, DecodeMatchesTmaBenchShapes) {
  RETROINFER_REQUIRE_GPU();
  decode_case({1, 8, 4, 128, 131072, true, false, false}, 941);  // Llama-3-8B, 128K, batch 1
  decode_case({4, 8, 4, 128, 131072, true, false, false}, 942);  // 128K, batch 4 (issue #4's shape)
}

TEST(CudaScoreDyn, BadTakeSettingsThrow) {
  RETROINFER_REQUIRE_GPU();
  const KernelCase kc{2, 4, 128, 1000, 0.1};
  const KernelInputs in = gputest::make_inputs(kc, 961);
  const int T = (kc.C + 15) / 16;
  auto dl = gputest::poisoned(size_t(kc.H) * kc.G * kc.C), dp = gputest::poisoned(size_t(kc.H) * kc.G * T * 2),
       dsc = gputest::poisoned(size_t(kc.H) * kc.C);
  const cd::ScoreParams p = gputest::kernel_params(kc, in, 0.1f, cd::kScoreTmaDyn, true, dl.as<float>(),
                                                   dp.as<float2>(), dsc.as<float>(), nullptr);
  struct Bad {
    const char* static_tiles;
    const char* claim;
  };
  for (const Bad& b : {Bad{nullptr, "3"}, Bad{nullptr, "0"}, Bad{"1", nullptr}, Bad{"x", nullptr}, Bad{nullptr, "2x"},
                       Bad{"-2", nullptr}}) {
    EnvGuard s("RETROINFER_SCORE_DYN_STATIC", b.static_tiles), k("RETROINFER_SCORE_DYN_CLAIM", b.claim);
    EXPECT_THROW((void)cd::score_clusters(p, nullptr), Error)
        << (b.static_tiles ? b.static_tiles : "-") << " / " << (b.claim ? b.claim : "-");
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::printf("[score dyn] bad RETROINFER_SCORE_DYN_STATIC / _CLAIM values throw%s\n",
              ::testing::Test::HasFailure() ? " NOT (see failures)" : "");
}

}  // namespace
}  // namespace retroinfer
