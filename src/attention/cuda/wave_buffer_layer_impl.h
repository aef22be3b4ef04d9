// WaveBufferLayer's state (include/retroinfer/wave_buffer.h), shared by wave_buffer_layer.cpp (build, decode
// step) and wave_buffer_layer_update.cpp (index updates during decode). Included only from
// src/attention/cuda.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "buffer/cuda/pinned_host.h"
#include "kernels/wave_buffer_kernels.h"
#include "buffer/cache_manager.h"
#include "buffer/index_update.h"
#include "kernels/wave_protocol.h"
#include "retroinfer/cuda_backend.h"
#include "retroinfer/error.h"
#include "retroinfer/wave_buffer.h"

namespace retroinfer::cuda {

struct WaveBufferLayer::Impl {
  AttentionShape shape;
  AttentionConfig cfg;
  WaveBufferConfig wcfg;
  int num_seqs = 1, H = 0, G = 0, D = 0;
  float scale = 0.0f;
  std::unique_ptr<RetroLayer> index;

  int64_t n = 0, n_idx = 0, idx_begin = 0, list_cap = 0, P = 0, slot_stride = 0;
  int C = 0, n_r = 0, n_e = 0, steady_rows = 0, attn_splits = 0, est_splits = 0;
  int64_t steady_cap = 0;  // rows of steady_k / steady_v per flat head (>= steady_rows)
  // Clustered tokens per flat head (indexed minus the index's outlier tokens): the stride of the store and
  // of members. The outliers (the same count for every head) are steady rows after the sinks.
  int64_t per_head = 0, n_out = 0;

  // Meta index copies (decode reads these) and tables; shapes in detail::WaveTables / kernels.h.
  DeviceBuffer centroids_bf16, value_sums_bf16, sizes, offsets_abs, members, offsets_head, slot_begin;
  // The index's int8 copies of the centroids and their row scales (RetroLayer::int8_scoring: scored instead
  // of the bf16 ones when the index scores int8; empty otherwise).
  DeviceBuffer centroids_q8, centroid_scale;
  bool int8_on = false;
  DeviceBuffer store_at;  // [H, C] int64: first store row of each cluster (tab.store_at)
  DeviceBuffer cluster_pages, resident, cache_k, cache_v, exec_k, exec_v, steady_k, steady_v, identity;
  DeviceBuffer exec_count, counts, seg_row, seg_hit, state, mirror;
  DeviceBuffer logits, norm_partial, scores, ret_ids, est_ids, scan_scratch, token_list, token_count, part_ml, part_o;
  DeviceBuffer store_dev;
  // An int4 store's base rows [H, C, 2, D] bf16 (kernels/wave_buffer_kernels.h): the mean of each cluster's
  // K rows and of its V rows, which its int4 rows are relative to. Device memory, whatever the tier.
  DeviceBuffer store_base;
  DeviceBuffer sel_ws;         // [H, kSelectGridWsWords] u32: the grid selection's workspace (zeroed once; kept zero)
  PinnedHost store_host, region;  // pinned_host.h: the store (host tier) and the protocol region
  // The store's device (or mapped) pointers, set by point_store: bf16 blocks (store); or int8 blocks
  // (store_q8, store_cap_rows * 2 * D bytes) followed by their row scales (store_scale, store_cap_rows * 2
  // f32); or int4 blocks (store_q4, store_cap_rows * D bytes) followed by their group scales
  // (store_group_scale, store_cap_rows * 2 * D / 32 bf16); each in one allocation (kernels/wave_buffer_kernels.h).
  const uint16_t* store = nullptr;
  const int8_t* store_q8 = nullptr;
  const float* store_scale = nullptr;
  const uint8_t* store_q4 = nullptr;
  const uint16_t* store_group_scale = nullptr;
  int64_t store_cap_rows = 0;  // store rows allocated (>= tab.store_rows; the rest is tail room)
  buffer::WaveProtocolLayout layout;
  buffer::WaveIndexTables tab;  // host mirror of sizes, CSR, page slots, store rows (index_update.h)
  bool outliers_on = false;     // the index's outlier zone (updates split the block's outliers as the build)
  int64_t updates = 0;          // index updates after the last build()
  // Protocol rebuilds (an update grew n_r past the ring's width): the manager's counters before the
  // rebuild and the steps issued to earlier managers (wait_manager waits for steps - steps_base).
  buffer::CacheManagerStats stats_base;
  uint64_t steps_base = 0;
  std::unique_ptr<buffer::CacheManager> manager;
  uint64_t steps = 0;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t graph_exec = nullptr;
  // set_retrieval_override: the host's ids go through kOverrideSlots pinned slots in turn, each reused after
  // the event of its previous copy, into override_ids ([H, n_r] int32), which the lookup, ring and gather
  // then read instead of the selection's ret_ids.
  WaveBufferLayer::RetrievalOverride override_fill;
  static constexpr int kOverrideSlots = 4;
  PinnedHost override_host[kOverrideSlots];
  cudaEvent_t override_done[kOverrideSlots] = {};
  DeviceBuffer override_ids;
  int64_t override_step = -1;  // the step whose ids override_ids holds for the current tables (-1: none)
  // issue_apply_ahead ran for the next step: its apply (and override copy) are queued on aux and ev_applied
  // records their end; the step then issues none of its own (an apply runs once per step: the ring acks the
  // update it applied). Kept through an index update or a steady-zone growth before the step (both
  // synchronise, so the apply is done, and keep or reset the device state it wrote); cleared by the step
  // and by build().
  bool applied_ahead = false;

