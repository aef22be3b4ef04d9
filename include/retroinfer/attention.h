// Decode attention methods behind one interface: full (exact), retro (wave index), and the baselines
// quest, streaming and oracle at the same exact-token budget.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "retroinfer/kv_cache.h"

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

// Every field has the paper's default; all configurable.
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
  int update_tokens = 1024;           // generated tokens per index update
  int update_clusters = 64;           // clusters made per index update

  // Baselines.
  int quest_page_tokens = 16;  // quest page size
  // Exact-token budget beyond the steady zone for quest / streaming / oracle; < 0 derives it as
  // round(retrieval_fraction * indexed tokens), the expected size of retro's retrieval zone.
  int64_t budget_tokens = -1;

  uint64_t seed = 0;  // for any randomised choice (none by default)
};
// Throws Error on out-of-range values (negative sizes, fractions outside [0, 1], their sum > 1, ...).
void validate(const AttentionConfig& c);

// The cluster size a model of this head dimension should use when none is given: the paper's 16 from
// head_dim 128 on, 4 below (SmolLM2, head_dim 64: at the same share of clusters retrieved, smaller clusters
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

// One attention method instance serves one (sequence, layer), i.e. every KV head of that layer, and
// holds that pair's index state.
// Threading contract: one thread at a time per instance (instances are independent); the instance may
// parallelise internally over KV heads.
class AttentionMethod {
 public:
  virtual ~AttentionMethod() = default;
  virtual AttentionKind kind() const = 0;
  virtual const AttentionShape& shape() const = 0;
  virtual const AttentionConfig& config() const = 0;

  // Called once when prefill has written the prompt's K/V into kv. Builds whatever index the method
  // keeps. Methods must also work if it was never called (everything is then steady zone until the
  // method chooses to index).
  virtual void on_prefill(const KvCache& kv) = 0;

  // Attention of one decode step. kv already holds the current token's K/V (appended before the call).
  // q:   [num_heads_q, head_dim], f32, post-RoPE, row-major; query head h uses KV head h / group.
  // out: [num_heads_q, head_dim], f32; every element written.
  virtual AttentionStats decode(const KvCache& kv, const float* q, float* out) = 0;

  // Evaluation hook (optional; used by `retroinfer fidelity` to measure attention-mass recall). For KV
  // head kvh, resizes zones to the cache size seen by the last decode() call and writes the zone every
  // token was in during that call: kZoneIgnored, kZoneExact (K/V read exactly) or kZoneEstimated.
  // Returns false when the method does not record its selection (the default) or decode() has not run.
  virtual bool last_zones(int kvh, std::vector<uint8_t>& zones) const {
    (void)kvh;
    (void)zones;
    return false;
  }
  static constexpr uint8_t kZoneIgnored = 0;
  static constexpr uint8_t kZoneExact = 1;
  static constexpr uint8_t kZoneEstimated = 2;
};

// Creates the method named by cfg.kind. Throws Error on invalid shape or config.
std::unique_ptr<AttentionMethod> make_attention(const AttentionConfig& cfg, const AttentionShape& shape);

// One (sequence, layer) decode of a batch.
struct DecodeItem {
  AttentionMethod* method = nullptr;
  const KvCache* kv = nullptr;
  const float* q = nullptr;  // [num_heads_q, head_dim]
  float* out = nullptr;      // [num_heads_q, head_dim]
  AttentionStats stats;      // filled by decode_batch
};
// Runs every item (in parallel where the host allows).
void decode_batch(std::span<DecodeItem> items);

// Exact causal attention for a block of n consecutive query positions [pos0, pos0 + n) against the
// first (pos0 + n) tokens of kv (prefill). q: [n, num_heads_q, head_dim]; out likewise. f32.
void prefill_attention(const KvCache& kv, const AttentionShape& shape, float scale, int64_t pos0,
                       int64_t n, const float* q, float* out);

}  // namespace retroinfer
