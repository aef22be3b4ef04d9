// Host-only view of the CUDA attention layers (no CUDA headers here) that run on K/V already resident in GPU memory.
//
// Layout convention of every layer below (batch = num_seqs sequences of equal length):
//   K, V  device [num_seqs, num_heads_kv, kv_stride, head_dim] bf16 (raw uint16 bits), row-major; the
//         first num_tokens rows of each (sequence, KV head) are valid (kv_stride >= num_tokens leaves
//         room to append);
//   q     device [num_seqs, num_heads_q, head_dim] f32, post-RoPE, unscaled; query head h reads KV head
//         h / (num_heads_q / num_heads_kv);
//   out   device [num_seqs, num_heads_q, head_dim] f32; every element written.
// Supported: head_dim 64 or 128, GQA group (num_heads_q / num_heads_kv) 1..8.
// Threading contract: a layer object is used by one host thread at a time; its calls are asynchronous on
// the given stream (nullptr = the default stream) unless they say "synchronous". Errors (bad shapes, CUDA
// failures) throw retroinfer::Error. Set RETROINFER_CUDA_SYNC=1 to synchronise after every launch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "retroinfer/attention.h"
#include "retroinfer/cuda_device.h"
#include "retroinfer/dtype.h"
#include "retroinfer/wave_buffer.h"

namespace retroinfer::cuda {

namespace detail {
struct KvInt8Rows;  // src/kernels/decode_kernels.h: int8 K/V rows and their scales
}  // namespace detail
class KvInt8Cache;  // src/attention/cuda/kv_int8_cache.h: one layer's 8-bit KV cache

// Exact dense decode attention (flash decoding, split over tokens, GQA-aware): the full-attention
// baseline on the GPU. A streaming kernel with tensor-map copies of the K/V tiles (1-D bulk copies where no
// tensor map can be made).
class DenseDecoder {
 public:
  // max_tokens: the longest num_tokens run() will see (sizes the split workspace).
  DenseDecoder(const AttentionShape& shape, int num_seqs, int64_t max_tokens);
  ~DenseDecoder();
  DenseDecoder(DenseDecoder&&) noexcept;
  DenseDecoder& operator=(DenseDecoder&&) noexcept;
  // Attention of q over the first num_tokens tokens (>= 1) of k, v. scale 0 means 1/sqrt(head_dim).
  void run(const float* q, const uint16_t* k, const uint16_t* v, int64_t num_tokens, int64_t kv_stride,
           float scale, float* out, Stream s = nullptr);
  // The same over int8 K/V rows (the 8-bit KV cache: kernels/decode_kernels.h KvInt8Rows, rows kv_stride apart
  // per flat head).
  void run_int8(const float* q, const detail::KvInt8Rows& kv, int64_t num_tokens, int64_t kv_stride, float scale,
                float* out, Stream s = nullptr);
  // Splits (CTAs per flat head) run() uses for num_tokens.
  int num_splits(int64_t num_tokens) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One (sequence, KV head)'s wave index and last decode selection, copied to the host (synchronous).
struct RetroDebugState {
  int num_clusters = 0;
  std::vector<float> mean;              // [head_dim]: mean indexed key
  std::vector<float> centroids;         // [num_clusters, head_dim] f32: de-centred (empty: not kept)
  std::vector<uint16_t> centroids_bf16;  // [num_clusters, head_dim] bf16 (int8 scoring off only: scored then;
                                         // with int8 scoring the layer keeps none and this is empty)
  // Int8 scoring (AttentionConfig::int8_centroid_scoring): what scoring reads, centroid c's dim i being
  // (centroids_q8[c * head_dim + i] - 128) * centroid_scale[c]; both empty when off.
  std::vector<uint8_t> centroids_q8;    // [num_clusters, head_dim]
  std::vector<float> centroid_scale;    // [num_clusters]
  std::vector<float> value_sums;        // [num_clusters, head_dim] f32 (empty: not kept)
  std::vector<uint16_t> value_sums_bf16;  // [num_clusters, head_dim] bf16: what estimation reads
  std::vector<int32_t> sizes;           // [num_clusters]
  std::vector<int32_t> assignment;      // [indexed_tokens]: cluster of index token i
  std::vector<int32_t> offsets;         // [num_clusters + 1]: CSR offsets into members (from 0)
  std::vector<int32_t> members;         // [indexed_tokens]: index tokens grouped by cluster, ascending
  // Last decode (empty before the first decode):
  std::vector<float> logits;            // [group, num_clusters]: scale * q_g . c (scored centroids), -inf empty
  std::vector<float> scores;            // [num_clusters]
  std::vector<int32_t> retrieval_ids;   // ascending, without padding
  std::vector<int32_t> estimation_ids;  // ascending, without padding
  std::vector<int32_t> token_list;      // KV positions attended exactly: steady zone, then retrieval tokens
};

// Retro (wave index) decode attention over GPU-resident K/V: build() clusters the indexed tokens of every
// (sequence, KV head) with segmented spherical k-means (docs/design.md §2); decode() scores the clusters,
// selects the retrieval and estimation zones, estimates the estimation zone from the cluster summaries,
// attends exactly to the steady zone plus the retrieval clusters' tokens, and merges the two states.
// Zones: steady = the first cfg.sink_tokens and the last cfg.window_tokens tokens; the rest is indexed
// (unless it is shorter than cfg.tokens_per_cluster: then everything is steady, as in the CPU method).
// Budgets: n_retrieval = ceil(retrieval_fraction * C) (at least 1), n_estimation = ceil(estimation_fraction
// * C) capped by C - n_retrieval (0 when cfg.estimation is false), C the clusters per head.
class RetroLayer {
 public:
  RetroLayer(const AttentionShape& shape, const AttentionConfig& cfg, int num_seqs = 1);
  ~RetroLayer();
  RetroLayer(RetroLayer&&) noexcept;
  RetroLayer& operator=(RetroLayer&&) noexcept;