  // The step's second stream: the apply runs on it beside the selection (joined before the lookup, which
  // reads the page table the apply writes) and the ring beside the gather and attention (joined at the
  // step's end). Created at the first step; higher priority than the caller's stream, so that the small
  // apply and ring grids start as soon as a multiprocessor frees up.
  cudaStream_t aux = nullptr;
  cudaEvent_t ev_fork = nullptr, ev_applied = nullptr, ev_looked_up = nullptr, ev_ringed = nullptr;
  // WaveBufferConfig::stage_times: the events of the last step (StageEvent order) and the sums so far.
  enum StageEvent {
    kApplyStart, kStart, kApplied, kSelected, kLookupBegin, kLookedUp, kGathered, kAttended, kEnd, kStageEvents
  };
  cudaEvent_t stage_ev[kStageEvents] = {};
  bool stage_pending = false;  // stage_ev hold a step not yet summed
  bool capturing = false;      // capture_graph: no timing events in the graph
  WaveStageTimes stage_sum;

  void ensure_aux();            // creates aux and the fork / join (and, if on, timing) events once
  void collect_stage_times();   // adds the pending step's stage times to stage_sum (waits for its events)

  ~Impl() {
    for (cudaEvent_t e : override_done)
      if (e != nullptr) cudaEventDestroy(e);  // (destroying an event with work pending is allowed)
    for (cudaEvent_t e : {ev_fork, ev_applied, ev_looked_up, ev_ringed})
      if (e != nullptr) cudaEventDestroy(e);
    for (cudaEvent_t e : stage_ev)
      if (e != nullptr) cudaEventDestroy(e);
    if (aux != nullptr) cudaStreamDestroy(aux);
    manager.reset();  // stop the thread before the region goes
    if (graph_exec != nullptr) cudaGraphExecDestroy(graph_exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }

  detail::WaveTables tables() const {
    detail::WaveTables t;
    t.num_heads = H;
    t.head_dim = D;
    t.num_clusters = C;
    t.page_tokens = wcfg.page_tokens;
    t.n_idx = per_head;
    t.sizes = sizes.as<int>();
    t.offsets = offsets_head.as<int>();
    t.store_at = store_at.as<int64_t>();
    t.slot_begin = slot_begin.as<int>();
    t.slot_stride = slot_stride;
    t.cluster_pages = cluster_pages.as<int>();
    t.resident = resident.as<uint8_t>();
    t.pages_per_head = P;
    t.store = store;
    t.store_q8 = store_q8;
    t.store_scale = store_scale;
    t.store_q4 = store_q4;
    t.store_group_scale = store_group_scale;
    t.store_base = store_base.as<uint16_t>();  // null unless the store is int4
    t.cache_k = cache_k.as<uint16_t>();
    t.cache_v = cache_v.as<uint16_t>();
    t.exec_k = exec_k.as<uint16_t>();
    t.exec_v = exec_v.as<uint16_t>();
    t.exec_cap = list_cap;
    return t;
  }

  // The store's bytes for cap_rows rows (rows of one token of one head: K and V, with their scales in an
  // int8 or int4 store; retroinfer/wave_buffer.h store_token_bytes).
  size_t store_alloc_bytes(int64_t cap_rows) const {
    return std::max<size_t>(size_t(cap_rows) * size_t(store_token_bytes(wcfg.store_dtype, D)), 16);
  }
  // Bytes of the quantised values of cap_rows rows, where the scales start (int8 and int4 stores).
  size_t store_value_bytes(int64_t cap_rows) const {
    return wcfg.store_dtype == StoreDtype::kInt4 ? size_t(cap_rows) * D : size_t(cap_rows) * 2 * D;
  }
  // Sets the store's pointers (store, store_q8 / store_scale or store_q4 / store_group_scale) from the
  // allocation's device pointer `base` of cap_rows rows.
  void point_store(void* base, int64_t cap_rows) {
    store = nullptr;
    store_q8 = nullptr;
    store_scale = nullptr;
    store_q4 = nullptr;
    store_group_scale = nullptr;
    const char* scales = static_cast<const char*>(base) + store_value_bytes(cap_rows);
    switch (wcfg.store_dtype) {
      case StoreDtype::kInt8:
        store_q8 = static_cast<const int8_t*>(base);
        store_scale = reinterpret_cast<const float*>(scales);
        break;
      case StoreDtype::kInt4:
        store_q4 = static_cast<const uint8_t*>(base);
        store_group_scale = reinterpret_cast<const uint16_t*>(scales);
        break;
      case StoreDtype::kBf16:
        store = static_cast<const uint16_t*>(base);
        break;
    }
  }
  // Bytes per head of an int4 store's base rows for `clusters` clusters (a K and a V row of D bf16 each).
  size_t base_bytes(int64_t clusters) const { return size_t(clusters) * 4 * D; }
  // The fill kernel's writable views of the store; an int4 fill's clusters are columns [col0, col0 + the
  // view's clusters) of store_base's `stride` per head.
  void set_fill_store(detail::StoreFillParams& fp, int stride, int col0) const {
    fp.store_base = store_base.as<uint16_t>();
    fp.base_stride = stride;
    fp.base_col0 = col0;
    fp.store = const_cast<uint16_t*>(store);
    fp.store_q8 = const_cast<int8_t*>(store_q8);
    fp.store_scale = const_cast<float*>(store_scale);
    fp.store_q4 = const_cast<uint8_t*>(store_q4);
    fp.store_group_scale = const_cast<uint16_t*>(store_group_scale);
  }

  // wave_buffer_layer.cpp: the decode workspace for the current C, n_r, n_e, list_cap (reallocated; the merge
  // counter is kept); the protocol region and a started manager whose ring holds k_cap clusters per head
  // (>= n_r; an empty cache: the device page table is reset).
  void size_decode_workspace();
  void start_manager(int k_cap);
  void drop_graph();
  void copy_override_ids(cudaStream_t st);  // set_retrieval_override: the next step's ids into override_ids
  // The step's apply (after the override's copy, if set) on aux, forked from `from`; records ev_applied (and,
  // `timed`, the apply's stage events).
  void issue_apply(cudaStream_t from, bool timed);
  detail::WaveApplyParams apply_params();
  // wave_buffer_layer.cpp: the steps of WaveBufferLayer::build after the index's build, in order (each
  // described at its definition).
  void take_index_counts(int64_t num_tokens);
  std::vector<int32_t> outlier_tokens();
  void copy_index_tables();
  void allocate_cache_and_rows(int64_t num_tokens);
  void copy_steady_zone(const uint16_t* k, const uint16_t* v, int64_t num_tokens, int64_t kv_stride,
                        const std::vector<int32_t>& out_tokens);
  void fill_store(const uint16_t* k, const uint16_t* v, int64_t num_tokens, int64_t kv_stride);
  void reset_decode_state();
  int ring_width(int64_t num_tokens) const;

  // wave_buffer_layer_update.cpp: one index update (the oldest update_tokens tokens of the steady tail become
  // update_clusters clusters, as RetroLayer::append). Synchronous.
  void index_update(cudaStream_t st);
  // The block of one index update, clustered: host arrays laid out as the layer's tables, with the block's
  // Cu = update_clusters clusters per head and its U = update_tokens tokens numbered from 0.
  struct BlockIndex {
    std::vector<uint16_t> cent;     // [H, Cu, D] bf16 centroids (empty with int8 scoring)
    std::vector<uint16_t> vsum;     // [H, Cu, D] bf16 value sums
    std::vector<uint8_t> cq8;       // [H, Cu, D] int8 centroids (int8 scoring; empty otherwise)
    std::vector<float> cscl;        // [H, Cu] their row scales (int8 scoring; empty otherwise)
    std::vector<int32_t> bsizes;    // [H, Cu] cluster sizes
    std::vector<int32_t> boffs;     // [H, Cu + 1] CSR offsets per head
    std::vector<int32_t> bout;      // [H, o_blk] the block's outlier tokens
    std::vector<uint32_t> bmem;     // [H, U - o_blk] members, grouped by cluster
    int64_t o_blk = -1;             // outlier tokens per head (the same in every head)
  };
  // index_update's steps, in order (each described at its definition).
  BlockIndex cluster_block(int64_t row0, cudaStream_t st);
  void grow_store(int64_t store_rows0);
  void widen_cluster_tables(const BlockIndex& b, int C0, int64_t per0, int64_t nidx0, int64_t slots0,
                            std::vector<DeviceBuffer>& retired, cudaStream_t st);
  void upload_index_tables(std::vector<DeviceBuffer>& retired, cudaStream_t st);
  void fill_store_tail(const BlockIndex& b, int C0, int64_t row0, std::vector<DeviceBuffer>& retired,
                       cudaStream_t st);
  void remove_block_rows(const BlockIndex& b, std::vector<DeviceBuffer>& retired, cudaStream_t st);
  void grow_execution_buffer(std::vector<DeviceBuffer>& retired, cudaStream_t st);
  void add_block_to_manager(const BlockIndex& b);
};

// Head h's int8 centroid copies and row scales (RetroLayer int8 scoring) from its debug state into the host
// arrays q8 [H, C, D] and scale [H, C] (build: the index's C clusters; update: the block's). `what` names the
// caller in the error.
inline void copy_int8_centroids(const RetroDebugState& st, int h, int C, int D, std::vector<uint8_t>& q8,
                                std::vector<float>& scale, const char* what) {
  RETROINFER_CHECK(st.centroids_q8.size() == size_t(C) * D && st.centroid_scale.size() == size_t(C), what,
                   ": flat head ", h, " has no int8 centroids (internal error)");
  std::copy(st.centroids_q8.begin(), st.centroids_q8.end(), q8.begin() + size_t(h) * C * D);
  std::copy(st.centroid_scale.begin(), st.centroid_scale.end(), scale.begin() + size_t(h) * C);
}

}  // namespace retroinfer::cuda
