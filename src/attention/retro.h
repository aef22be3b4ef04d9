// retro: decode attention through the wave index (docs/design.md §2) on the CPU. Per KV head: exact attention
// over the steady zone (sinks + everything after the indexed region) and the tokens of the top-scoring
// clusters (retrieval zone), an estimate of the next clusters from centroid and value sum (estimation
// zone), merged by log-sum-exp; the remaining clusters are ignored. The outlier tokens (indexed tokens
// their cluster's centroid represents worst, AttentionConfig::outlier_fraction) are kept out of the
// clusters and read exactly at every step (outlier zone).
//
// Index life cycle:
//   - on_prefill(kv) (or, if it was never called, the first decode) indexes tokens [sink, size - window)
//     when that holds at least tokens_per_cluster tokens; otherwise everything stays steady;
//   - before each decode, while the tokens after the indexed region number >= window + update_tokens, the
//     oldest update_tokens of them are clustered into update_clusters clusters and appended to the index
//     (the budgets are fractions of the cluster count, so they grow with it).
#pragma once

#include <cstdint>
#include <vector>

#include "attention/methods.h"
#include "index/wave_index.h"

namespace retroinfer::attention {

// Threading contract: as AttentionMethod (one thread at a time); decode parallelises over KV heads inside.
class RetroAttention final : public MethodBase {
 public:
  // Throws Error on an invalid shape or config.
  RetroAttention(const AttentionConfig& cfg, const AttentionShape& shape);

  void on_prefill(const KvCache& kv) override;
  AttentionStats decode(const KvCache& kv, const float* q, float* out) override;

  // Brings the index up to date with kv: the first call builds it as on_prefill would (unless on_prefill
  // ran), then every due index update runs. decode() calls it first; calling it again is a no-op.
  // Throws Error if kv does not match the shape or holds fewer tokens than the index covers.
  void sync(const KvCache& kv);

  // The zone of every token in the decode step of query q, exactly as decode(kv, q, ...) computes it
  // (calls sync(kv) first). q: [num_heads_q, head_dim] f32. zones: out, [num_heads_kv, kv.size()] row-major.
  void zones(const KvCache& kv, const float* q, std::vector<index::Zone>& zones);

  // Evaluation hook: the zones of the last decode() (steady, retrieval and outlier -> kZoneExact, estimation ->
  // kZoneEstimated, the rest kZoneIgnored). False before the first decode and after on_prefill.
  bool last_zones(int kvh, std::vector<uint8_t>& zones) const override;

  // Records each decode's retrieval clusters per KV head (step = decodes since the index was built).
  void set_cluster_trace(ClusterTraceWriter* trace, int layer) override {
    trace_ = trace;
    trace_layer_ = layer;
  }

  std::vector<double> calibration_missed_mass(const KvCache& kv, const float* q, int64_t n) const override;
  void set_retrieval_multiplier(double m) override;
  double retrieval_multiplier() const { return retrieval_multiplier_; }

  const index::WaveIndex& wave_index() const { return index_; }
  int64_t num_updates() const { return num_updates_; }  // index updates run since the index was built

 private:
  // Scores and zone selection of KV head h for its query heads qg ([group, head_dim]).
  struct HeadPlan {
    std::vector<float> logits;  // [group, num_clusters]
    std::vector<float> scores;  // [num_clusters]
    index::ZoneSelection sel;
  };
  void plan_head(int h, const float* qg, HeadPlan& plan) const;
  // The parts of plan_head: plan's buffers sized for head h; the scores and zones from plan.logits.
  void size_plan(int h, HeadPlan& plan) const;
  void select_head(int h, HeadPlan& plan) const;
  void build(const KvCache& kv);
  index::KMeansParams kmeans_params() const;

  // Writes the zone of every token of KV head h for a cache of `size` tokens, steady zone [0, steady_a) and
  // [steady_b, size), and the selection sel, using the codes zone_code[steady, retrieval, estimation,
  // ignored, outlier]. zones: out, [size].
  template <typename Code>
  void fill_zones(int h, int64_t size, int64_t steady_a, int64_t steady_b, const index::ZoneSelection& sel,
                  const Code (&zone_code)[5], Code* zones) const;

  index::WaveIndex index_;
  // cfg_.retrieval_fraction is the nominal fraction times retrieval_multiplier_ (set_retrieval_multiplier).
  double nominal_retrieval_fraction_ = 0.0;
  double retrieval_multiplier_ = 1.0;
  // The last decode(), for last_zones(): per KV head its selection, and the cache size and steady bounds.
  std::vector<index::ZoneSelection> last_sel_;  // [num_heads_kv]
  int64_t last_size_ = -1;                      // -1: no decode since the index was (re)built
  int64_t last_steady_a_ = 0, last_steady_b_ = 0;
  bool built_ = false;
  int64_t num_updates_ = 0;
  int64_t steps_since_build_ = 0;
  ClusterTraceWriter* trace_ = nullptr;  // not owned; nullptr: not recording
  int trace_layer_ = 0;

  void record_selection(int64_t size);  // writes last_sel_ of every head to trace_
};

}  // namespace retroinfer::attention