  // Builds the index over k, v (device, see the layout above). The layer keeps the pointers: k and v must
  // stay alive and unchanged until the next build(). Allocates on the first call and when shapes grow;
  // synchronous at its end (it sizes the token lists from the cluster sizes).
  void build(const uint16_t* k, const uint16_t* v, int64_t num_tokens, int64_t kv_stride, Stream s = nullptr);
  // Retro attention of q against the built index (asynchronous).
  void decode(const float* q, float* out, Stream s = nullptr);
  // Decode-time growth: the caller has written tokens [num_tokens(), num_tokens) into the K/V given to
  // build() (rows up to kv_stride); they join the steady zone's tail. Runs every index update that falls
  // due (CPU rule, attention/retro.cpp sync(): while the tail holds >= window + update_tokens tokens, its
  // oldest update_tokens become update_clusters new clusters, block k-means on the GPU, appended to the
  // index; budgets are fractions of the grown cluster count); an update synchronises `s` once. Without an
  // update it only records the count (no launch, no synchronisation). The first append switches the
  // token-list capacity to the growth capacity (steady zone up to window + update_tokens - 1 tail tokens).
  void append(int64_t num_tokens, Stream s = nullptr);
  // The 8-bit KV cache (src/attention/cuda/kv_int8_cache.h; nullptr: off, the default): build() still reads the
  // bf16 k, v it is given (the runner's staging, free after it returns), but decode reads `cache`'s int8 rows and
  // an index update widens its block from them (the caller appends each token to `cache` before append()). The
  // cache must outlive the layer's use of it. Calibration (calibration_missed_mass) is not provided then.
  void set_int8_kv(const KvInt8Cache* cache);
  // Outlier zone (AttentionConfig::outlier_fraction, index/wave_index.h split_outliers) on the GPU: off by
  // default (build() then behaves as before it existed); call before build().
  void set_outlier_zone(bool on);
  bool outlier_zone() const;  // set_outlier_zone's setting (the wave buffer's updates follow it)
  // Keep the f32 centroids and value sums next to the bf16 copies decode reads (default on: debug_state
  // returns them for the parity tests). Off, they are freed after each build / update (12 D -> 4 D bytes
  // per cluster and flat head: ~67 MB per layer of a 128K Llama-3-8B sequence) and debug_state leaves
  // centroids / value_sums empty. Call before build().
  void set_keep_f32_index(bool keep);
  // Whether the clusters are scored against int8 copies of the centroids (AttentionConfig::
  // int8_centroid_scoring at construction; per-row scale, 1 + 4 / head_dim bytes per dimension instead of 2).
  // On, the layer keeps only the int8 copies, no bf16 centroids.
  bool int8_scoring() const;
  // Keep each indexed token's cluster id ([flat heads, indexed tokens] int32) on the device (default on).
  // Decode never reads it; off, it is dropped after the build and not kept by index updates (4 bytes per
  // indexed token and flat head: 134 MB per 128K Llama-3-8B sequence over 32 layers) and debug_state
  // rebuilds it from the CSR (members / offsets; -1 for a token in no cluster: an outlier). Call before
  // build().
  void set_keep_assignment(bool keep);
  // Sequences per k-means run of build() (default 1; 0 = every sequence in one run): the sequences are
  // indexed in groups through one workspace sized for a group (the index is bit-identical to one batched
  // run: no k-means or outlier kernel mixes flat heads). Applies to the next build().
  void set_build_group_seqs(int seqs);
  // Frees the k-means workspace of build() (for a group of set_build_group_seqs sequences: centred keys,
  // sort buffers, the group's f32 / bf16 cluster sums: ~(2 D + 36) bytes per indexed token and (12 D + 9)
  // per cluster, per flat head of the group). An index update allocates its own (update_tokens-sized)
  // workspace and frees it when done. For long-lived layers (the model runner); a later build() allocates
  // again.
  void release_build_workspace();
  // Frees everything build() and decode allocated (index, decode and build workspaces): the layer is as
  // constructed, with the same settings (outlier zone, kept copies, build groups); decode() is an Error
  // until the next build(). For a layer whose index was copied elsewhere (WaveBufferLayer::release_index).
  void release();
  // Retrieval budgets by layer (src/index/layer_budgets.h; the CPU's layer_missed_mass): the attention mass the
  // index leaves out at each multiple of the nominal retrieval count for n calibration queries q (device [n,
  // num_heads_q, head_dim] f32 post-RoPE: the queries of the last n of the num_tokens() tokens, each attending
  // causally), averaged over query heads and queries. Empty when nothing is indexed or the layer holds more
  // than one sequence. Synchronous; reads each key once per pass of up to 64 query rows of a KV head; its
  // workspace (4 bytes per indexed token and KV head, per-tile softmax partials, the pass's cluster masses) is
  // freed on return.
  std::vector<double> calibration_missed_mass(const float* q, int64_t n, Stream s = nullptr);
  // Scales the retrieval zone to m (> 0) times its nominal count (and resizes the decode workspace:
  // synchronous) until the next build(), which restores 1.
  void set_retrieval_multiplier(double m, Stream s = nullptr);
  int64_t num_updates() const;        // index updates run since build()
  int64_t max_outliers() const;       // most outlier tokens of any flat head
  int64_t retrieval_capacity() const;  // most retrieval-zone tokens of any flat head (n_r largest clusters)
  int64_t device_bytes() const;       // GPU memory this layer holds (index, workspaces; not the K/V)
  // Synchronous: the outlier KV tokens of flat head `flat_head`, ascending.
  std::vector<int32_t> outliers(int flat_head) const;
  // decode() on the default stream with an event after each stage; returns (stage, ms) pairs
  // (synchronous; diagnostics and benchmarks).
  std::vector<std::pair<std::string, float>> decode_stage_ms(const float* q, float* out);

