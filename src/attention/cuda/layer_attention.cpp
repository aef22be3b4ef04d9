// make_layer_attention (include/retroinfer/cuda_model.h): every decode-attention method behind the runner's
// per-layer seam, and the retro adapters: RetroLayer on the GPU tier, WaveBufferLayer on the host tier.
#include <algorithm>
#include <optional>
#include <utility>

#include "attention/cuda/kv_int8_cache.h"
#include "attention/cuda/layer_attention.h"
#include "attention/cuda/layer_common.h"
#include "attention/cuda/selection_recorder.h"
#include "retroinfer/cluster_trace.h"
#include "retroinfer/cuda_backend.h"
#include "retroinfer/error.h"
#include "retroinfer/wave_buffer.h"

namespace retroinfer::cuda {
namespace {

// retro over the runner's GPU K/V: RetroLayer with the outlier zone on (the CPU method's default), one
// append per step (index updates on the GPU when due). kv_dtype kI8: the layer owns an 8-bit KV cache
// (kv_int8_cache.h) that prefill_done fills from the runner's bf16 staging and decode appends to.
class RetroLayerAttention final : public LayerAttention {
 public:
  RetroLayerAttention(const AttentionShape& shape, const AttentionConfig& cfg, int num_seqs, int64_t max_tokens,
                      DType kv_dtype)
      : layer_(shape, cfg, num_seqs), max_tokens_(max_tokens), H_(num_seqs * shape.num_heads_kv),
        num_heads_kv_(shape.num_heads_kv) {
    validate(cfg);
    RETROINFER_CHECK(max_tokens >= 1, "RetroLayerAttention: max_tokens must be >= 1, got ", max_tokens);
    if (kv_dtype == DType::kI8) {  // make_layer_attention admits bf16 and int8 only
      kv8_.emplace(H_, max_tokens, shape.head_dim);
      layer_.set_int8_kv(&*kv8_);
    }
    layer_.set_outlier_zone(true);
    layer_.set_keep_f32_index(false);  // decode reads the bf16 index; the planner counts 4 D per cluster
    layer_.set_keep_assignment(false);  // nor the per-token cluster ids (session_planner.h retro_layer_bytes)
    layer_.set_build_group_seqs(1);     // one sequence's k-means workspace at a time (the planner's transient)
  }

  void prefill_done(const uint16_t* k, const uint16_t* v, int64_t num_tokens, int64_t kv_stride, Stream s) override {
    RETROINFER_CHECK(num_tokens <= max_tokens_ && kv_stride >= max_tokens_, "RetroLayerAttention: ", num_tokens,
                     " tokens in K/V rows of stride ", kv_stride, " for max_tokens ", max_tokens_,
                     " (need num_tokens <= max_tokens <= kv_stride)");
    recorder_.restart();
    if (kv8_) kv8_->fill(k, v, num_tokens, kv_stride, s);  // before the build's synchronisation
    layer_.build(k, v, num_tokens, kv_stride, s);
    layer_.release_build_workspace();
  }

  void set_cluster_trace(ClusterTraceWriter* trace, int layer, int first_seq) override {
    recorder_.set_trace(trace, layer, first_seq, H_ / num_heads_kv_, num_heads_kv_);
  }

  void decode(const float* q, const uint16_t* k_new, const uint16_t* v_new, int64_t num_tokens, float* out,
              Stream s) override {
    RETROINFER_CHECK(num_tokens <= max_tokens_, "RetroLayerAttention::decode: ", num_tokens,
                     " tokens exceed max_tokens ", max_tokens_);
    if (kv8_) {  // the layer owns its KV (bf16: the runner wrote the token into its K/V)
      RETROINFER_CHECK(num_tokens == layer_.num_tokens() + 1, "RetroLayerAttention::decode (8-bit KV): ", num_tokens,
                       " tokens after ", layer_.num_tokens(), " (the layer appends exactly one token per step)");
      kv8_->append(k_new, v_new, num_tokens - 1, s);
    }
    layer_.append(num_tokens, s);
    layer_.decode(q, out, s);
    if (recorder_.active()) recorder_.after_decode(layer_, num_tokens, s);
    // Host-side accounting: steady zone and outliers exact; the retrieval zone bounded by the n_r largest
    // clusters (an upper bound: the device's selection is not read back).
    const int64_t n = layer_.num_tokens(), steady = n - layer_.indexed_tokens();
    stats_ = AttentionStats{};
    stats_.context_tokens = n * H_;
    if (layer_.indexed_tokens() == 0) {
      stats_.exact_tokens = n * H_;
    } else {
      stats_.exact_tokens = (steady + layer_.retrieval_capacity() + layer_.max_outliers()) * H_;
      stats_.retrieved_clusters = int64_t{layer_.n_retrieval()} * H_;
      stats_.estimated_clusters = int64_t{layer_.n_estimation()} * H_;
    }
  }

