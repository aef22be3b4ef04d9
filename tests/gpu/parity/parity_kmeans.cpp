// The wave index's k-means on the GPU against the CPU's:
//   KMeansBuildMatchesSegmentedKMeans: RetroLayer::build's index (downloaded with debug_state) against
//     index::segmented_kmeans on the same bf16 keys, and the indexed region against wave_counts.h's
//     steady_split / retro_indexed_tokens;
//   IndexUpdateMatchesBlockKMeans: RetroLayer::append's index updates against attention::RetroAttention's
//     (index::index_block: block_kmeans + split_outliers) on the same tokens.
//
// Assignments cannot agree exactly: the GPU scores assignments with int8 operands, the CPU in f32
// (sgemm), and where two centroids score within that rounding the argmax can differ; iterations then carry a
// flip on. So the clustering is compared through its quality (index::kmeans_objective, the spherical
// objective both maximise) and exact structure (cluster counts, CSR, sizes, sums), and, with no iteration
// (one assignment to the initial centroids), every differing token must be a near-tie of the GPU's rounding.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "attention/retro.h"
#include "parity/parity_data.h"
#include "retroinfer/wave_counts.h"

namespace retroinfer::parity {
namespace {

// Bound on |objective_gpu - objective_cpu| / |objective_cpu|: kObjectiveRel + 1 / n for n clustered tokens.
// Equal clusterings give equal objectives; the near-tie flips above move it by measured ~4e-5 after
// convergence (9 + 1 iterations on 2000 tokens, 1 + 1 on 6000), ~1e-2 after 2 spherical iterations from the
// start (not converged: an early flip moves the later states more) and, on a few dozen tokens, by about one
// token's share of the objective per flip (2.9% with one flip among 21 tokens, 2.6% in a 64-token block). A
// structural error (a token in another segment's cluster, a stale or unnormalised centroid, a lost member)
// costs > 10%.
constexpr double kObjectiveRel = 0.03;
double objective_bound(int64_t n) { return kObjectiveRel + 1.0 / double(std::max<int64_t>(n, 1)); }
// Bound on the share of tokens whose final cluster differs after iterating: the flips compound over the
// iterations into different but equally good clusterings (measured up to 13%); 30% still fails an
// assignment that ignores the keys or the segments. Not checked where keys
// repeat: equal centroids of different ids tie there, each side taking the lowest id under its own
// rounding, so ids differ while the clustering (objective) is the same.
constexpr double kIteratedMismatch = 0.3;

struct KMeansCase {
  std::string name;
  int num_seqs = 1, hkv = 2, d = 128;
  int64_t n = 1000;
  int segment_tokens = 256, tokens_per_cluster = 16, segment_iters = 1, global_iters = 1;
  int centres = 8;
  float spread = 0.5f;
  int sink = 4, window = 8;
};

AttentionConfig config_of(const KMeansCase& kc) {
  AttentionConfig cfg;
  cfg.sink_tokens = kc.sink;
  cfg.window_tokens = kc.window;
  cfg.segment_tokens = kc.segment_tokens;
  cfg.tokens_per_cluster = kc.tokens_per_cluster;
  cfg.kmeans_segment_iters = kc.segment_iters;
  cfg.kmeans_global_iters = kc.global_iters;
  return cfg;
}

// Structure and sums of one head's GPU index over index tokens [0, n_idx) (KV rows from idx_begin; an
// assignment of -1 is an outlier, in no cluster):
//   CSR offsets from 0 to the clustered count, members grouped by the assignment, ascending within a
//   cluster, each clustered token exactly once, sizes = member counts;
//   value sums = the f32 sums of the members' bf16 values: a sequential f32 sum of `size` terms is off by at
//   most (size - 1) u sum |v| (u = 2^-24), bound (size + 1) u sum |v|;
//   after a final plain-mean step, centroid = the mean of the members' keys: the GPU sums the f32
//   differences k - mu (one rounding each, then size - 1 in the sum: <= (size + 1) u mean |k - mu| after the
//   division), divides (u) and adds mu back (u (|c| + |mu|)); bound twice that.
void check_index(CaseReport& r, const KvData& kv, int h, int64_t idx_begin, int64_t n_idx,
                 const cuda::RetroDebugState& st, bool plain_mean) {
  const int d = kv.d, C = st.num_clusters;
  r.eq("offsets size", st.offsets.size(), size_t(C) + 1);
  r.eq("assignment size", int64_t(st.assignment.size()), n_idx);
  if (st.offsets.size() != size_t(C) + 1 || int64_t(st.assignment.size()) != n_idx) return;
  int64_t bad = 0;
  std::string first;
  auto flag = [&](const std::string& what) {
    if (bad++ == 0) first = what;
  };
  const int64_t clustered = std::count_if(st.assignment.begin(), st.assignment.end(), [](int32_t a) { return a >= 0; });
  if (st.offsets.front() != 0 || st.offsets.back() != clustered || int64_t(st.members.size()) < clustered)
    flag("offsets [" + std::to_string(st.offsets.front()) + ", " + std::to_string(st.offsets.back()) + "] for " +
         std::to_string(clustered) + " clustered tokens");
  if (st.mean.size() != size_t(d) || (plain_mean && st.centroids.size() != size_t(C) * d)) {
    r.fail("debug state", "no f32 mean / centroids");
    return;
  }
  std::vector<int> seen(n_idx, 0);
  double vs_ratio = 0.0, c_ratio = 0.0;
  std::vector<double> vs(d), vabs(d), ks(d), kabs(d);
  for (int c = 0; c < C && bad == 0; ++c) {
    const int b = st.offsets[c], e = st.offsets[c + 1];
    if (e < b || e > st.offsets.back()) {
      flag("offsets of cluster " + std::to_string(c));
      break;
    }
    if (st.sizes[c] != e - b) flag("size of cluster " + std::to_string(c));
    std::fill(vs.begin(), vs.end(), 0.0);
    std::fill(vabs.begin(), vabs.end(), 0.0);
    std::fill(ks.begin(), ks.end(), 0.0);
    std::fill(kabs.begin(), kabs.end(), 0.0);
    for (int m = b; m < e; ++m) {
      const int32_t t = st.members[m];
      if (t < 0 || t >= n_idx) {
        flag("member " + std::to_string(t) + " of cluster " + std::to_string(c));
        break;
      }
      ++seen[t];
      if (st.assignment[t] != c) flag("token " + std::to_string(t) + " listed in cluster " + std::to_string(c));
      if (m > b && st.members[m - 1] >= t) flag("members of cluster " + std::to_string(c) + " not ascending");
      for (int i = 0; i < d; ++i) {
        const double v = kv.value(h, idx_begin + t, i), k = kv.key(h, idx_begin + t, i);
        vs[i] += v;
        vabs[i] += std::abs(v);
        ks[i] += k;
        kabs[i] += std::abs(k - st.mean[i]);
      }
    }
    const int size = e - b;
    for (int i = 0; i < d && !st.value_sums.empty(); ++i) {
      const double bound = (size + 1) * kU * vabs[i] + 1e-30;
      vs_ratio = std::max(vs_ratio, std::abs(st.value_sums[size_t(c) * d + i] - vs[i]) / bound);
      if (plain_mean && size > 0) {
        const double cen = st.centroids[size_t(c) * d + i];
        const double cb =
            2.0 * ((size + 1) * kU * kabs[i] / size + kU * (std::abs(cen) + std::abs(st.mean[i]))) + 1e-30;
        c_ratio = std::max(c_ratio, std::abs(cen - ks[i] / size) / cb);
      }
    }
  }
  for (int64_t t = 0; t < n_idx && bad == 0; ++t)
    if (seen[t] != (st.assignment[t] >= 0 ? 1 : 0))
      flag("token " + std::to_string(t) + " in " + std::to_string(seen[t]) + " clusters");
  r.none("CSR / sizes / assignment", bad, first);
  r.le("value sums err/bound", vs_ratio, 1.0);
  if (plain_mean) r.le("centroid = member mean err/bound", c_ratio, 1.0);
}

// Iterations 0: every token assigned once, within its segment, to the initial centroids (normalised
// centred keys). With x the centred key and u_j a unit centroid (both the CPU's: the CPU's mean, the CPU's
// centroid minus it), the GPU's score of centroid j (in units of the key's scale, which the argmax drops) is
// off from x . u_j by at most
//   the int8 operands (per-row scales s_x = max|x| / 127, s_u = max|u_j| / 127, half a step each):
//     s_x / 2 ||u_j||_1 + s_u / 2 (||x||_1 + d s_x / 2);
//   the GPU's own mean (two-pass f32 sums, relative error ~1e-6) shifting x and u_j: 1e-5 ||x||_1 max|u_j|;
//   the f32 normalisation of its initial centroid and the f32 conversion and scaling of the integer dot
//   (a few u relative): covered by a margin of 2^-8 sum_i |x_i u_ji|.
// A token whose GPU cluster a differs from the CPU's b must be a tie within that rounding:
// |x . u_b - x . u_a| <= e_a + e_b (b is the best of its segment, so a much better a would be a cluster of
// another segment).
void check_initial_assignment(CaseReport& r, const std::vector<float>& keys, int64_t n, int d,
                              const index::ClusterIndex& cpu, const cuda::RetroDebugState& st) {
  std::vector<double> acc(d, 0.0);
  for (int64_t t = 0; t < n; ++t)
    for (int i = 0; i < d; ++i) acc[i] += keys[t * d + i];
  std::vector<float> mu(d);
  for (int i = 0; i < d; ++i) mu[i] = static_cast<float>(acc[i] / double(n));  // segmented_kmeans's mean
  auto score = [&](int64_t t, int j, double* err) {
    double s = 0, prod = 0, x1 = 0, u1 = 0, xmax = 0, umax = 0;
    for (int i = 0; i < d; ++i) {
      const double x = keys[t * d + i] - mu[i];
      const double u = cpu.centroids[size_t(j) * d + i] - mu[i];
      s += x * u;
      prod += std::abs(x * u);
      x1 += std::abs(x);
      u1 += std::abs(u);
      xmax = std::max(xmax, std::abs(x));
      umax = std::max(umax, std::abs(u));
    }
    const double sx = xmax / 127, su = umax / 127;
    *err = 0x1p-8 * prod + sx / 2 * u1 + su / 2 * (x1 + d * sx / 2) + 1e-5 * x1 * umax;
    return s;
  };
  int64_t differ = 0, not_ties = 0;
  std::string first;
  for (int64_t t = 0; t < n; ++t) {
    const int a = st.assignment[t], b = cpu.assignment[t];
    if (a == b) continue;
    ++differ;
    double ea = 0, eb = 0;
    const double sa = a >= 0 && a < cpu.num_clusters ? score(t, a, &ea) : -INFINITY, sb = score(t, b, &eb);
    if (!(std::abs(sb - sa) <= ea + eb) && not_ties++ == 0)
      first = "token " + std::to_string(t) + ": gpu " + std::to_string(a) + " (" + std::to_string(sa) + "), cpu " +
              std::to_string(b) + " (" + std::to_string(sb) + "), rounding " + std::to_string(ea + eb);
  }
  r.none("initial assignment differs beyond ties", not_ties, first);
  r.note("initial assignment differing (ties)", double(differ) / double(std::max<int64_t>(n, 1)));
}

void run_kmeans_case(const KMeansCase& kc, CaseReport& r, uint64_t seed) {
  const int H = kc.num_seqs * kc.hkv, d = kc.d;
  const AttentionConfig cfg = config_of(kc);
  const KvData kv = gputest::make_kv(H, kc.n, kc.n + 3, d, seed, kc.centres, kc.spread);  // rows past n: NaN
  cuda::RetroLayer layer(AttentionShape{kc.hkv * 2, kc.hkv, d}, cfg, kc.num_seqs);
  auto dk = gputest::upload(kv.k), dv = gputest::upload(kv.v);
  layer.build(dk.as<uint16_t>(), dv.as<uint16_t>(), kc.n, kc.n + 3);
  const SteadySplit split = steady_split(kc.n, cfg);
  const int64_t n_idx = retro_indexed_tokens(split, cfg.tokens_per_cluster);
  r.eq("indexed tokens", layer.indexed_tokens(), n_idx);
  if (n_idx == 0 || layer.indexed_tokens() != n_idx) {
    r.eq("clusters", layer.num_clusters(), 0);
    return;
  }
  const int64_t begin = split.sink_end;
  r.eq("indexed begin", layer.indexed_begin(), begin);
  const index::KMeansParams kp = kmeans_params(cfg);
  double worst_rel = 0.0, mism = 0.0;
  for (int h = 0; h < H; ++h) {
    const std::vector<float> keys = rows(kv, h, begin, n_idx, true),
                             values = rows(kv, h, begin, n_idx, false);
    const index::ClusterIndex cpu = index::segmented_kmeans(keys.data(), values.data(), n_idx, d, kp);
    const cuda::RetroDebugState st = layer.debug_state(h);
    r.eq("clusters", st.num_clusters, cpu.num_clusters);
    if (st.num_clusters != cpu.num_clusters) continue;
    check_index(r, kv, h, begin, n_idx, st, kc.global_iters > 0);
    if (!r.ok()) continue;
    const double og = index::kmeans_objective(keys.data(), n_idx, d, cluster_index(st, d));
    const double oc = index::kmeans_objective(keys.data(), n_idx, d, cpu);
    const double rel = std::abs(og - oc) / std::max(std::abs(oc), 1e-30);
    worst_rel = std::max(worst_rel, rel);
    r.le("objective |gpu - cpu| / cpu", rel, objective_bound(n_idx),
         "gpu " + std::to_string(og) + ", cpu " + std::to_string(oc));
    int64_t differ = 0;
    for (int64_t t = 0; t < n_idx; ++t) differ += st.assignment[t] != cpu.assignment[t];
    mism = std::max(mism, double(differ) / double(n_idx));
    if (kc.segment_iters + kc.global_iters == 0) check_initial_assignment(r, keys, n_idx, d, cpu, st);
  }
  r.note("clusters per head", layer.num_clusters());
  if (kc.segment_iters + kc.global_iters == 0) return;
  if (kc.spread > 0.0f)
    r.le("assignment mismatch share", mism, kIteratedMismatch);
  else
    r.note("assignment mismatch share (repeated keys)", mism);
}

std::vector<ParityCase> kmeans_cases() {
  std::vector<KMeansCase> list;
  auto add = [&](KMeansCase c) { list.push_back(std::move(c)); };
  // Initial assignment only (no iteration), both head dims.
  add({"no iteration d64", 1, 2, 64, 1000, 256, 16, 0, 0});
  add({"no iteration d128", 1, 2, 128, 1000, 256, 16, 0, 0});
  // Iterations: the paper's 9 + 1, the default 1 + 1 on several segments, spherical only, small clusters,
  // two sequences in one build.
  add({"9 + 1 iterations", 1, 2, 128, 2000, 512, 16, 9, 1, 12, 0.6f});
  add({"defaults, 3 segments", 1, 2, 128, 6000, 2048, 16, 1, 1, 24, 0.7f});
  add({"spherical only (2 + 0)", 1, 2, 128, 1500, 512, 16, 2, 0});
  add({"tokens_per_cluster 4, d64", 1, 1, 64, 700, 256, 4, 1, 1});
  add({"two sequences", 2, 2, 128, 900, 256, 16, 1, 1});
  // Duplicate keys (3 distinct per head): equal initial centroids, ties to the lowest id, empty clusters.
  add({"duplicate keys", 1, 2, 64, 600, 256, 16, 3, 1, 3, 0.0f});
  // Token counts around the steady zone (sink 4 + window 8) and the one-cluster threshold (16 indexed
  // tokens), segments of 64 with 1-token and 1-short tails.
  for (int64_t n : tail_sizes()) add({"tail n " + std::to_string(n), 1, 1, 64, n, 64, 16, 3, 1});
  for (int64_t n_idx : {15, 16, 17, 63, 64, 65, 127, 128, 129, 193})
    add({"indexed " + std::to_string(n_idx) + ", segment 64", 1, 1, 64, n_idx + 12, 64, 16, 3, 1});
  std::vector<ParityCase> cases;
  uint64_t seed = 500;
  for (const KMeansCase& kc : list) {
    char shape[160];
    std::snprintf(shape, sizeof shape, "%s (seqs %d hkv %d d %d n %lld seg %d tpc %d iters %d+%d)", kc.name.c_str(),
                  kc.num_seqs, kc.hkv, kc.d, (long long)kc.n, kc.segment_tokens, kc.tokens_per_cluster,
                  kc.segment_iters, kc.global_iters);
    cases.push_back({shape, seed++, [kc](CaseReport& r, uint64_t s) { run_kmeans_case(kc, r, s); }});
  }
  return cases;
}

RETROINFER_PARITY_FAMILY(KMeansBuildMatchesSegmentedKMeans,
                         "RetroLayer::build index vs index::segmented_kmeans on the same bf16 keys", kmeans_cases)

// ---- index updates ----

struct UpdateCase {
  std::string name;
  int hkv = 2, d = 128;
  int64_t n0 = 2000;
  int steps = 150;
  bool outliers = false;
};

// RetroLayer and RetroAttention side by side while tokens are appended (update_tokens 64, update_clusters
// 4, window 32): after every step where an update falls due, the same number of updates, the same indexed
// region and cluster count; per head the outliers (when on) as many as the CPU's, every indexed token in
// exactly one cluster or the outliers; the appended block's clusters (outliers off) as good as
// index::block_kmeans's on the block's tokens (objective_bound), with the block's CSR and sums checked as
// check_index does.
void run_update_case(const UpdateCase& uc, CaseReport& r, uint64_t seed) {
  AttentionConfig cfg;
  cfg.sink_tokens = 4;
  cfg.window_tokens = 32;
  cfg.segment_tokens = 1024;
  cfg.update_tokens = 64;
  cfg.update_clusters = 4;
  cfg.outlier_fraction = uc.outliers ? 0.01 : 0.0;
  const int d = uc.d, H = uc.hkv;
  const int64_t max_n = uc.n0 + uc.steps;
  KvData kv = gputest::make_kv(H, max_n, max_n, d, seed, 16, 0.8f);
  std::vector<uint16_t> k = kv.k, v = kv.v;  // device copy: rows past the current count NaN
  for (int h = 0; h < H; ++h)
    for (int64_t t = uc.n0; t < max_n; ++t)
      for (int i = 0; i < d; ++i) k[(h * max_n + t) * d + i] = v[(h * max_n + t) * d + i] = 0x7fc0;
  auto dk = gputest::upload(k), dv = gputest::upload(v);
  const AttentionShape shape{H * 2, H, d};
  cuda::RetroLayer layer(shape, cfg, 1);
  layer.set_outlier_zone(uc.outliers);
  layer.build(dk.as<uint16_t>(), dv.as<uint16_t>(), uc.n0, max_n);
  KvCache cache = to_cache(kv, 0, H, uc.n0);
  attention::RetroAttention cpu(cfg, shape);
  cpu.on_prefill(cache);
  int64_t checked_updates = 0;
  for (int i = 0; i <= uc.steps; ++i) {
    const int64_t n = uc.n0 + i;
    const int64_t before = layer.num_updates();
    if (i > 0) {
      const size_t row = size_t(d) * 2;
      for (int h = 0; h < H; ++h) {
        const size_t at = (size_t(h) * max_n + n - 1) * d;
        dk.upload(kv.k.data() + at, row, at * 2);
        dv.upload(kv.v.data() + at, row, at * 2);
      }
      std::vector<float> kr(size_t(H) * d), vr(kr.size());
      for (int h = 0; h < H; ++h)
        for (int j = 0; j < d; ++j) {
          kr[size_t(h) * d + j] = kv.key(h, n - 1, j);
          vr[size_t(h) * d + j] = kv.value(h, n - 1, j);
        }
      cache.append(kr.data(), vr.data(), 1);
      layer.append(n);
      cpu.sync(cache);
    }
    if (i != 0 && layer.num_updates() == before && i != uc.steps) continue;
    const index::WaveIndex& wi = cpu.wave_index();
    const std::string at = "n " + std::to_string(n);
    r.eq("updates", layer.num_updates(), cpu.num_updates(), at);
    r.eq("indexed tokens", layer.indexed_tokens(), wi.indexed_tokens(), at);
    if (wi.indexed_tokens() > 0) r.eq("indexed begin", layer.indexed_begin(), wi.indexed_begin, at);
    for (int h = 0; h < H; ++h) {
      const index::HeadIndex& hi = wi.heads[h];
      const cuda::RetroDebugState st = layer.debug_state(h);
      const std::string ah = at + " head " + std::to_string(h);
      r.eq("clusters", st.num_clusters, hi.num_clusters(), ah);
      const std::vector<int32_t> out = layer.outliers(h);
      r.eq("outliers", out.size(), hi.outliers.size(), ah);
      const int64_t ib = layer.indexed_begin(), ni = layer.indexed_tokens();
      if (ni == 0) continue;
      std::vector<int64_t> all;
      for (int32_t m : st.members) all.push_back(ib + m);
      for (int32_t t : out) all.push_back(t);
      std::sort(all.begin(), all.end());
      std::vector<int64_t> want(ni);
      std::iota(want.begin(), want.end(), ib);
      expect_same(r, "clustered + outliers = indexed tokens", all, want);
      check_index(r, kv, h, ib, ni, st, false);
      if (uc.outliers || layer.num_updates() == 0 || st.num_clusters != hi.num_clusters()) continue;
      // The last update's block: its clusters and tokens (index tokens [nb0, nb0 + update_tokens)).
      const int cb0 = st.num_clusters - cfg.update_clusters;
      const int64_t nb0 = ni - cfg.update_tokens;
      const std::vector<float> keys = rows(kv, h, ib + nb0, cfg.update_tokens, true),
                               values = rows(kv, h, ib + nb0, cfg.update_tokens, false);
      const index::ClusterIndex ref = index::block_kmeans(keys.data(), values.data(), cfg.update_tokens, d,
                                                          cfg.update_clusters, kmeans_params(cfg));
      index::ClusterIndex blk;
      blk.num_clusters = cfg.update_clusters;
      blk.head_dim = d;
      blk.centroids.assign(st.centroids.begin() + size_t(cb0) * d, st.centroids.end());
      for (int64_t t = nb0; t < ni; ++t) blk.assignment.push_back(st.assignment[t] - cb0);
      int64_t outside = 0;
      for (int32_t a : blk.assignment) outside += a < 0 || a >= cfg.update_clusters;
      r.none("block tokens in the block's clusters", outside);
      if (outside > 0) continue;
      const double og = index::kmeans_objective(keys.data(), cfg.update_tokens, d, blk);
      const double oc = index::kmeans_objective(keys.data(), cfg.update_tokens, d, ref);
      r.le("block objective |gpu - cpu| / cpu", std::abs(og - oc) / std::max(std::abs(oc), 1e-30),
           objective_bound(cfg.update_tokens));
      ++checked_updates;
    }
  }
  r.note("updates", double(layer.num_updates()));
  r.note("block objectives compared", double(checked_updates));
}

std::vector<ParityCase> update_cases() {
  const std::vector<UpdateCase> list{
      {"two updates", 2, 128, 2000, 150, false},
      {"two updates, outlier zone", 2, 128, 2000, 150, true},
      {"d64, first update at step 64", 1, 64, 100, 130, false},
      {"empty prompt index: the first update builds it", 2, 64, 40, 130, false},
  };
  std::vector<ParityCase> cases;
  uint64_t seed = 900;
  for (const UpdateCase& uc : list) {
    char shape[160];
    std::snprintf(shape, sizeof shape, "%s (hkv %d d %d n0 %lld steps %d)", uc.name.c_str(), uc.hkv, uc.d,
                  (long long)uc.n0, uc.steps);
    cases.push_back({shape, seed++, [uc](CaseReport& r, uint64_t s) { run_update_case(uc, r, s); }});
  }
  return cases;
}

RETROINFER_PARITY_FAMILY(IndexUpdateMatchesBlockKMeans,
                         "RetroLayer::append index updates vs attention::RetroAttention::sync (index::block_kmeans)",
                         update_cases)

}  // namespace
}  // namespace retroinfer::parity