  int64_t num_tokens() const;
  int64_t indexed_begin() const;   // first indexed token
  int64_t indexed_tokens() const;  // 0: everything is steady zone (decode is then exact)
  int num_clusters() const;        // per (sequence, KV head)
  int n_retrieval() const;
  int n_estimation() const;
  int64_t token_list_capacity() const;  // max exact tokens per (sequence, KV head)
  // Tokens the last decode attended exactly, summed over flat heads: steady zone, retrieval clusters and
  // outliers (synchronous: reads the per-head list lengths back). num_tokens() x heads when nothing is
  // indexed. Call after decode().
  int64_t last_exact_tokens() const;
  // Cluster traces: enqueues on `s` copies of the last decode's retrieval cluster ids, ids [flat heads,
  // n_retrieval()] (ascending, -1 past the selection), and the cluster sizes, sizes [flat heads,
  // num_clusters()] (tokens), into host memory (pinned for the copies to be asynchronous). Valid once `s`
  // has passed them. The decode must have been issued on `s` (or before it in stream order).
  void copy_selection_async(int32_t* ids, int32_t* sizes, Stream s) const;
  // Bytes one decode must read from device memory: the scored centroids (int8 rows + scales with int8 scoring,
  // else bf16) and sizes of every cluster, the value
  // sums of the estimation zone, the K/V rows and ids of the exact tokens (from the last decode: a sync),
  // q and out.
  double decode_bytes_required();
  // Bytes one decode moves by the kernels' own accounting: the above plus the logits and scores written
  // and re-read, the token lists and the split partial states.
  double decode_bytes_moved();
  // Synchronous copy of flat head `flat_head` = seq * num_heads_kv + kv_head.
  RetroDebugState debug_state(int flat_head) const;

