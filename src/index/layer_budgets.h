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

// The attention mass the exact zones of index `wi` miss for n calibration queries, at each multiplier of
// kLayerBudgetMultipliers applied to zone_counts(num_clusters, cfg).n_retrieval. q: [n, num_heads_q, head_dim]
// f32 post-RoPE, the queries of the cache's last n tokens (positions kv.size() - n ...; each attends causally).
// A query head's mass outside the steady zone, the outliers and the top-scoring clusters (retro's own ranking:
// score_clusters over its GQA group) under exact softmax, averaged over query heads and queries. Returns
// kLayerBudgetMultipliers.size() values; all zero when the index is empty or n == 0.
// scale: the logit scale the layer decodes with.
std::vector<double> layer_missed_mass(const WaveIndex& wi, const KvCache& kv, const AttentionConfig& cfg,
                                      int num_heads_q, float scale, const float* q, int64_t n);

}  // namespace retroinfer::index