  AttentionStats last_stats() const override { return stats_; }
  AttentionStats exact_stats() override {
    AttentionStats s = stats_;
    if (layer_.indexed_tokens() > 0) s.exact_tokens = layer_.last_exact_tokens();
    return s;
  }
  int64_t device_bytes() const override { return layer_.device_bytes() + (kv8_ ? kv8_->device_bytes() : 0); }
  int64_t host_bytes() const override { return 0; }
  std::vector<double> calibration_missed_mass(const float* q, int64_t n, Stream s) override {
    return layer_.calibration_missed_mass(q, n, s);
  }
  void set_retrieval_multiplier(double m, Stream s) override { layer_.set_retrieval_multiplier(m, s); }

 private:
  std::optional<KvInt8Cache> kv8_;  // declared before layer_, which points at it
  RetroLayer layer_;
  int64_t max_tokens_;
  int H_, num_heads_kv_;
  AttentionStats stats_;
  SelectionRecorder recorder_;  // cluster traces; inactive unless set_cluster_trace
};

// retro with the KV in the wave buffer's store (pinned host memory by default): prefill_done builds the
// index, the store and the steady zone from the runner's GPU K/V (which may then be freed); each decode
// appends the token to the layer's own steady tail, and every update_tokens tokens beyond the window the
// layer clusters a block into its index and store (wave_buffer.h append); the outlier zone is on (its rows
// are steady rows of the wave buffer).
class WaveLayerAttention final : public LayerAttention {
  // The store's tail room and the selection ring sized for the session's max_tokens, so index updates
  // never reallocate the store (the session planner counts the store of max_tokens tokens per sequence).
  static WaveBufferConfig sized(WaveBufferConfig w, int64_t max_tokens) {
    if (w.max_tokens <= 0) w.max_tokens = max_tokens;
    return w;
  }

 public:
  WaveLayerAttention(const AttentionShape& shape, const AttentionConfig& cfg, const WaveBufferConfig& wave,
                     int num_seqs, int64_t max_tokens)
      : layer_(shape, cfg, sized(wave, max_tokens), num_seqs), max_tokens_(max_tokens),
        H_(num_seqs * shape.num_heads_kv), num_heads_kv_(shape.num_heads_kv) {
    validate(cfg);
    RETROINFER_CHECK(max_tokens >= 1, "WaveLayerAttention: max_tokens must be >= 1, got ", max_tokens);
    layer_.index().set_outlier_zone(true);  // as the GPU tier and the CPU method
    layer_.index().set_keep_assignment(false);  // as the GPU tier: decode and the store never read it
    layer_.index().set_build_group_seqs(1);
  }

  void prefill_done(const uint16_t* k, const uint16_t* v, int64_t num_tokens, int64_t kv_stride, Stream s) override {
    RETROINFER_CHECK(num_tokens <= max_tokens_, "WaveLayerAttention: ", num_tokens, " tokens exceed max_tokens ",
                     max_tokens_);
    synchronize(s);  // the build reads k, v on its own stream
    layer_.build(k, v, num_tokens, kv_stride);
    layer_.release_index();  // the store holds the KV and the buffer its own copies of the index
  }

  void decode(const float* q, const uint16_t* k_new, const uint16_t* v_new, int64_t num_tokens, float* out,
              Stream s) override {
    RETROINFER_CHECK(num_tokens == layer_.num_tokens() + 1, "WaveLayerAttention::decode: ", num_tokens,
                     " tokens after ", layer_.num_tokens(), " (the host tier appends exactly one token per step)");
    RETROINFER_CHECK(num_tokens <= max_tokens_, "WaveLayerAttention::decode: ", num_tokens,
                     " tokens exceed max_tokens ", max_tokens_);
    layer_.append(k_new, v_new, s);
    layer_.decode(q, out, s);
    // Steady rows exact; the retrieval zone bounded by the execution buffer's retrieval capacity.
    stats_ = AttentionStats{};
    stats_.context_tokens = num_tokens * H_;
    stats_.exact_tokens = (layer_.steady_rows() + layer_.retrieval_capacity()) * H_;
    stats_.retrieved_clusters = int64_t{layer_.n_retrieval()} * H_;
    stats_.estimated_clusters = int64_t{layer_.n_estimation()} * H_;
  }