 private:
  void decode_impl(const float* q, float* out, Stream s, std::vector<std::pair<std::string, float>>* stages);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Quest baseline at a fixed exact-token budget: per page of cfg.quest_page_tokens indexed tokens the
// element-wise min / max key; decode picks the pages with the best upper bound (max over the GQA group of
// sum_d max(q_d min_d, q_d max_d)) up to ceil(budget / page) pages and attends exactly to them plus the
// steady zone. budget = cfg.budget_tokens, or round(retrieval_fraction * indexed tokens) when < 0.
class QuestLayer {
 public:
  QuestLayer(const AttentionShape& shape, const AttentionConfig& cfg, int num_seqs = 1);
  ~QuestLayer();
  QuestLayer(QuestLayer&&) noexcept;
  QuestLayer& operator=(QuestLayer&&) noexcept;
  void build(const uint16_t* k, const uint16_t* v, int64_t num_tokens, int64_t kv_stride, Stream s = nullptr);
  void decode(const float* q, float* out, Stream s = nullptr);
  int num_pages() const;
  int selected_pages() const;
  double decode_bytes_required() const;  // page bounds, selected pages' K/V, steady zone, q, out
  // Synchronous: the exact tokens of flat head `flat_head` in the last decode.
  std::vector<int32_t> token_list(int flat_head) const;
  std::vector<float> page_scores(int flat_head) const;  // [num_pages] of the last decode

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------------------------------
// The wave buffer's layer: retro with its KV in a tiered store (wave_buffer.h, docs/wave-buffer.md).

class WaveBufferLayer {
 public:
  // Shapes and zone budgets as RetroLayer (cuda_backend.h); num_seqs sequences of equal length.
  WaveBufferLayer(const AttentionShape& shape, const AttentionConfig& cfg, const WaveBufferConfig& wcfg,
                  int num_seqs = 1);
  ~WaveBufferLayer();
  WaveBufferLayer(const WaveBufferLayer&) = delete;
  WaveBufferLayer& operator=(const WaveBufferLayer&) = delete;

