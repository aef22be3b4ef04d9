// Kernels of the wave buffer (wave_buffer_kernels.cu): store fill, update apply, lookup, selection ring,
// gather. Included only from src/backend/cuda. Launchers validate nothing and return the launch status;
// wave_buffer.cpp validates and checks.
//
// Notation as kernels.h: H flat heads, C clusters per head, D head_dim, K = n_r retrieval clusters per head.
// Store: cluster c of flat head h (size s_c) is the contiguous block [K rows | V rows] at element
// store_at[h, c] * 2 * D: K row r at + r * D, V row r at + (s_c + r) * D. At build store_at[h, c] =
// h * n_idx + o_c (o_c its CSR offset within the head: the prompt's clusters in cluster order, head by
// head); the clusters of an index update follow in the store's tail (buffer/index_update.h WaveIndexTables).
// An int8 store (store_q8 set instead of store) has the same blocks in int8 elements ([K rows | V rows], D
// bytes a row, at byte store_at[h, c] * 2 * D) and a parallel f32 scale array: the block's scales [K scales
// (s_c) | V scales (s_c)] at store_scale + store_at[h, c] * 2 (core/row_quant.h: per-row absmax / 127).
// An int4 store (store_q4 set) has them in packed nibbles (D / 2 bytes a row, the block at byte
// store_at[h, c] * D) and a parallel bf16 array of group scales, D / 32 per row in row order: the block's
// [K rows' scales | V rows' scales] at store_group_scale + store_at[h, c] * 2 * (D / 32), so the scale of
// the block's 16-byte chunk q (32 values) is element q of that run (core/row_quant.h: per-group absmax / 7).
// Its rows hold the row minus the cluster's base row (the mean of its K rows, of its V rows: core/row_quant.h
// int4_base_row), kept in device memory as store_base [H, C, 2, D] bf16 (K base, V base of cluster c of head h
// at (h * C + c) * 2 * D).
// Cache: cache_k / cache_v [H, P, page_tokens, D] bf16. Execution buffer: exec_k / exec_v [H, exec_cap, D] bf16.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/wave_protocol.h"