  void issue_ahead(Stream s) override { layer_.issue_apply_ahead(s); }

  bool set_query_trace(const ClusterTraceSchedule* schedule, int layer, int first_seq) override {
    if (schedule == nullptr) {
      layer_.set_retrieval_override({});
      return true;
    }
    const int head0 = first_seq * num_heads_kv_, heads = H_;
    layer_.set_retrieval_override([schedule, layer, head0, heads](int64_t step, int num_clusters, int n_r, int32_t* ids) {
      for (int f = 0; f < heads; ++f)
        schedule->retrieval_ids(layer, head0 + f, step, num_clusters, n_r, ids + size_t(f) * n_r);
    });
    return true;
  }

  AttentionStats last_stats() const override { return stats_; }
  AttentionStats exact_stats() override {  // the execution buffer's rows of the last step (device counts)
    AttentionStats s = stats_;
    const WaveStepCounts c = layer_.last_step_counts();  // synchronous
    s.exact_tokens = c.steady_rows + c.hit_rows + c.miss_rows;
    return s;
  }
  int64_t device_bytes() const override { return layer_.device_bytes(); }
  int64_t host_bytes() const override { return layer_.host_bytes(); }
  bool add_wave_counts(WaveStepCounts& step, WaveBufferStats& totals) override {
    step += layer_.last_step_counts();  // synchronous
    totals += layer_.stats();
    return true;
  }
  bool add_wave_stage_times(WaveStageTimes& times) override {
    times += layer_.stage_times();  // synchronous
    return true;
  }

 private:
  WaveBufferLayer layer_;
  int64_t max_tokens_;
  int H_, num_heads_kv_;
  AttentionStats stats_;
};

}  // namespace

std::unique_ptr<LayerAttention> make_layer_attention(const AttentionShape& shape, const AttentionConfig& cfg,
                                                     int num_seqs, int64_t max_tokens, KvTier tier,
                                                     const WaveBufferConfig& wave, DType kv_dtype) {
  validate(shape);
  validate(cfg);
  RETROINFER_CHECK(kv_dtype == DType::kBF16 || (kv_dtype == DType::kI8 && tier == KvTier::kGpu &&
                                                (cfg.kind == AttentionKind::kFull || cfg.kind == AttentionKind::kRetro)),
                   "make_layer_attention: an 8-bit (", dtype_name(kv_dtype), ") KV on the GPU is provided for full and ",
                   "retro on the GPU tier (int8), not for '", attention_kind_name(cfg.kind), "' on the ",
                   tier == KvTier::kHost ? "host" : "GPU", " tier; use --kv-dtype bf16");
  if (tier == KvTier::kHost) {
    RETROINFER_CHECK(cfg.kind == AttentionKind::kRetro, "make_layer_attention: KvTier::kHost is provided for retro ",
                     "only (through the wave buffer), not for '", attention_kind_name(cfg.kind),
                     "'; keep this layer's KV on the GPU (KvTier::kGpu)");
    return std::make_unique<WaveLayerAttention>(shape, cfg, wave, num_seqs, max_tokens);
  }
  switch (cfg.kind) {
    case AttentionKind::kFull:
      // The model runner's FullLayerAttention (DenseDecoder), src/backend/cuda/model/.
      return make_full_layer_attention(shape, cfg, num_seqs, max_tokens, kv_dtype);
    case AttentionKind::kRetro:
      return std::make_unique<RetroLayerAttention>(shape, cfg, num_seqs, max_tokens, kv_dtype);
    case AttentionKind::kQuest:
      return detail::make_quest_layer_attention(shape, cfg, num_seqs, max_tokens);
    case AttentionKind::kStreaming:
      return detail::make_streaming_layer_attention(shape, cfg, num_seqs, max_tokens);
    case AttentionKind::kOracle:
      return detail::make_oracle_layer_attention(shape, cfg, num_seqs, max_tokens);
  }
  RETROINFER_FAIL("make_layer_attention: unknown attention kind ", static_cast<int>(cfg.kind));
}

}  // namespace retroinfer::cuda