  // Builds the wave index over GPU-resident K/V (layout of cuda_backend.h: [num_seqs, Hkv, kv_stride, D]
  // bf16), then the cluster-ordered store on wcfg.tier, the steady zone, an empty block cache, the
  // execution buffer and the protocol region, and starts the manager thread. k / v may be freed after
  // build() unless index() is used for decoding (it keeps the pointers). Synchronous.
  void build(const uint16_t* k, const uint16_t* v, int64_t num_tokens, int64_t kv_stride);

  // Decode-time growth: appends one token per flat head to the steady zone's tail (k_new, v_new device
  // [num_seqs, Hkv, D] bf16, post-RoPE), asynchronous on `s` unless an index update or a capacity growth
  // runs. The tail's GPU capacity starts at window + update_tokens rows and doubles when full (that append
  // synchronises the device, reallocates the steady and execution buffers and drops a captured graph).
  // Index update (wcfg.index_updates, default on): when the tail after the indexed region holds
  // window + update_tokens tokens (RetroLayer::append's rule), its oldest update_tokens tokens are
  // clustered into update_clusters clusters by RetroLayer's own update code (a block-sized RetroLayer over
  // the steady rows: identical k-means and outlier split), their K/V rows copied in cluster order into the
  // store's tail, the device tables (centroids, value sums, sizes, CSR, page slots, residency) extended,
  // the manager told (CacheManager::add_clusters) and the rows dropped from the steady zone (which keeps
  // sinks, outliers, the block's outliers and the tail past the block). Synchronous: the append
  // synchronises the device once before and once after (an update runs every update_tokens steps), drops a
  // captured graph (capture again), and may reallocate the store (no tail room: wcfg.max_tokens) or the
  // execution buffer (rows kept for the manager's pending admissions). Owner thread only; the manager
  // thread keeps running (its additions are queued, wave_buffer.h threading contract). index() is not
  // updated: it keeps the prompt's index.
  void append(const uint16_t* k_new, const uint16_t* v_new, Stream s = nullptr);
  int64_t num_updates() const;         // index updates run by append() since build()
  int64_t indexed_begin() const;       // first indexed token (RetroLayer::indexed_begin)
  int64_t indexed_tokens() const;      // tokens in the index (clustered + outliers; RetroLayer::indexed_tokens)
  int64_t outlier_rows() const;        // outlier tokens per flat head (steady rows after the sinks)
  int64_t num_tokens() const;          // tokens per sequence (build + appended)
  int64_t steady_rows() const;         // steady-zone rows per flat head
  int num_clusters() const;
  int n_retrieval() const;
  int n_estimation() const;
  int64_t retrieval_capacity() const;  // execution-buffer rows per flat head beyond the steady capacity
  int64_t device_bytes() const;        // GPU memory held (index copies, cache, buffers, a GPU-tier store)
  int64_t host_bytes() const;          // pinned host memory held (a host-tier store, the protocol region)

  // One decode step: q [num_seqs, Hq, D] f32 device, out [num_seqs, Hq, D] f32 device (every element
  // written). Asynchronous on `s`; launches kernels only (graph-capturable). The apply and the ring run on
  // the layer's second stream, forked from `s` and joined back into it within the step.
  void decode(const float* q, float* out, Stream s = nullptr);
  // Issues the next decode step's apply (the manager's last update into the page table and cache pages,
  // and a retrieval override's ids) on the layer's second stream, after the work queued on `s` so far; the
  // next decode() then waits for it instead of issuing its own. Issued while other work runs (the model
  // runner issues layer l + 1's during layer l), it takes the apply's dependent launches and its read of the
  // mailbox over PCIe off the step. The manager must have posted by then to be applied in this step (else
  // its update waits a step). `s` must be ordered after this layer's previous step. Returns false (nothing
  // issued) when one is already issued or a graph is captured (the graph holds its own apply).
  bool issue_apply_ahead(Stream s);
  // decode() on the default stream with events between the stages, run one after another on that stream:
  // (stage, ms) pairs for apply, select (score + select), lookup (+ ring), gather, attention (exact +
  // estimation grids + merge). Synchronous.
  std::vector<std::pair<std::string, float>> decode_stage_ms(const float* q, float* out);
  // Captures one decode(q, out) into a CUDA graph (q and out are baked in: write new queries into q);
  // replay_graph() launches it. Each replay is one decode step. `s` must not be the legacy default
  // stream (cuda::StreamHandle gives one).
  void capture_graph(const float* q, float* out, Stream s);
  void replay_graph(Stream s);