namespace retroinfer::cuda::detail {

struct WaveTables {
  int num_heads = 0, head_dim = 0, num_clusters = 0, page_tokens = 0;
  int64_t n_idx = 0;
  const int* sizes = nullptr;        // [H, C]
  const int* offsets = nullptr;      // [H, C + 1] member CSR within the head (from 0 per head): store fill only
  const int64_t* store_at = nullptr; // [H, C]: first store row of each cluster's block (element * 2 * D)
  const int* slot_begin = nullptr;   // [H, C + 1]: first page slot of each cluster within the head's slots
  int64_t slot_stride = 0;           // page slots per head
  int* cluster_pages = nullptr;      // [H, slot_stride]: cache page of each (cluster, page) while resident
  uint8_t* resident = nullptr;       // [H, C]
  int64_t pages_per_head = 0;        // P
  // The store (device or mapped host pointers), exactly one of: bf16 cluster blocks at store_at, int8
  // blocks plus their row scales, or int4 blocks plus their group scales (the gather widens both to bf16).
  const uint16_t* store = nullptr;     // bf16 blocks
  const int8_t* store_q8 = nullptr;    // int8 blocks
  const float* store_scale = nullptr;  // int8 store: [store rows, 2] row scales (K then V per block)
  const uint8_t* store_q4 = nullptr;   // int4 blocks
  const uint16_t* store_group_scale = nullptr;  // int4 store: [store rows, 2, D / 32] bf16 group scales
  const uint16_t* store_base = nullptr;         // int4 store: [H, C, 2, D] bf16 base rows (device memory)
  uint16_t* cache_k = nullptr;       // [H, P, page_tokens, D]
  uint16_t* cache_v = nullptr;
  uint16_t* exec_k = nullptr;        // [H, exec_cap, D]
  uint16_t* exec_v = nullptr;
  int64_t exec_cap = 0;
};

// Fills the store from GPU K/V: for cluster c of head h, row r is K/V row idx_begin + members[h * n_idx +
// offsets[h, c] + r] of head h (the build: the index's tokens; an index update: the block's rows of the
// steady zone, with t a view of the block's clusters). An int8 or int4 store (store_q8 or store_q4 set) gets
// each row quantised on the device (core/row_quant.h) before it is written; an int4 fill first writes each
// cluster's base rows into store_base (its column base_col0 + c of base_stride per head: the view's clusters
// are columns [base_col0, base_col0 + t.num_clusters) of the layer's).
struct StoreFillParams {
  WaveTables t;
  uint16_t* store = nullptr;          // writable view of t.store (bf16 store), or
  int8_t* store_q8 = nullptr;         // ... of t.store_q8 and t.store_scale (int8 store), or
  float* store_scale = nullptr;
  uint8_t* store_q4 = nullptr;        // ... of t.store_q4 and t.store_group_scale (int4 store)
  uint16_t* store_group_scale = nullptr;
  uint16_t* store_base = nullptr;     // int4 store: [H, base_stride, 2, D] bf16 base rows (device)
  int base_stride = 0, base_col0 = 0;
  const uint16_t* k = nullptr;        // [H, kv_stride, D]
  const uint16_t* v = nullptr;
  int64_t kv_stride = 0, idx_begin = 0;
  const uint32_t* members = nullptr;  // [H * n_idx]: index tokens grouped by cluster (absolute CSR)
};
cudaError_t wave_store_fill(const StoreFillParams& p, cudaStream_t s);

// Per-step device state of the update protocol.
struct WaveDeviceState {
  uint64_t step;          // decode steps of this layer so far (the current step while one runs)
  uint64_t last_seq;      // last mailbox update applied
  uint64_t active;        // this step applies an update (snapshot below)
  uint64_t in_time;       // ... and its admissions (src_step + 1 == step)
  uint64_t seq;
  int32_t num_evictions, num_admissions, num_pages, pad;
  uint64_t error;         // nonzero: a mailbox entry was out of range and skipped (bit 0 eviction, 1 admission)
};

struct WaveApplyParams {
  WaveTables t;
  buffer::WaveProtocolLayout layout;
  void* region = nullptr;             // device pointer of the mapped protocol region
  // Device copy of the region's bytes [evictions_offset, ack_offset): the payload is fetched from pinned
  // memory once, coalesced, instead of field by field over PCIe.
  void* mirror = nullptr;
  WaveDeviceState* state = nullptr;   // device
};
// Snapshot of the mailbox header (1 thread), payload fetch into the mirror (grid, only the used entries),
// then evictions and admissions (grid).
cudaError_t wave_apply(const WaveApplyParams& p, cudaStream_t s);

struct WaveLookupParams {
  WaveTables t;
  const int* retrieval_ids = nullptr;  // [H, K] ascending, -1 padded
  int k = 0;
  int steady_rows = 0;                 // rows [0, steady_rows) of each head's execution buffer
  int* seg_row = nullptr;              // [H, K] out: execution-buffer row of the cluster's first token, -1 pad
  uint8_t* seg_hit = nullptr;          // [H, K] out
  int* exec_count = nullptr;           // [H] out: rows used
  int64_t* counts = nullptr;           // [H, 4] out: hit clusters, miss clusters, hit rows, miss rows
};
cudaError_t wave_lookup(const WaveLookupParams& p, cudaStream_t s);

// Ack of an applied update, then the step's selection into the ring (seqlock), then step + 1. One block.
struct WaveRingParams {
  buffer::WaveProtocolLayout layout;
  void* region = nullptr;
  WaveDeviceState* state = nullptr;
  const int* retrieval_ids = nullptr;  // [H, k_src]
  const int* seg_row = nullptr;        // [H, k_src]
  const uint8_t* seg_hit = nullptr;    // [H, k_src]
  int k_src = 0;                       // retrieval clusters per head this step (<= layout.k; the rest: -1 pad)
};
cudaError_t wave_ring(const WaveRingParams& p, cudaStream_t s);

struct WaveGatherParams {
  WaveTables t;
  const int* retrieval_ids = nullptr;  // [H, K]
  const int* seg_row = nullptr;
  const uint8_t* seg_hit = nullptr;
  int k = 0;
  const uint16_t* steady_k = nullptr;  // [H, steady_cap, D]
  const uint16_t* steady_v = nullptr;
  int64_t steady_cap = 0;
  int steady_rows = 0;
};
cudaError_t wave_gather(const WaveGatherParams& p, cudaStream_t s);

// Row gather of K and V (the steady zone's compaction after an index update): dst row r of head h is src
// row map[h * rows + r] of head h.
struct RowGatherParams {
  const uint16_t* src_k = nullptr;  // [H, src_cap, D]
  const uint16_t* src_v = nullptr;
  int64_t src_cap = 0;
  uint16_t* dst_k = nullptr;        // [H, dst_cap, D]
  uint16_t* dst_v = nullptr;
  int64_t dst_cap = 0;
  const int* map = nullptr;         // [H, rows]: source rows, each in [0, src_cap)
  int64_t rows = 0;
  int num_heads = 0, head_dim = 0;
};
cudaError_t wave_rows_gather(const RowGatherParams& p, cudaStream_t s);


}  // namespace retroinfer::cuda::detail
