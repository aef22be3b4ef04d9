// `retroinfer eval needle`: why retro misses needles. For a RULER-style needle sample (tasks.h), full
// attention answers greedily; that answer is then teacher-forced through retro (one fork per retro
// variant), and at every answer step, per layer and KV head, the probe records where the needle's value
// tokens and the true attention mass sit in retro's zones and in the oracle top-k's exact set at the same
// budget, and for every needle token the oracle reads exactly but retro does not, the size and the score
// rank of the cluster holding it (under retro's score, the sum over the GQA group of per-head softmax
// probabilities, and under the max over the group instead). CPU runner only (it reads every layer's KV
// cache through Session::set_attention_observer).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "eval/tasks.h"
#include "index/wave_index.h"
#include "retroinfer/model.h"
#include "retroinfer/tokenizer.h"

namespace retroinfer::eval {

// True attention probabilities of the query heads qg ([group, head_dim] f32) of KV head kvh over every
// cached token, each head normalised over the whole cache. out: [group, kv.size()] row-major.
void attention_probs(const KvCache& kv, int kvh, const float* qg, int group, float scale, std::vector<float>& out);

// One (layer, KV head, step), or a sum of them.
struct HeadCoverage {
  int64_t needle = 0;           // needle tokens
  int64_t in_oracle = 0;        // ... in the oracle's exact set (steady zone included)
  int64_t in_oracle_retro = 0;  // ... in both the oracle's and retro's exact sets
  int64_t in_retro = 0;         // ... in retro's exact set (steady, outlier, retrieval)
  int64_t in_retro_est = 0;     // ... in retro's estimation zone
  // True attention mass, mean over the group's query heads:
  double needle_mass = 0.0;     // on the needle tokens
  double mass_oracle = 0.0;     // on the oracle's exact set
  double mass_retro = 0.0;      // on retro's exact set
  double mass_retro_est = 0.0;  // on retro's estimation zone
  HeadCoverage& operator+=(const HeadCoverage& o);
};
// probs: [group, size] (attention_probs); oracle_zones, retro_zones: [size] AttentionMethod zone codes
// (kZoneIgnored / kZoneExact / kZoneEstimated); needle: token positions in [0, size). Throws Error on a
// size mismatch or a needle position out of range.
HeadCoverage head_coverage(std::span<const float> probs, int group, std::span<const int64_t> needle,
                           std::span<const uint8_t> oracle_zones, std::span<const uint8_t> retro_zones);

// Where a token sits in one head's wave index for a query.
struct ClusterRank {
  int32_t cluster = -1;   // -1: in no cluster (steady or outlier zone)
  int32_t size = 0;       // members of that cluster
  int32_t rank_sum = -1;  // rank of the cluster under retro's score (index::score_clusters), 0 = best
  int32_t rank_max = -1;  // rank under the max over the group's per-head softmax probabilities instead
  float centroid_gap = 0.0f;  // max over the group of (q.k - q.c) * scale: token logit above its centroid's
};
// hi: one KV head's index; qg: [group, head_dim] f32; kv: the cache the index was built on (for the
// token's key). Ranks count the non-empty clusters scoring strictly higher, plus equal ones of lower id
// (select_zones' order). One entry per token.
std::vector<ClusterRank> cluster_ranks(const index::HeadIndex& hi, const KvCache& kv, int kvh, const float* qg,
                                       int group, float scale, std::span<const int64_t> tokens);

// The token range [begin, end) of `prompt`'s encoding covered by its bytes [byte_begin, byte_end), measured
// as encode(prompt[0, byte_begin)).size() and encode(prompt[0, byte_end)).size() (BPE merges across the
// boundary can shift either end by a token).
std::pair<int64_t, int64_t> token_span(const Tokenizer& tok, std::string_view prompt, size_t byte_begin,
                                       size_t byte_end);

// A retro variant: `base` (kind set to retro) changed by the ':'-separated items of spec: c<N> tokens per
// cluster, r<F> retrieval fraction, e<F> estimation fraction, noest (estimation off), i<N> k-means segment
// iterations, g<N> global iterations, o<F> outlier fraction; e.g. "c8", "c16:r0.036", "c16:noest". The
// result is validated; throws Error naming the bad item otherwise.
AttentionConfig retro_variant(const AttentionConfig& base, std::string_view spec);

struct NeedleProbeOptions {
  std::string task = "niah_single_3";
  int64_t context = 2048;
  std::vector<int> samples = {0, 1, 2};
  AttentionConfig attention;                      // retro settings shared by every variant
  std::vector<std::string> variants = {"c16", "c8"};  // retro variants (retro_variant specs)
  DType kv_dtype = DType::kF32;
  int prefill_chunk = 512;
  int max_steps = 40;  // cap on full's greedy answer (it stops earlier once every reference is in it)
  std::function<void(std::string_view)> progress;
};

// Runs the probe; returns {"samples": [...], "variants": [...]} (per variant: totals, per-layer coverage,
// the missed needle tokens' cluster sizes and ranks, end-to-end teacher-forced NLL / top-1 agreement; the
// oracle's end-to-end figures per sample as well).
nlohmann::json run_needle_probe(const Model& model, const Tokenizer& tok, const TaskGenerator& gen,
                                const NeedleProbeOptions& opt);

}  // namespace retroinfer::eval
