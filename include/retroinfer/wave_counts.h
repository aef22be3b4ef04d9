// The counting rules of the wave index, one definition for every place that sizes or selects something by
// them: the CPU methods (src/attention), the k-means (src/index), the CUDA layers (src/attention/cuda) and
// the memory planners (src/buffer, src/model). Inline for host and device code (RETROINFER_HD), like
// softmax_state.h. For a cache of n tokens with the parameters of AttentionConfig:
//   steady split    [0, sink_end) and [recent_begin, n) are steady: sink_end = min(sink, n), recent_begin =
//                   max(sink_end, n - window); the tokens between are indexable (the baselines select from
//                   them). Retro indexes them only when they make at least one cluster: fewer than
//                   tokens_per_cluster indexable tokens leave the index empty (every token steady).
//   clusters        the indexed tokens are cut into segments of segment_tokens (the last one may be
//                   shorter); a segment of L tokens gets max(1, ceil(L / tokens_per_cluster)) clusters.
//   zones           of C clusters, n_retrieval = ceil(retrieval_fraction * C) (at least 1 when the fraction
//                   is > 0) and n_estimation = ceil(estimation_fraction * C) capped by C - n_retrieval (0 with
//                   estimation off). The ceilings subtract kFractionSlack so that products like 0.07 * 100 =
//                   7.000000000000001 in double give 7, not 8.
//   baselines       quest / streaming / oracle read budget_tokens exact tokens beyond the steady zone, or,
//                   when budget_tokens < 0, round(retrieval_fraction * indexable tokens): the expected size of
//                   retro's retrieval zone at the same fraction. Quest reads floor(budget / page) pages, at
//                   least one when the budget is > 0.
//   index updates   while the tokens after the indexed region number at least window + update_tokens, the
//                   oldest update_tokens of them are indexed (update_clusters clusters): that tail holds at
//                   most window + update_tokens - 1 tokens between decode steps.
//   outliers        round(outlier_fraction * n) of n clustered tokens are kept out of the clusters; an
//                   outlier list holds the build's and those of every update that appending can trigger.
//   retrieval rows  a planner's bound on the retrieval zone's tokens: ceil(kRetrievalRowSlack *
//                   retrieval_fraction * indexed tokens) (the selected clusters may be larger than average).
// Every function assumes its inputs passed validate(AttentionConfig) (attention_config.h); none throws.
#pragma once

#include <math.h>  // ceil, llround: the global names, callable from host and device code

#include <cstdint>

#include "retroinfer/attention_config.h"
#include "retroinfer/dtype.h"  // RETROINFER_HD