  // Blocks until the manager has consumed every step issued so far and published its decisions (the
  // next step will apply them). For deterministic tests and benchmarks; rethrows a manager error.
  void wait_manager();
  void check();
  // Cache admissions on (default) or off (the cache keeps its content; benchmarks of the miss path).
  void set_admission(bool on);
  // Benchmarks (bench decode --query-trace): `fill(step, num_clusters, n_r, ids)` writes each step's retrieval
  // clusters, ids [flat heads, n_r] (per head strictly ascending in [0, num_clusters), then -1), which replace
  // the selection's before the lookup, so the cache sees a recorded decode's selections; the estimation zone
  // stays the selection's (a cluster may then be both retrieved and estimated: the output is not attention,
  // the traffic is). Called on the owner thread in each decode, or in issue_apply_ahead (step: decodes since
  // build()); the ids reach the device by an asynchronous copy from pinned memory on the second stream
  // before the apply (a slot is reused after its copy's event, 4 steps later: no host synchronisation in
  // practice). Empty: off. capture_graph throws while it is set.
  using RetrievalOverride = std::function<void(int64_t step, int num_clusters, int n_r, int32_t* ids)>;
  void set_retrieval_override(RetrievalOverride fill);
  WaveBufferStats stats();
  WaveStepCounts last_step_counts();  // synchronous
  // The stage times of the steps since build() (WaveBufferConfig::stage_times; all zero when off).
  // Synchronous: waits for the last step's events.
  WaveStageTimes stage_times();
  // The wave index built by build() (decodes on the GPU-resident K/V it was given); index updates of
  // append() do not reach it: it keeps the prompt's index.
  RetroLayer& index();
  // Frees index()'s GPU memory (RetroLayer::release): decode, append and the store read the buffer's own
  // copies of the index, so only index() is lost (an unbuilt RetroLayer until the next build()). The model
  // runner's host-tier layers call it after build(): at 1M tokens it is ~0.24 GiB per sequence and layer.
  void release_index();
  int64_t cache_pages_per_head() const;
  int64_t exec_capacity() const;   // execution-buffer rows per flat head
  int64_t store_bytes() const;     // K + V of every flat head
  int64_t steps_issued() const;
  bool store_on_host() const;

