// Decode attention methods behind one interface: full (exact), retro (wave index), and the baselines
// quest, streaming and oracle at the same exact-token budget.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "retroinfer/attention_config.h"
#include "retroinfer/kv_cache.h"

namespace retroinfer {

class ClusterTraceWriter;    // retroinfer/cluster_trace.h
class ClusterTraceSchedule;  // retroinfer/cluster_trace.h

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
  // Recording hook (optional): after each decode() the method writes its retrieval-zone selection of every
  // KV head to `trace` as layer `layer`, sequence 0 (retro; other methods select no clusters and ignore it).
  // nullptr stops recording. The writer must outlive the method or the next call.
  virtual void set_cluster_trace(ClusterTraceWriter* trace, int layer) {
    (void)trace;
    (void)layer;
  }

  // Retrieval budgets by layer (retro; the other methods keep their budget: an empty result, and the setter
  // is ignored). The attention mass this layer's exact zones would miss for n calibration queries (q: [n,
  // num_heads_q, head_dim] f32 post-RoPE, the queries of the cache's last n tokens), one value per multiple of
  // the nominal retrieval count (index::kLayerBudgetMultipliers, src/index/layer_budgets.h); empty when the
  // method keeps no index or has not built it (call after on_prefill).
  virtual std::vector<double> calibration_missed_mass(const KvCache& kv, const float* q, int64_t n) const {
    (void)kv;
    (void)q;
    (void)n;
    return {};
  }
  // Scales the retrieval zone to m times its nominal count until the next on_prefill (which restores 1).
  virtual void set_retrieval_multiplier(double m) { (void)m; }

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
