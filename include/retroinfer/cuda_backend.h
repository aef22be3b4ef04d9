// Host-only view of the CUDA backend (no CUDA headers here): device discovery, an owning device buffer,
// and the decode-attention layers that run on K/V already resident in GPU memory.
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
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "retroinfer/attention.h"

namespace retroinfer::cuda {

// True when this build has the CUDA backend and a usable device is present. Any CUDA error while
// asking (no driver, no device, a static runtime on a machine with no GPU) counts as "no GPU".
bool device_available();
// "NVIDIA H200 (sm_90, 139 GiB)" or why none is usable.
std::string device_description();

using Stream = void*;  // a cudaStream_t; nullptr is the default stream

// Blocks until all work on `s` is done; throws Error on an asynchronous fault.
void synchronize(Stream s = nullptr);

// Owning device allocation (cudaMalloc). Move-only. Copies are synchronous.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  // Host -> device / device -> host of `bytes` at byte `offset`; throws if out of range.
  void upload(const void* src, size_t bytes, size_t offset = 0);
  void download(void* dst, size_t bytes, size_t offset = 0) const;
  // Sets every byte (0xff makes f32 and bf16 NaN: a sentinel for "never written").
  void fill_bytes(uint8_t value);

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Device-side test and benchmark data: fills count elements with pseudo-random values (counter-based
// hash, reproducible for a seed) of mean 0 and standard deviation `stddev` (sum of 4 uniforms).
void fill_random_bf16(uint16_t* dst, size_t count, uint64_t seed, float stddev, Stream s = nullptr);
void fill_random_f32(float* dst, size_t count, uint64_t seed, float stddev, Stream s = nullptr);
// Evicts the L2 cache (writes a buffer of twice its size) so the next kernel starts cold.
void flush_l2(Stream s = nullptr);
// Evicts L2 by reading twice its size (no writes): L2 is left holding clean lines, as after a decode step's
// weight reads (benchmarks: the "read" flush; RetroLayer::decode_stage_ms uses it when
// RETROINFER_PHASE_FLUSH=read).
void flush_l2_read(Stream s = nullptr);

// CUDA-event timer: start() and stop() record on the stream; elapsed_ms() waits for stop.
class EventTimer {
 public:
  EventTimer();
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start(Stream s = nullptr);
  void stop(Stream s = nullptr);
  float elapsed_ms() const;

 private:
  void* start_ = nullptr;  // cudaEvent_t
  void* stop_ = nullptr;
};

// A non-blocking CUDA stream owned by the caller (capture into graphs needs one).
class StreamHandle {
 public:
  StreamHandle();
  ~StreamHandle();
  StreamHandle(const StreamHandle&) = delete;
  StreamHandle& operator=(const StreamHandle&) = delete;
  Stream get() const { return stream_; }

 private:
  Stream stream_ = nullptr;
};

// A CUDA graph captured from the work that `record` issues on `s` (e.g. one RetroLayer::decode), replayed
// with launch(): one launch instead of one per kernel. The captured pointers must stay valid.
class CapturedGraph {
 public:
  template <typename F>
  CapturedGraph(Stream s, F&& record) {
    begin_capture(s);
    record();
    end_capture(s);
  }
  ~CapturedGraph();
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  void launch(Stream s);

 private:
  void begin_capture(Stream s);
  void end_capture(Stream s);
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
};

// Exact dense decode attention (flash decoding, split over tokens, GQA-aware): the full-attention
// baseline on the GPU. The kernel is chosen at construction by RETROINFER_FULL_DECODE (unset / "tma2d": the
// streaming kernel with tensor-map copies, "bulk": the same with 1-D bulk copies, "v1": the earlier
// split-K kernel; anything else throws).
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
  // Splits (CTAs per flat head) run() uses for num_tokens.
  int num_splits(int64_t num_tokens) const;
  // The kernel run() launches: "tma2d", "bulk" or "v1".
  const char* kernel() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One (sequence, KV head)'s wave index and last decode selection, copied to the host (synchronous).
// RETROINFER_SCORE_CENTROIDS: "int8", empty or unset -> true (the default since run 25); "bf16" -> false;
// anything else throws Error.
// RetroLayer's int8-scoring default, and what a CudaSession's memory plan counts.
bool int8_scoring_from_env();

struct RetroDebugState {
  int num_clusters = 0;
  std::vector<float> mean;              // [head_dim]: mean indexed key
  std::vector<float> centroids;         // [num_clusters, head_dim] f32: de-centred (empty: not kept)
  std::vector<uint16_t> centroids_bf16;  // [num_clusters, head_dim] bf16 (int8 scoring off only: scored then;
                                         // with int8 scoring the layer keeps none and this is empty)
  // Int8 scoring (RetroLayer::set_int8_scoring): what scoring reads, centroid c's dim i being
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
// (sequence, KV head) with segmented spherical k-means (DESIGN.md §2); decode() scores the clusters,
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
  // Outlier zone (AttentionConfig::outlier_fraction, index/wave_index.h split_outliers) on the GPU: off by
  // default (build() then behaves as before it existed); call before build().
  void set_outlier_zone(bool on);
  bool outlier_zone() const;  // set_outlier_zone's setting (the wave buffer's updates follow it)
  // Keep the f32 centroids and value sums next to the bf16 copies decode reads (default on: debug_state
  // returns them for the parity tests). Off, they are freed after each build / update (12 D -> 4 D bytes
  // per cluster and flat head: ~67 MB per layer of a 128K Llama-3-8B sequence) and debug_state leaves
  // centroids / value_sums empty. Call before build().
  void set_keep_f32_index(bool keep);
  // Score the clusters against int8 copies of the centroids (per-row scale, 1 + 4 / head_dim bytes per
  // dimension instead of 2; docs/cuda-kernels.md "Run 22") rather than the bf16 centroids. The default is
  // RETROINFER_SCORE_CENTROIDS at construction (int8, empty or unset: on, since run 25; bf16: off; another
  // value throws, see int8_scoring_from_env). On, the layer keeps only the int8 copies (no bf16 centroids:
  // "Run 25"), which the tma / wide score kernels read; RETROINFER_SCORE=v1 / stream (bf16 only) then refuse
  // its decode with an Error. Call before build().
  void set_int8_scoring(bool on);
  bool int8_scoring() const;
  // Keep each indexed token's cluster id ([flat heads, indexed tokens] int32) on the device (default on).
  // Decode never reads it; off, it is dropped after the build and not kept by index updates (4 bytes per
  // indexed token and flat head: 134 MB per 128K Llama-3-8B sequence over 32 layers) and debug_state
  // rebuilds it from the CSR (members / offsets; -1 for a token in no cluster: an outlier). Call before
  // build().
  void set_keep_assignment(bool keep);
  // Experiment (kernel_bench --layout clustered): rewrites each head's indexed K/V rows in cluster order (row
  // idx_begin + j becomes the j-th member of the head's CSR) and the members to row positions, so that every
  // cluster's tokens are contiguous rows and the exact attention reads runs of ~tokens_per_cluster rows
  // instead of scattered ones. k / v: writable aliases of the buffers build() was given. Attention does not
  // depend on row order (RoPE is in the keys): decode changes only by summation order, the selection not at
  // all; token ids in debug_state become row positions. Throws before build(), with the outlier zone on (its
  // tokens keep rows outside the CSR), with other buffers, or after an index update (appended members).
  void make_cluster_contiguous(uint16_t* k, uint16_t* v, Stream s = nullptr);
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

}  // namespace retroinfer::cuda
