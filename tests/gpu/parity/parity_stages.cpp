// RetroLayer::decode stage by stage against the production CPU code on the GPU's own inputs (the index it
// built, downloaded with debug_state), so that each stage is compared on identical inputs:
//   ClusterScoringMatchesScoreClusters: logits against index::score_clusters on the scored centroids, scores
//     against index::scores_from_logits on the GPU's logits;
//   ZoneSelectionMatchesSelectZones: budgets against wave_counts.h zone_counts, ids against index::select_zones on
//     the GPU's scores (exact), token lists against the steady zone + the retrieval clusters' members +
//     the outliers (exact), and the selection from the CPU's own scores (near-ties only);
//   EstimationZoneAndMergeMatchCpu: the output against RetroAttention::decode's arithmetic on the GPU's
//     zones: attention::accumulate_tokens over the exact tokens, softmax_push of each estimated cluster
//     (its logit, size and bf16 value sum), GroupState::merge and finish;
//   PartialStateMergeMatchesSoftmaxMerge: the combine_states launcher against softmax_merge / finish.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "kernels/decode_kernels.h"
#include "parity/parity_data.h"
#include "retroinfer/wave_counts.h"

namespace retroinfer::parity {
namespace {

struct NamedRetroCase {
  std::string name;
  RetroCase rc;
};

RetroCase retro_case(int seqs, int hkv, int group, int d, int64_t n, const AttentionConfig& cfg) {
  RetroCase rc;
  rc.num_seqs = seqs;
  rc.hkv = hkv;
  rc.group = group;
  rc.d = d;
  rc.n = n;
  rc.cfg = cfg;
  return rc;
}

// The cases of the three stage families: shapes (G 1..8, d 64 / 128, up to 32 flat heads), int8 and bf16
// scoring, the outlier zone, empty clusters (duplicate keys), budgets at their edges (none, estimation
// only, everything retrieved, r + e = 1), token counts around the steady zone and cluster counts around
// the score kernels' 16-centroid tiles.
std::vector<NamedRetroCase> stage_cases() {
  std::vector<NamedRetroCase> v;
  auto add = [&](std::string name, RetroCase rc) { v.push_back({std::move(name), std::move(rc)}); };
  add("paper-like budgets", retro_case(2, 2, 4, 128, 2000, small_retro_config(512, 0.1, 0.3)));
  add("G 8, d 64", retro_case(1, 2, 8, 64, 1537, small_retro_config(256, 0.05, 0.5)));
  add("G 1, no estimation", retro_case(1, 4, 1, 128, 3001, small_retro_config(1024, 0.2, 0.0)));
  add("G 3, one segment", retro_case(2, 1, 3, 64, 700, small_retro_config(8192, 0.02, 0.2)));
  add("32 flat heads", retro_case(4, 8, 4, 128, 4096, small_retro_config(2048, 0.05, 0.25)));
  add("1250 clusters", retro_case(1, 2, 4, 128, 20000, small_retro_config(8192, 0.018, 0.232)));
  {
    RetroCase rc = retro_case(2, 2, 4, 128, 2000, small_retro_config(512, 0.1, 0.3));
    rc.int8_scoring = false;
    add("bf16 scoring", rc);
    rc.int8_scoring = true;
    rc.outliers = true;
    rc.cfg.outlier_fraction = 0.01;
    add("outlier zone", rc);
  }
  {
    RetroCase rc = retro_case(1, 2, 4, 64, 1200, small_retro_config(512, 0.1, 0.3));
    rc.centres = 3;
    rc.spread = 0.0f;
    add("duplicate keys: empty clusters", rc);
  }
  AttentionConfig all_indexed = small_retro_config(256, 0.0, 0.5);
  all_indexed.sink_tokens = 0;
  all_indexed.window_tokens = 0;
  add("no retrieval: estimation only", retro_case(1, 2, 4, 128, 1000, all_indexed));
  all_indexed.estimation_fraction = 0.0;
  all_indexed.estimation = false;
  add("no budget at all: nothing attended", retro_case(1, 2, 4, 128, 1000, all_indexed));
  add("everything retrieved", retro_case(1, 2, 4, 128, 1500, small_retro_config(512, 1.0, 0.0)));
  add("r + e = 1", retro_case(1, 2, 4, 128, 1500, small_retro_config(512, 0.3, 0.7)));
  for (int64_t n : tail_sizes())
    add("tail n " + std::to_string(n), retro_case(1, 2, 4, 64, n, small_retro_config(64, 0.25, 0.25)));
  for (int64_t n : {20, 21, 35, 36, 37})  // 36 = sink 4 + window 16 + one cluster of 16
    add("steady edge n " + std::to_string(n), retro_case(1, 2, 4, 64, n, small_retro_config(64, 0.25, 0.25)));
  AttentionConfig clusters = small_retro_config(8192, 0.1, 0.3);
  clusters.sink_tokens = 0;
  clusters.window_tokens = 0;
  for (int64_t c : tail_sizes())  // c clusters: 16 c indexed tokens, one segment
    add("clusters " + std::to_string(c), retro_case(1, 2, 4, 128, 16 * c, clusters));
  return v;
}

std::vector<ParityCase> stage_family(void (*check)(const RetroCase&, const RetroRun&, CaseReport&), uint64_t seed0) {
  std::vector<ParityCase> cases;
  uint64_t seed = seed0;
  for (const NamedRetroCase& c : stage_cases()) {
    const RetroCase rc = c.rc;
    cases.push_back({c.name + " (" + rc.describe() + ")", seed++,
                     [rc, check](CaseReport& r, uint64_t s) { check(rc, run_retro(rc, s), r); }});
  }
  return cases;
}

// ---- scoring ----

// Logits: q . c * scale with c the scored centroid (int8: (u - 128) s, the CPU's copy an f32 product, u
// relative). The GPU splits the query into two 16-bit parts (f16 for int8 centroids, bf16 for bf16 ones:
// |q - hi - lo| <= 2^-16 |q|, plus half an f16 subnormal step, 2^-25 of the query's scale), accumulates d
// products in f32 (<= d u sum |q_i c_i|, as the CPU's dot), then scales (3 roundings of the logit):
//   |l_gpu - l_cpu| <= (2^-16 + (2 d + 4) u) sum_i |q_i c_i| scale + 2^-24 max|q| ||c||_1 scale.
double logit_bound(const float* q, const float* c, int d, float scale) {
  double mag = 0, qmax = 0, c1 = 0;
  for (int i = 0; i < d; ++i) {
    mag += std::abs(double(q[i]) * c[i]);
    qmax = std::max(qmax, std::abs(double(q[i])));
    c1 += std::abs(double(c[i]));
  }
  return ((0x1p-16 + (2.0 * d + 4) * kU) * mag + 0x1p-24 * qmax * c1) * scale + 1e-30;
}

// Scores from the same logits: score_c = sum_g e^{l_gc - M_g} / L_g. The exponentials differ by their
// rounding (CPU std::exp in f32: < 1 ulp; GPU expf / __expf: <= 2 + 1.2 |x| ulp for x = l - M), the GPU
// taking two per term (a CTA's partial and its rescale to the merged max); L_g is summed over C terms in f32
// on the GPU (double on the CPU: <= C u relative), then 1 / L_g and the sum over g (G + 2 roundings):
//   |s_gpu - s_cpu| <= (2 (4 + 1.2 x_max) 2^-23 + (C + G + 4) u) s_cpu, x_max = max (M_g - l_gc) of the head.
void check_scoring(const RetroCase& rc, const RetroRun& run, CaseReport& r) {
  const int G = run.G, d = run.d, C = run.C;
  r.note("clusters", C);
  r.eq("clusters (every head)", int(run.heads.front().num_clusters), C);
  if (C == 0) return;
  double worst_logit = 0, worst_score = 0;
  for (int h = 0; h < run.H; ++h) {
    const cuda::RetroDebugState& st = run.heads[h];
    r.eq("logits size", st.logits.size(), size_t(G) * C);
    r.eq("scores size", st.scores.size(), size_t(C));
    if (st.logits.size() != size_t(G) * C || st.scores.size() != size_t(C)) return;
    const index::HeadIndex hi = head_index(st, d, run.idx_begin);
    const float* q = &run.q[size_t(h) * G * d];
    std::vector<float> cpu_logits(size_t(G) * C), cpu_scores(C), ref_scores(C);
    index::score_clusters(hi, q, G, run.scale, cpu_logits.data(), cpu_scores.data());
    index::scores_from_logits(st.sizes.data(), C, st.logits.data(), G, ref_scores.data());
    int64_t empty_wrong = 0;
    double x_max = 0;
    for (int g = 0; g < G; ++g) {
      double M = -INFINITY;
      for (int c = 0; c < C; ++c)
        if (st.sizes[c] > 0) M = std::max<double>(M, st.logits[size_t(g) * C + c]);
      for (int c = 0; c < C; ++c) {
        const float gl = st.logits[size_t(g) * C + c];
        if (st.sizes[c] == 0) {
          empty_wrong += gl != -INFINITY;
          continue;
        }
        x_max = std::max(x_max, M - gl);
        const double b = logit_bound(q + size_t(g) * d, &hi.centroids[size_t(c) * d], d, run.scale);
        worst_logit = std::max(worst_logit, std::abs(gl - cpu_logits[size_t(g) * C + c]) / b);
      }
    }
    const double rel = 2.0 * (4.0 + 1.2 * x_max) * 0x1p-23 + (C + G + 4.0) * kU;
    for (int c = 0; c < C; ++c) {
      if (st.sizes[c] == 0) {
        empty_wrong += st.scores[c] != -INFINITY;
        continue;
      }
      const double b = rel * ref_scores[c] + 1e-30;
      worst_score = std::max(worst_score, std::abs(st.scores[c] - ref_scores[c]) / b);
    }
    r.none("empty clusters -inf (logits, scores)", empty_wrong);
  }
  r.le("logits err/bound", worst_logit, 1.0);
  r.le("scores err/bound", worst_score, 1.0);
  (void)rc;
}

std::vector<ParityCase> scoring_cases() { return stage_family(check_scoring, 100); }
RETROINFER_PARITY_FAMILY(ClusterScoringMatchesScoreClusters,
                         "RetroLayer::decode logits / scores vs index::score_clusters / scores_from_logits",
                         scoring_cases)

// ---- selection ----

// The tokens a head attends exactly, sorted: the steady zone [0, idx_begin) and [idx_begin + n_idx, n),
// the members of the retrieval clusters, the outliers.
std::vector<int64_t> expected_exact_tokens(const RetroRun& run, int h) {
  const cuda::RetroDebugState& st = run.heads[h];
  std::vector<int64_t> t;
  for (int64_t i = 0; i < std::min(run.idx_begin, run.n); ++i) t.push_back(i);
  for (int64_t i = run.idx_begin + run.n_idx; i < run.n; ++i) t.push_back(i);
  if (run.n_idx == 0) {
    t.clear();
    for (int64_t i = 0; i < run.n; ++i) t.push_back(i);
  }
  for (int32_t c : st.retrieval_ids)
    if (c >= 0 && c < st.num_clusters)
      for (int m = st.offsets[c]; m < st.offsets[c + 1]; ++m) t.push_back(run.idx_begin + st.members[m]);
  for (int32_t o : run.outliers[h]) t.push_back(o);
  std::sort(t.begin(), t.end());
  return t;
}

// The selection from the CPU's own scores (score_clusters on the scored centroids) may differ from the GPU's
// only at near-ties: each score is within tol = (2 L + rel) s of the GPU's (L the largest logit bound of the
// head, a softmax weight moving by at most e^{2 L} - 1 ~ 2 L relative; rel the scores' bound), so a cluster
// selected on one side only must score within 2 tol of the CPU's cut.
int64_t swaps_beyond_ties(const std::vector<float>& cpu_scores, const std::vector<int32_t>& cpu_ids,
                          const std::vector<int32_t>& gpu_ids, double rel_tol) {
  if (cpu_ids.empty() && gpu_ids.empty()) return 0;
  std::vector<char> in_cpu(cpu_scores.size(), 0), in_gpu(cpu_scores.size(), 0);
  for (int32_t c : cpu_ids) in_cpu[c] = 1;
  for (int32_t c : gpu_ids) in_gpu[c] = 1;
  double cut = INFINITY, next = -INFINITY;  // the CPU's weakest selected and strongest unselected score
  for (size_t c = 0; c < cpu_scores.size(); ++c) {
    if (cpu_scores[c] == -INFINITY) continue;
    if (in_cpu[c])
      cut = std::min<double>(cut, cpu_scores[c]);
    else
      next = std::max<double>(next, cpu_scores[c]);
  }
  int64_t bad = 0;
  for (size_t c = 0; c < cpu_scores.size(); ++c) {
    if (in_cpu[c] == in_gpu[c]) continue;
    const double s = cpu_scores[c], edge = in_cpu[c] ? next : cut;
    const double tol = rel_tol * std::max(std::abs(s), std::abs(edge)) + 1e-12;
    bad += !(std::abs(s - edge) <= 2.0 * tol);
  }
  return bad;
}

void check_selection(const RetroCase& rc, const RetroRun& run, CaseReport& r) {
  const int C = run.C, G = run.G, d = run.d;
  const ZoneCounts budget = zone_counts(C, rc.cfg);
  r.eq("n_retrieval = zone_counts", run.n_r, budget.n_retrieval);
  r.eq("n_estimation = zone_counts", run.n_e, budget.n_estimation);
  double jac = 0;
  for (int h = 0; h < run.H; ++h) {
    const cuda::RetroDebugState& st = run.heads[h];
    const std::string head = "head " + std::to_string(h);
    std::vector<int32_t> tokens(st.token_list.begin(), st.token_list.end());
    std::sort(tokens.begin(), tokens.end());
    expect_same(r, "token list = steady + retrieval members + outliers", tokens, expected_exact_tokens(run, h));
    if (C == 0) continue;
    index::ZoneSelection sel;
    index::select_zones(st.scores.data(), C, budget, sel);
    expect_same(r, "retrieval ids = select_zones(gpu scores)", st.retrieval_ids, sel.retrieval);
    expect_same(r, "estimation ids = select_zones(gpu scores)", st.estimation_ids, sel.estimation);
    // From the CPU's own scores.
    const index::HeadIndex hi = head_index(st, d, run.idx_begin);
    const float* q = &run.q[size_t(h) * G * d];
    std::vector<float> cpu_logits(size_t(G) * C), cpu_scores(C);
    index::score_clusters(hi, q, G, run.scale, cpu_logits.data(), cpu_scores.data());
    index::ZoneSelection cpu_sel;
    index::select_zones(cpu_scores.data(), C, budget, cpu_sel);
    double lmax = 0, x_max = 0;
    for (int g = 0; g < G; ++g) {
      double M = -INFINITY;
      for (int c = 0; c < C; ++c)
        if (st.sizes[c] > 0) M = std::max<double>(M, cpu_logits[size_t(g) * C + c]);
      for (int c = 0; c < C; ++c)
        if (st.sizes[c] > 0) {
          lmax = std::max(lmax, logit_bound(q + size_t(g) * d, &hi.centroids[size_t(c) * d], d, run.scale));
          x_max = std::max(x_max, M - cpu_logits[size_t(g) * C + c]);
        }
    }
    const double rel = 2.0 * lmax + 2.0 * (4.0 + 1.2 * x_max) * 0x1p-23 + (C + G + 4.0) * kU;
    r.none("cpu-score retrieval differs beyond near-ties",
           swaps_beyond_ties(cpu_scores, cpu_sel.retrieval, st.retrieval_ids, rel), head);
    jac = std::max(jac, gputest::jaccard_distance(cpu_sel.retrieval, st.retrieval_ids));
  }
  r.note("retrieval Jaccard vs cpu-score selection", jac);
}

std::vector<ParityCase> selection_cases() { return stage_family(check_selection, 200); }
RETROINFER_PARITY_FAMILY(ZoneSelectionMatchesSelectZones,
                         "RetroLayer::decode budgets / ids / token lists vs zone_counts / index::select_zones",
                         selection_cases)

// ---- estimation zone and merge ----

// Output against RetroAttention::decode's arithmetic on the GPU's zones. The estimation terms use the GPU's
// logits, sizes and bf16 value sums (identical inputs: only the f32 exp / sum roundings differ, ~1e-6
// relative). The exact tokens' logits are computed on both sides: the GPU's query split (2^-16 relative per
// product at worst, random-signed: ~1e-6 of a logit) and both sides' f32 dot products and sums (~sqrt(n) u
// relative) move an output, a convex combination of O(1) values (N(0, 1), value sums / sizes), by ~1e-6;
// the bounds leave 100x: nmse <= 1e-8, max-abs <= 2e-4.
constexpr double kOutputNmse = 1e-8;
constexpr double kOutputMaxAbs = 2e-4;

void check_output(const RetroCase& rc, const RetroRun& run, CaseReport& r) {
  const int G = run.G, d = run.d;
  std::vector<float> ref(run.q.size(), std::numeric_limits<float>::quiet_NaN());
  int64_t est_total = 0, exact_total = 0;
  for (int s = 0; s < rc.num_seqs; ++s) {
    const KvCache cache = to_cache(run.kv, s, rc.hkv, run.n);
    for (int kh = 0; kh < rc.hkv; ++kh) {
      const int h = s * rc.hkv + kh;
      const cuda::RetroDebugState& st = run.heads[h];
      const float* q = &run.q[size_t(h) * G * d];
      attention::GroupState exact(G, d), est(G, d);
      const std::vector<int64_t> tokens(st.token_list.begin(), st.token_list.end());
      attention::accumulate_tokens(cache, kh, q, run.scale, tokens.data(), int64_t(tokens.size()), exact);
      std::vector<float> vsum(d);
      for (int32_t c : st.estimation_ids) {
        for (int i = 0; i < d; ++i) vsum[i] = bf16_to_f32(st.value_sums_bf16[size_t(c) * d + i]);
        for (int g = 0; g < G; ++g)
          softmax_push(est.st[g], &est.o[size_t(g) * d], st.logits[size_t(g) * run.C + c], float(st.sizes[c]),
                       vsum.data(), d);
      }
      exact.merge(est);
      exact.finish(&ref[size_t(h) * G * d]);
      est_total += int64_t(st.estimation_ids.size());
      exact_total += int64_t(tokens.size());
    }
  }
  expect_close(r, "output", run.out, ref, kOutputNmse, kOutputMaxAbs);
  r.note("exact tokens", double(exact_total));
  r.note("estimated clusters", double(est_total));
}

std::vector<ParityCase> output_cases() { return stage_family(check_output, 300); }
RETROINFER_PARITY_FAMILY(
    EstimationZoneAndMergeMatchCpu,
    "RetroLayer::decode output vs accumulate_tokens + softmax_push + GroupState::merge on its zones", output_cases)

// ---- combine_states ----

struct MergeCase {
  int heads = 3, group = 4, d = 128, splits = 8;
  double empty = 0.3;       // share of empty states (m = -inf, l = 0, o = 0)
  float m_range = 30.0f;    // maxima uniform in [-m_range, m_range]
  bool empty_head = false;  // head 1 has only empty states
};

// GPU and CPU merge the same states; the maximum is exact on both, the weights are exponentials (<= 2 ulp)
// and the CPU's sequential softmax_merge rescales its running sums once per new maximum (a product of up to
// S factors), the GPU's warp-then-CTA order likewise: at most (4 S + 16) u relative error on either side of
// each weighted term. Per element: |out_gpu - out_cpu| <= 2 (4 S + 16) u sum_s w_s |o_s| / sum_s w_s l_s.
// A head of only empty states gives zeros (softmax_finish), exactly.
void run_merge_case(const MergeCase& mc, CaseReport& r, uint64_t seed) {
  const int H = mc.heads, G = mc.group, D = mc.d, S = mc.splits;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> um(-mc.m_range, mc.m_range), ul(1.0f, 50.0f), u01(0.0f, 1.0f);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float2> ml(size_t(H) * S * G);
  std::vector<float> po(size_t(H) * S * G * D);
  for (int h = 0; h < H; ++h)
    for (int s = 0; s < S; ++s)
      for (int g = 0; g < G; ++g) {
        const size_t at = (size_t(h) * S + s) * G + g;
        const bool empty = u01(rng) < mc.empty || (mc.empty_head && h == 1);
        const float l = ul(rng);
        ml[at] = empty ? make_float2(-INFINITY, 0.0f) : make_float2(um(rng), l);
        for (int i = 0; i < D; ++i) po[at * D + i] = empty ? 0.0f : l * n01(rng);
      }
  auto dml = gputest::upload(ml), dpo = gputest::upload(po);
  auto dout = gputest::poisoned(size_t(H) * G * D);
  cuda::synchronize();
  cuda::detail::CombineParams p;
  p.part_ml = dml.as<float2>();
  p.part_o = dpo.as<float>();
  p.num_heads = H;
  p.group = G;
  p.head_dim = D;
  p.total_splits = S;
  p.out = dout.as<float>();
  const cudaError_t e = cuda::detail::combine_states(p, nullptr);
  r.eq("combine_states launch", std::string(cudaGetErrorString(e)), std::string(cudaGetErrorString(cudaSuccess)));
  cuda::synchronize();
  const std::vector<float> got = gputest::download_f32(dout, size_t(H) * G * D);
  std::vector<float> ref(got.size());
  double worst = 0;
  for (int h = 0; h < H; ++h)
    for (int g = 0; g < G; ++g) {
      SoftmaxScalars st;
      std::vector<float> o(D, 0.0f);
      for (int s = 0; s < S; ++s) {
        const size_t at = (size_t(h) * S + s) * G + g;
        SoftmaxScalars b;
        b.m = ml[at].x;
        b.l = ml[at].y;
        softmax_merge(st, o.data(), b, &po[at * D], D);
      }
      float* out = &ref[(size_t(h) * G + g) * D];
      softmax_finish(st, o.data(), out, D);
      // The bound's weighted magnitudes, in double against the exact maximum.
      double L = 0;
      std::vector<double> A(D, 0.0);
      for (int s = 0; s < S; ++s) {
        const size_t at = (size_t(h) * S + s) * G + g;
        if (ml[at].x == -INFINITY) continue;
        const double w = std::exp(double(ml[at].x) - st.m);
        L += w * ml[at].y;
        for (int i = 0; i < D; ++i) A[i] += w * std::abs(po[at * D + i]);
      }
      for (int i = 0; i < D; ++i) {
        const double b = L > 0 ? 2.0 * (4.0 * S + 16.0) * kU * A[i] / L : 0.0;
        const double err = std::abs(double(got[(size_t(h) * G + g) * D + i]) - out[i]);
        if (std::isfinite(got[(size_t(h) * G + g) * D + i]))
          worst = std::max(worst, b > 0 ? err / b : (err > 0 ? INFINITY : 0.0));
      }
    }
  const gputest::Compare fd = gputest::compare(got, ref);
  r.none("output written", fd.unwritten, fd.unwritten ? "element " + std::to_string(fd.first_unwritten) : "");
  r.le("output err/bound", worst, 1.0);
  r.note("max-abs", fd.max_abs);
}

std::vector<ParityCase> merge_cases() {
  std::vector<MergeCase> list;
  for (int64_t s : tail_sizes()) list.push_back({3, 4, 128, int(s), 0.3, 30.0f, false});
  list.push_back({2, 8, 64, 40, 0.3, 30.0f, false});
  list.push_back({2, 1, 64, 1000, 0.5, 30.0f, false});
  list.push_back({3, 4, 128, 17, 0.0, 80.0f, false});  // maxima far apart: most weights underflow
  list.push_back({3, 4, 128, 9, 0.2, 30.0f, true});    // a head of empty states only
  std::vector<ParityCase> cases;
  uint64_t seed = 400;
  for (const MergeCase& mc : list) {
    char name[160];
    std::snprintf(name, sizeof name, "H %d G %d d %d splits %d empty %.2f m range %.0f%s", mc.heads, mc.group, mc.d,
                  mc.splits, mc.empty, mc.m_range, mc.empty_head ? ", a head of empty states" : "");
    cases.push_back({name, seed++, [mc](CaseReport& r, uint64_t s) { run_merge_case(mc, r, s); }});
  }
  return cases;
}
RETROINFER_PARITY_FAMILY(PartialStateMergeMatchesSoftmaxMerge,
                         "cuda::detail::combine_states vs softmax_merge / softmax_finish (softmax_state.h)",
                         merge_cases)

}  // namespace
}  // namespace retroinfer::parity