 private:
  void launch_step(const float* q, float* out, void* stream, std::vector<void*>* marks);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};


// ---------------------------------------------------------------------------------------------------
// Causal prefill attention (GQA): query positions [pos0, pos0 + n) of one sequence attend to tokens
// [0, pos0 + i] of k, v (the chunk's own K/V already written at rows [pos0, pos0 + n)).
//   q    device [n, num_heads_q, head_dim] f32 (post-RoPE, unscaled)
//   k, v device [num_heads_kv, kv_stride, head_dim] bf16 (one sequence's slice of the layout above)
//   out  device [n, num_heads_q, head_dim] f32, every element written (or, through run_bf16, bf16: each
//        element the f32 result rounded to nearest even, as a separate copy would round it)
// scale 0 means 1/sqrt(head_dim). head_dim 64 or 128, group 1..8.
// Which kernel runs it: kAuto takes the Hopper (wgmma) kernel for head_dim 128 on a compute capability 9.0
// GPU and the portable (mma.sync, sm_80+) kernel otherwise; kPortable and kHopper force one (tests and
// benchmarks), kHopper throws Error where it cannot run.
// One object's launches must not overlap: runs on different streams at once need an object each (the Hopper
// kernel's work counter and the split workspace belong to the object).
enum class PrefillKernel { kAuto, kPortable, kHopper };
std::string_view prefill_kernel_name(PrefillKernel k);  // "auto", "portable", "hopper"
PrefillKernel parse_prefill_kernel(std::string_view s);  // throws Error on another name

class PrefillAttention {
 public:
  explicit PrefillAttention(const AttentionShape& shape, PrefillKernel kernel = PrefillKernel::kAuto);
  PrefillKernel kernel() const;  // the one it runs (never kAuto)
  ~PrefillAttention();
  PrefillAttention(PrefillAttention&&) noexcept;
  PrefillAttention& operator=(PrefillAttention&&) noexcept;
  // q_bf16 (optional): the same q rounded to bf16 (round to nearest even), which the Hopper kernel reads (its Q
  // tiles are tensor-map copies); without it a Hopper launch first rounds q into a buffer of its own (n x Hq x
  // head_dim x 2 bytes, kept for later calls). The portable kernel reads q alone.
  void run(const float* q, const uint16_t* k, const uint16_t* v, int64_t kv_stride, int64_t pos0, int64_t n,
           float scale, float* out, Stream s = nullptr, const uint16_t* q_bf16 = nullptr);
  // As run, the output in bf16 (the O projection's input, without an f32 round trip).
  void run_bf16(const float* q, const uint16_t* k, const uint16_t* v, int64_t kv_stride, int64_t pos0, int64_t n,
                float scale, uint16_t* out, Stream s = nullptr, const uint16_t* q_bf16 = nullptr);