namespace retroinfer {

// Subtracted inside the zones' ceilings, and the tolerance of validate's retrieval + estimation <= 1.
inline constexpr double kFractionSlack = 1e-9;
// Retrieval-zone tokens a planner reserves per expected retrieval token (a planning margin, not a bound
// measured on data: the n_r selected clusters can be larger than the average cluster).
inline constexpr double kRetrievalRowSlack = 2.0;
// The same for the wave buffer's execution buffer, which holds K and V rows (512 bytes per token and head at
// d = 128, where a token list holds 4): sized after the build for the n_r largest clusters of the most
// skewed head. On the benchmarks' synthetic K/V those reach 3.8x the expected retrieval tokens at 128K and
// ~2.8x at 1M (H200 runs: a 14 x 128K split session ran out of GPU memory under the 2.0 margin).
inline constexpr double kWaveExecRowSlack = 4.0;

// ---- Steady split --------------------------------------------------------------------------------------

struct SteadySplit {
  int64_t sink_end = 0;      // [0, sink_end): the sink tokens
  int64_t recent_begin = 0;  // [recent_begin, n): the window
  RETROINFER_HD int64_t indexed() const { return recent_begin - sink_end; }  // the indexable tokens between
};
RETROINFER_HD SteadySplit steady_split(int64_t num_tokens, int sink_tokens, int window_tokens) {
  SteadySplit s;
  s.sink_end = num_tokens < sink_tokens ? num_tokens : sink_tokens;
  const int64_t w = num_tokens - window_tokens;
  s.recent_begin = w > s.sink_end ? w : s.sink_end;
  return s;
}
RETROINFER_HD SteadySplit steady_split(int64_t num_tokens, const AttentionConfig& c) {
  return steady_split(num_tokens, c.sink_tokens, c.window_tokens);
}

// Tokens retro indexes: the indexable tokens of the split, or 0 when they are fewer than one cluster's worth.
RETROINFER_HD int64_t retro_indexed_tokens(const SteadySplit& s, int tokens_per_cluster) {
  return s.indexed() >= tokens_per_cluster ? s.indexed() : 0;
}

// ---- Clusters ------------------------------------------------------------------------------------------

// Segments of n indexed tokens: ceil(n / segment_tokens); 0 for n <= 0.
RETROINFER_HD int64_t segment_count(int64_t indexed_tokens, int segment_tokens) {
  return indexed_tokens > 0 ? (indexed_tokens + segment_tokens - 1) / segment_tokens : 0;
}
// Tokens of segment s (0-based) of n indexed tokens: segment_tokens, or what is left for the last one.
RETROINFER_HD int64_t segment_length(int64_t indexed_tokens, int segment_tokens, int64_t s) {
  const int64_t left = indexed_tokens - s * segment_tokens;
  return left < segment_tokens ? left : segment_tokens;
}
// Clusters of a segment of `segment_len` tokens: max(1, ceil(segment_len / tokens_per_cluster)).
RETROINFER_HD int segment_clusters(int64_t segment_len, int tokens_per_cluster) {
  const int64_t c = (segment_len + tokens_per_cluster - 1) / tokens_per_cluster;
  return c > 1 ? static_cast<int>(c) : 1;
}
// Clusters of one head's index over n indexed tokens (the sum over its segments); 0 for n <= 0.
RETROINFER_HD int64_t index_clusters(int64_t indexed_tokens, int tokens_per_cluster, int segment_tokens) {
  if (indexed_tokens <= 0) return 0;
  const int64_t full = indexed_tokens / segment_tokens, rest = indexed_tokens % segment_tokens;
  return full * segment_clusters(segment_tokens, tokens_per_cluster) +
         (rest > 0 ? segment_clusters(rest, tokens_per_cluster) : 0);
}
RETROINFER_HD int64_t index_clusters(int64_t indexed_tokens, const AttentionConfig& c) {
  return index_clusters(indexed_tokens, c.tokens_per_cluster, c.segment_tokens);
}

// ---- Zones ---------------------------------------------------------------------------------------------

struct ZoneCounts {
  int n_retrieval = 0;   // clusters attended exactly
  int n_estimation = 0;  // clusters estimated from centroid and value sum
};

// ceil(fraction * num_clusters - kFractionSlack), clamped to [0, num_clusters].
RETROINFER_HD int zone_share(int num_clusters, double fraction) {
  const double c = ceil(fraction * num_clusters - kFractionSlack);
  if (!(c > 0.0)) return 0;  // also NaN
  return c < num_clusters ? static_cast<int>(c) : num_clusters;
}
RETROINFER_HD ZoneCounts zone_counts(int num_clusters, double retrieval_fraction, double estimation_fraction,
                                     bool estimation) {
  ZoneCounts z;
  if (num_clusters <= 0) return z;
  z.n_retrieval = zone_share(num_clusters, retrieval_fraction);
  if (retrieval_fraction > 0.0 && z.n_retrieval < 1) z.n_retrieval = 1;
  if (estimation) {
    const int e = zone_share(num_clusters, estimation_fraction), rest = num_clusters - z.n_retrieval;
    z.n_estimation = e < rest ? e : rest;
  }
  return z;
}
RETROINFER_HD ZoneCounts zone_counts(int num_clusters, const AttentionConfig& c) {
  return zone_counts(num_clusters, c.retrieval_fraction, c.estimation_fraction, c.estimation);
}

// ---- Index updates -------------------------------------------------------------------------------------

// Whether an index update is due with `tail_tokens` tokens after the indexed region.
RETROINFER_HD bool index_update_due(int64_t tail_tokens, const AttentionConfig& c) {
  return tail_tokens >= int64_t{c.window_tokens} + c.update_tokens;
}
// The most tokens after the indexed region once the due updates ran.
RETROINFER_HD int64_t steady_tail_max(const AttentionConfig& c) {
  return int64_t{c.window_tokens} + c.update_tokens - 1;
}

// ---- Budgets and capacities ----------------------------------------------------------------------------

// Exact tokens of quest / streaming / oracle beyond the steady zone, for `indexable` tokens outside it.
RETROINFER_HD int64_t baseline_budget(int64_t budget_tokens, double retrieval_fraction, int64_t indexable) {
  return budget_tokens >= 0 ? budget_tokens : static_cast<int64_t>(llround(retrieval_fraction * double(indexable)));
}
RETROINFER_HD int64_t baseline_budget(const AttentionConfig& c, int64_t indexable) {
  return baseline_budget(c.budget_tokens, c.retrieval_fraction, indexable);
}
// Quest's pages for an exact-token budget: floor(budget / page_tokens), at least one when budget > 0.
RETROINFER_HD int64_t quest_budget_pages(int64_t budget, int page_tokens) {
  const int64_t k = budget / page_tokens;
  return budget > 0 && k == 0 ? 1 : k;
}

// Outlier tokens split off n clustered tokens: round(outlier_fraction * n).
RETROINFER_HD int64_t outlier_split_count(double outlier_fraction, int64_t num_tokens) {
  return static_cast<int64_t>(llround(outlier_fraction * double(num_tokens)));
}

// Outlier-list rows of one head: the build's outliers over `indexed_tokens` plus update_tokens' worth for every
// update that appending `appendable` tokens can trigger, and one more.
RETROINFER_HD int64_t outlier_capacity(double outlier_fraction, int64_t indexed_tokens, int64_t appendable,
                                       int update_tokens) {
  return outlier_split_count(outlier_fraction, indexed_tokens) +
         (appendable / update_tokens + 1) * outlier_split_count(outlier_fraction, update_tokens);
}

// A planner's bound on one head's retrieval-zone tokens over n indexed tokens.
RETROINFER_HD int64_t retrieval_rows_bound(double retrieval_fraction, int64_t indexed_tokens,
                                           double slack = kRetrievalRowSlack) {
  return static_cast<int64_t>(ceil(slack * retrieval_fraction * double(indexed_tokens)));
}

}  // namespace retroinfer
