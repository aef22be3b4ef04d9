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

std::array<int, kLayerBudgetMultipliers.size()> layer_budget_retrieval_counts(int clusters,
                                                                              const AttentionConfig& cfg) {
  std::array<int, kLayerBudgetMultipliers.size()> n{};
  for (size_t m = 0; m < n.size(); ++m) {
    AttentionConfig c = cfg;
    c.retrieval_fraction = std::min(1.0, cfg.retrieval_fraction * kLayerBudgetMultipliers[m]);
    n[m] = zone_counts(clusters, c).n_retrieval;
  }
  return n;
}

void add_missed_mass(const float* group_mass, int clusters, const AttentionConfig& cfg, double* missed) {
  if (clusters <= 0) return;
  const std::array<int, kLayerBudgetMultipliers.size()> counts = layer_budget_retrieval_counts(clusters, cfg);
  // Only the heaviest clusters of the largest multiple are ranked: a selection, then a sort of those (the sums
  // do not depend on how ties are ordered).
  const int most = counts.back();
  std::vector<int32_t> order(clusters);
  for (int j = 0; j < clusters; ++j) order[j] = j;
  const auto heavier = [&](int32_t a, int32_t b) { return group_mass[a] > group_mass[b]; };
  std::nth_element(order.begin(), order.begin() + most, order.end(), heavier);
  std::sort(order.begin(), order.begin() + most, heavier);
  double total = 0.0;
  for (int j = 0; j < clusters; ++j) total += group_mass[j];
  double taken_mass = 0.0;
  int taken = 0;
  for (size_t m = 0; m < kLayerBudgetMultipliers.size(); ++m) {
    for (; taken < counts[m]; ++taken) taken_mass += group_mass[order[taken]];
    missed[m] += std::max(0.0, total - taken_mass);
  }
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
  // Per (query, KV head) item its missed mass at each multiplier, summed over the group; merged in item order.
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
    std::vector<double> prob(static_cast<size_t>(pos) + 1);
    std::vector<float> group_mass(k, 0.0f);
    for (int g = 0; g < group; ++g) {
      const float* qh = qg + static_cast<size_t>(g) * d;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t t = 0; t <= pos; ++t) {
        prob[t] = static_cast<double>(kv.dot_key(h, t, qh)) * scale;
        mx = std::max(mx, prob[t]);
      }
      double z = 0.0;
      for (int64_t t = 0; t <= pos; ++t) z += (prob[t] = std::exp(prob[t] - mx));
      for (int j = 0; j < k; ++j) {
        double cm = 0.0;
        for (int64_t e = hi.offsets[j]; e < hi.offsets[j + 1]; ++e)
          if (hi.members[e] <= pos) cm += prob[hi.members[e]];
        group_mass[j] += static_cast<float>(cm / z);
      }
    }
    add_missed_mass(group_mass.data(), k, cfg, item_missed[w].data());
  }
  for (const auto& im : item_missed)
    for (size_t m = 0; m < nm; ++m) missed[m] += im[m];
  for (double& v : missed) v /= static_cast<double>(n) * num_heads_q;
  return missed;
}

std::vector<double> allocate_calibrated_layers(const std::vector<std::vector<double>>& missed) {
  std::vector<std::vector<double>> curves;
  for (const auto& m : missed)
    if (!m.empty()) curves.push_back(m);
  if (curves.size() < 2) return {};
  const std::vector<double> chosen = allocate_layer_budgets(curves);
  std::vector<double> out(missed.size(), 1.0);
  size_t c = 0;
  for (size_t l = 0; l < missed.size(); ++l)
    if (!missed[l].empty()) out[l] = chosen[c++];
  return out;
}

int64_t prompt_queries_to_keep(const AttentionConfig& cfg) {
  constexpr int64_t kQueriesForForks = 64;
  if (cfg.kind == AttentionKind::kRetro && cfg.layer_budget_queries > 0)
    return std::max<int64_t>(cfg.layer_budget_queries, kQueriesForForks);
  return cfg.kind == AttentionKind::kFull ? kQueriesForForks : 0;
}

}  // namespace retroinfer::index
