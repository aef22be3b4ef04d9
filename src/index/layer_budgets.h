// Retrieval budgets by layer (docs/wave-index.md, "Retrieval budgets by layer"): the layers of a model do not
// need the same share of exact reads. Some attend almost only to their steady zone, others spread their
// attention over the whole context, and a uniform retrieval share starves the latter while the former waste
// theirs. After prefill, each layer measures, for the prompt's last queries, how much attention mass its exact
// zones would miss at several multiples of the nominal retrieval count (layer_missed_mass); the allocation then
// gives each layer the multiple that minimises the model's summed missed mass while the mean multiple stays 1,
// so the model reads as many tokens exactly as with uniform budgets.
#pragma once

#include <array>
#include <vector>

#include "index/wave_index.h"
#include "retroinfer/kv_cache.h"

namespace retroinfer::index {

// The multiples of the nominal retrieval count a layer may take. Multiples of 1/4 (the allocation counts in
// quarters); up to 4: a layer takes at most four times its share.
inline constexpr std::array<double, 8> kLayerBudgetMultipliers = {0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0};

// missed[l][m]: layer l's missed attention mass at kLayerBudgetMultipliers[m] (any non-negative measure, the
// same for every layer). Returns one multiplier per layer (a value of kLayerBudgetMultipliers) minimising the sum
// of the layers' missed mass subject to their mean being <= 1, ties to the smaller total. Exact (dynamic
// programming over quarter units). Throws Error when a row has the wrong length or a value is negative or NaN.
std::vector<double> allocate_layer_budgets(const std::vector<std::vector<double>>& missed);

// The retrieval zone's clusters at multiplier m are taken to be the n_m = zone_counts(clusters, cfg with
// retrieval_fraction x m).n_retrieval clusters holding the most attention mass of the query's GQA group: the
// calibration measures how concentrated each layer's attention is at cluster granularity (the mass even a
// perfect ranking leaves out at that size), not how well the centroid scores rank (on Qwen2.5-Coder at 4K both
// give nearly the same multiples). The mass outside the steady zone, the outliers and the retrieval zone is then
// the mass of the clusters outside the top n_m.

// n_m for each multiplier m of kLayerBudgetMultipliers: zone_counts(clusters, cfg with retrieval_fraction x m)
// .n_retrieval, ascending; cfg: the nominal configuration.
std::array<int, kLayerBudgetMultipliers.size()> layer_budget_retrieval_counts(int clusters, const AttentionConfig& cfg);

// Adds to missed[m], for each m of kLayerBudgetMultipliers, the mass of the clusters outside the n_m heaviest:
// group_mass[clusters], one (query, KV head)'s mass per cluster summed over its query heads; cfg: the nominal
// configuration (its retrieval_fraction unscaled). missed: kLayerBudgetMultipliers.size() values.
void add_missed_mass(const float* group_mass, int clusters, const AttentionConfig& cfg, double* missed);

// The calibration on the CPU: for n calibration queries (q: [n, num_heads_q, head_dim] f32 post-RoPE, the
// queries of the cache's last n tokens: positions kv.size() - n ...; each attends causally under exact softmax
// with logit scale `scale`), the mass index `wi` leaves out at each multiplier (add_missed_mass), averaged over
// query heads and queries. Returns kLayerBudgetMultipliers.size() values; all zero when the index is empty or
// n == 0. Throws Error for a shape mismatch or n > kv.size().
std::vector<double> layer_missed_mass(const WaveIndex& wi, const KvCache& kv, const AttentionConfig& cfg,
                                      int num_heads_q, float scale, const float* q, int64_t n);

// allocate_layer_budgets over the layers that have a curve (missed[l] non-empty); the others keep 1. Empty when
// fewer than two layers have one (nothing to share out).
std::vector<double> allocate_calibrated_layers(const std::vector<std::vector<double>>& missed);

// How many of the prompt's last queries per layer a session with attention `cfg` keeps during prefill: retro with
// layer_budget_queries > 0 keeps max(layer_budget_queries, 64); full keeps 64, so that a retro fork of its prefill
// (the eval's methods) can calibrate; every other method keeps none.
int64_t prompt_queries_to_keep(const AttentionConfig& cfg);

}  // namespace retroinfer::index
