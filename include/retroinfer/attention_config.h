// The parameters of the attention methods as plain data: the method kinds, a layer's head shape, the
// configuration (budgets, wave-index parameters) and the exact-token accounting. Below every layer that
// reads them (the index, the buffer planner, the methods, the runners).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace retroinfer {

enum class AttentionKind : uint8_t { kFull, kRetro, kQuest, kStreaming, kOracle };

std::string_view attention_kind_name(AttentionKind k);
// "full" | "retro" | "quest" | "streaming" | "oracle"; throws Error otherwise.
AttentionKind parse_attention_kind(std::string_view s);

struct AttentionShape {
  int num_heads_q = 0;   // query heads of one layer
  int num_heads_kv = 0;  // KV heads of one layer; num_heads_q % num_heads_kv == 0 (GQA)
  int head_dim = 0;      // per-head dimension
};
// Throws Error unless the shape is positive and the GQA grouping divides.
void validate(const AttentionShape& s);

// Every field has the paper's default, stated here once; all configurable. The CLI flags, the Python
// keywords and the ranges validate checks come from the table in attention_params.h.
struct AttentionConfig {
  AttentionKind kind = AttentionKind::kRetro;
  float scale = 0.0f;  // logit scale; 0 means 1/sqrt(head_dim)

  // Steady zone: always attended exactly.
  int sink_tokens = 4;     // first tokens of the sequence
  int window_tokens = 64;  // last prompt tokens (plus every token generated since the last index update)

  // Wave index (retro).
  int tokens_per_cluster = 16;        // average cluster size
  int segment_tokens = 8192;          // k-means segment length
  int kmeans_segment_iters = 1;       // spherical iterations per segment (the paper's 9: docs/wave-index.md)
  int kmeans_global_iters = 1;        // final global iterations (plain means)
  double retrieval_fraction = 0.018;  // share of clusters attended exactly
  double estimation_fraction = 0.232; // share of clusters estimated from centroid and value sum
  bool estimation = true;             // false: the estimation zone is ignored
  // Share of the indexed tokens kept out of the clusters and read exactly at every step (retro's outlier
  // zone): those with the largest residual ||k - centroid|| (docs/wave-index.md, "Outlier tokens").
  double outlier_fraction = 0.001;
  // Retrieval budgets by layer: after prefill, the prompt's last layer_budget_queries queries measure how much
  // attention mass each layer's exact zones miss at several multiples of its retrieval count, and the layers
  // get the multiples (1/4 to 4) that minimise the summed missed mass at the same mean (docs/wave-index.md,
  // "Retrieval budgets by layer"). 0: every layer retrieves retrieval_fraction of its clusters.
  int layer_budget_queries = 0;
  int update_tokens = 1024;           // generated tokens per index update
  int update_clusters = 64;           // clusters made per index update
  // The GPU layers score the clusters against int8 copies of the centroids (one f32 scale per row: D + 4
  // bytes per cluster instead of bf16's 2 D, and no bf16 centroids kept) rather than bf16 centroids: less
  // memory and faster scoring from 128K tokens at batch 4 on; the logits carry the centroids' int8 rounding
  // (task accuracy on SmolLM2 the same within noise: docs/accuracy.md). The CPU method scores its f32
  // centroids either way.
  bool int8_centroid_scoring = true;

  // Baselines.
  int quest_page_tokens = 16;  // quest page size
  // Exact-token budget beyond the steady zone for quest / streaming / oracle; < 0 derives it as
  // round(retrieval_fraction * indexed tokens), the expected size of retro's retrieval zone.
  int64_t budget_tokens = -1;

  uint64_t seed = 0;  // for any randomised choice (none by default)
};
// Throws Error on out-of-range values: each field outside its range in attention_params.h (negative sizes,
// fractions outside [0, 1], ...), segment_tokens < tokens_per_cluster, update_clusters > update_tokens, and
// retrieval_fraction + estimation_fraction > 1 while the estimation zone is on.
void validate(const AttentionConfig& c);

// The cluster size a model of this head dimension should use when none is given: the paper's 16 from
// head_dim 128 on, 2 below (SmolLM2, head_dim 64: at the same share of clusters retrieved, smaller clusters
// bring retro's answers and perplexity close to full's; docs/accuracy.md, "Adopted default"). AttentionConfig's
// own default stays 16; the CLI, the server and the Python bindings apply this once the model is known.
// Throws Error for head_dim < 1.
int default_tokens_per_cluster(int head_dim);

// What one decode call read and computed, summed over the KV heads of the layer.
struct AttentionStats {
  int64_t context_tokens = 0;      // tokens in the cache, per KV head, times KV heads
  int64_t exact_tokens = 0;        // tokens whose K and V were read exactly (steady + retrieval)
  int64_t retrieved_clusters = 0;  // retro: clusters attended exactly
  int64_t estimated_clusters = 0;  // retro: clusters estimated
  AttentionStats& operator+=(const AttentionStats& o) {
    context_tokens += o.context_tokens;
    exact_tokens += o.exact_tokens;
    retrieved_clusters += o.retrieved_clusters;
    estimated_clusters += o.estimated_clusters;
    return *this;
  }
};

}  // namespace retroinfer