 private:
  void launch(const float* q, const uint16_t* q_bf16, const uint16_t* k, const uint16_t* v, int64_t kv_stride,
              int64_t pos0, int64_t n, float scale, float* out, uint16_t* out_bf16, Stream s);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------------------------------
// One layer's decode attention for a batch of num_seqs sequences that all hold the same number of tokens
// (the seam between the runner and the attention methods). The runner owns the GPU K/V buffers of
// GPU-resident layers; a host-resident layer (KvTier::kHost, retro only, through the wave buffer) moves
// the KV into its own store at prefill_done() and keeps newly appended tokens itself (KvTier: wave_buffer.h).

class LayerAttention {
 public:
  virtual ~LayerAttention() = default;
  // Prefill finished: tokens [0, num_tokens) are in k, v (device, layout above). Builds the method's
  // index. GPU tier: k, v stay owned by the runner and valid until destruction; new tokens are written
  // there by the runner. Host tier: the layer copies what it needs, k, v may be freed afterwards.
  // May synchronise.
  virtual void prefill_done(const uint16_t* k, const uint16_t* v, int64_t num_tokens, int64_t kv_stride,
                            Stream s) = 0;
  // One decode step. k_new, v_new: device [num_seqs, num_heads_kv, head_dim] bf16, the current token's
  // post-RoPE K/V (GPU tier: already written by the runner at row num_tokens - 1 of its buffers; the host
  // tier appends them itself). num_tokens: tokens after the append. q [num_seqs, Hq, D] f32 device,
  // out [num_seqs, Hq, D] f32 device. Asynchronous, except when an index update falls due (every
  // cfg.update_tokens generated tokens), which may synchronise.
  virtual void decode(const float* q, const uint16_t* k_new, const uint16_t* v_new, int64_t num_tokens,
                      float* out, Stream s) = 0;
  // Exact-token accounting of the last decode, summed over sequences and KV heads (host-side, no sync).
  // retro's retrieval zone is counted at its capacity there (the n_r largest clusters: an upper bound).
  virtual AttentionStats last_stats() const = 0;
  // Work of the next decode() that depends on nothing the layers before it write (host tier: the wave
  // buffer's apply, WaveBufferLayer::issue_apply_ahead), issued now after the work queued on `s`, so that it
  // overlaps them; the runner calls it for layer l + 1 after layer l's decode. Other tiers: nothing.
  virtual void issue_ahead(Stream s) { (void)s; }
  // The same with the tokens the device actually attended exactly (synchronous: retro reads the per-head
  // list lengths of the last decode back). Default: last_stats(), exact for methods whose budget the host
  // knows (full, quest, streaming, oracle).
  virtual AttentionStats exact_stats() { return last_stats(); }
  virtual int64_t device_bytes() const = 0;  // GPU memory this object holds (not the runner's K/V)
  virtual int64_t host_bytes() const = 0;    // pinned host memory this object holds
  // Host tier only (wave buffer): adds the block cache's counts of the last decode step (device counts,
  // read synchronously) to `step` and the manager's counters since prefill_done (they may lag the issued
  // steps by the manager's queue) to `totals`; returns true. Other tiers and methods: false, untouched.
  // Cluster traces (retroinfer/cluster_trace.h): retro on the GPU tier records each decode's retrieval
  // clusters of every flat head as `layer`, sequences first_seq + s (read back at its next decode, behind an
  // event; see src/attention/cuda/selection_recorder.h); nullptr stops. Other methods and the host tier
  // ignore it. The writer must outlive this object or the next call.
  // Benchmarks: host-tier retro layers (wave buffer) take their retrieval clusters from `schedule` as target
  // layer `layer`, flat heads from first_seq * KV heads (WaveBufferLayer::set_retrieval_override); nullptr
  // stops. Returns false (and ignores it) where the method or tier has no such seam.
  virtual bool set_query_trace(const ClusterTraceSchedule* schedule, int layer, int first_seq) {
    (void)schedule;
    (void)layer;
    (void)first_seq;
    return false;
  }
  virtual void set_cluster_trace(ClusterTraceWriter* trace, int layer, int first_seq) {
    (void)trace;
    (void)layer;
    (void)first_seq;
  }
  virtual bool add_wave_counts(WaveStepCounts& step, WaveBufferStats& totals) {
    (void)step;
    (void)totals;
    return false;
  }
  // Host-tier layers with WaveBufferConfig::stage_times: adds their stage times since build (synchronous).
  virtual bool add_wave_stage_times(WaveStageTimes& times) {
    (void)times;
    return false;
  }
  // Retrieval budgets by layer (retro on the GPU tier: RetroLayer::calibration_missed_mass /
  // set_retrieval_multiplier; the CPU's AttentionMethod has the same pair). q: device [n, Hq, D], the queries of
  // the last n prompt tokens. Other methods and the host tier: empty, and the multiplier is ignored.
  virtual std::vector<double> calibration_missed_mass(const float* q, int64_t n, Stream s) {
    (void)q;
    (void)n;
    (void)s;
    return {};
  }
  virtual void set_retrieval_multiplier(double m, Stream s) {
    (void)m;
    (void)s;
  }
};

// full (DenseDecoder), retro (RetroLayer; KvTier::kHost: WaveBufferLayer), quest, streaming, oracle.
// kv_dtype kI8 (full and retro on the GPU tier): the layer keeps its own 8-bit KV cache
// (src/attention/cuda/kv_int8_cache.h): prefill_done's k, v are staging it quantises (free afterwards) and
// decode appends k_new / v_new itself, as the host tier does.
// max_tokens: the most tokens a sequence will hold (sizes workspaces). Throws Error for a method or tier
// this backend does not provide.
std::unique_ptr<LayerAttention> make_layer_attention(const AttentionShape& shape, const AttentionConfig& cfg,
                                                     int num_seqs, int64_t max_tokens, KvTier tier,
                                                     const WaveBufferConfig& wave = {},
                                                     DType kv_dtype = DType::kBF16);

}  // namespace retroinfer::cuda
