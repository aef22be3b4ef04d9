// Retrieval budgets by layer: the calibration (missed attention mass) and the allocation (see layer_budgets.h).
#include "index/layer_budgets.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "retroinfer/error.h"

namespace retroinfer::index {

namespace {

// A multiplier in quarter units (every kLayerBudgetMultipliers value is a multiple of 1/4).
int quarters(double m) { return static_cast<int>(std::lround(m * 4.0)); }

}  // namespace

std::vector<double> allocate_layer_budgets(const std::vector<std::vector<double>>& missed) {
  const size_t nm = kLayerBudgetMultipliers.size();
  const auto layers = static_cast<int>(missed.size());
  for (int l = 0; l < layers; ++l) {
    RETROINFER_CHECK(missed[l].size() == nm, "layer budgets: layer ", l, " has ", missed[l].size(),
                     " missed-mass values, expected ", nm);
    for (double v : missed[l])
      RETROINFER_CHECK(v >= 0.0, "layer budgets: layer ", l, " has a negative or NaN missed mass (", v, ")");
  }
  if (layers == 0) return {};
  // best[u]: the least summed missed mass of the layers so far using u quarter units; choice[l][u] the
  // multiplier index layer l took on that path. Capacity: a mean multiple of 1 = 4 quarters per layer.
  const int cap = 4 * layers;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> best(cap + 1, kInf), next(cap + 1);
  std::vector<std::vector<int8_t>> choice(layers, std::vector<int8_t>(cap + 1, -1));
  best[0] = 0.0;
  for (int l = 0; l < layers; ++l) {
    std::fill(next.begin(), next.end(), kInf);
    for (int u = 0; u <= cap; ++u) {
      if (best[u] == kInf) continue;
      for (size_t m = 0; m < nm; ++m) {
        const int v = u + quarters(kLayerBudgetMultipliers[m]);
        if (v > cap) break;
        const double total = best[u] + missed[l][m];
        if (total < next[v]) {
          next[v] = total;
          choice[l][v] = static_cast<int8_t>(m);
        }
      }
    }
    best.swap(next);
  }
  // The least total; among equal totals the fewest units (ties to the smaller total budget).
  int u = 0;
  for (int v = 1; v <= cap; ++v)
    if (best[v] < best[u]) u = v;
  std::vector<double> out(layers);
  for (int l = layers - 1; l >= 0; --l) {
    const int m = choice[l][u];
    out[l] = kLayerBudgetMultipliers[m];
    u -= quarters(kLayerBudgetMultipliers[m]);
  }
  return out;
}

std::vector<double> layer_missed_mass(const WaveIndex& wi, const KvCache& kv, const AttentionConfig& cfg,
                                      int num_heads_q, float scale, const float* q, int64_t n) {
  const size_t nm = kLayerBudgetMultipliers.size();
  std::vector<double> missed(nm, 0.0);
  const int nh = kv.num_heads_kv(), d = kv.head_dim();
  RETROINFER_CHECK(num_heads_q > 0 && num_heads_q % nh == 0, "layer budgets: ", num_heads_q,
                   " query heads do not group onto ", nh, " KV heads");
  RETROINFER_CHECK(n >= 0 && n <= kv.size(), "layer budgets: ", n, " calibration queries for a cache of ",
                   kv.size(), " tokens");
  if (n == 0 || wi.indexed_tokens() == 0 || static_cast<int>(wi.heads.size()) != nh) return missed;
  const int group = num_heads_q / nh;
  const int64_t size = kv.size();
  // Per (query, KV head) item: its group's mass missed at each multiplier, summed over the group.
  std::vector<std::vector<double>> item_missed(static_cast<size_t>(n) * nh, std::vector<double>(nm, 0.0));
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t w = 0; w < n * nh; ++w) {
    const int64_t i = w / nh;
    const int h = static_cast<int>(w % nh);
    const int64_t pos = size - n + i;  // the query's own position; it sees tokens [0, pos]
    const HeadIndex& hi = wi.heads[h];
    const int k = hi.num_clusters();
    if (k == 0) continue;
    const float* qg = q + (static_cast<size_t>(i) * num_heads_q + static_cast<size_t>(h) * group) * d;
    // Retro's ranking of the clusters for this group: the order select_zones takes them in.
    std::vector<float> logits(static_cast<size_t>(group) * k), scores(k);
    score_clusters(hi, qg, group, scale, logits.data(), scores.data());
    std::vector<int32_t> order(k);
    for (int j = 0; j < k; ++j) order[j] = j;
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return scores[a] > scores[b]; });
    std::vector<double> prob(static_cast<size_t>(pos) + 1);
    for (int g = 0; g < group; ++g) {
      const float* qh = qg + static_cast<size_t>(g) * d;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t t = 0; t <= pos; ++t) {
        prob[t] = static_cast<double>(kv.dot_key(h, t, qh)) * scale;
        mx = std::max(mx, prob[t]);
      }
      double z = 0.0;
      for (int64_t t = 0; t <= pos; ++t) z += (prob[t] = std::exp(prob[t] - mx));
      for (int64_t t = 0; t <= pos; ++t) prob[t] /= z;
      // Mass read exactly whatever the budget: the steady zone and the outliers.
      double exact = 0.0;
      for (int64_t t = 0; t <= pos; ++t)
        if (t < wi.indexed_begin || t >= wi.indexed_end) exact += prob[t];
      for (int64_t t : hi.outliers)
        if (t <= pos) exact += prob[t];
      // The retrieval zone at each multiplier: the first n_retrieval clusters of retro's ranking.
      double retrieved = 0.0;
      int taken = 0;
      for (size_t m = 0; m < nm; ++m) {
        AttentionConfig c = cfg;
        c.retrieval_fraction = std::min(1.0, cfg.retrieval_fraction * kLayerBudgetMultipliers[m]);
        const int want = zone_counts(k, c).n_retrieval;
        for (; taken < want && taken < k; ++taken) {
          const int32_t j = order[taken];
          if (hi.sizes[j] == 0) continue;
          for (int64_t e = hi.offsets[j]; e < hi.offsets[j + 1]; ++e)
            if (hi.members[e] <= pos) retrieved += prob[hi.members[e]];
        }
        item_missed[w][m] += std::max(0.0, 1.0 - exact - retrieved);
      }
    }
  }
  for (const auto& im : item_missed)
    for (size_t m = 0; m < nm; ++m) missed[m] += im[m];
  for (double& v : missed) v /= static_cast<double>(n) * num_heads_q;
  return missed;
}

}  // namespace retroinfer::index
