// Session memory planner of the CUDA model runner (CudaSession::plan, cuda_model.h): the GPU and pinned
// host memory a batched session needs, computed before anything is allocated, with the KV placement
// (every layer on the GPU, every layer on the host, or a split) and a refusal (Error naming the bytes
// needed and free on each side) when it cannot fit. Pure host arithmetic: no CUDA, testable on the CPU.
//
// What is counted (B = num_seqs, n = max_context, L = layers, Hkv / Hq = KV / query heads, D = head_dim,
// H = B * Hkv flat heads, G = Hq / Hkv, bf16 K/V = 2 bytes, activations f32 = 4 bytes):
//   GPU-tier layer (runner-owned K/V + the method's extras):
//     kv        2 * H * n * D * 2                       K and V at stride n
//     full      split workspace: kDecodeCtaBound * G * (8 + 4 D)   (flash decoding partial states)
//     streaming as full
//     quest     H * ceil(n / page) * (8 D + 8)           per-page f32 min/max keys + page scores
//     oracle    as full + H * n * (4 G + 8)              logits per query head, score and list per token
//     retro     what one RetroLayer holds after build() and release_build_workspace(), buffer by buffer
//               (retro_layer_bytes below): the index (mean key, bf16 centroids and value sums 4 D per
//               cluster, or int8 centroid copies + bf16 value sums 3 D + 4 with int8 scoring, size and CSR
//               offset 8, members 4 per indexed token, outlier lists; f32 copies
//               8 D more per cluster with retro_keeps_f32_index, the per-token cluster ids 4 more per token
//               with retro_keeps_assignment) and the decode workspace (logits 4 G, score 4 and zone ids
//               ~1 per cluster, estimation split states, token lists H * (steady + kRetrievalRowSlack *
//               retrieval * n_idx + outliers) * 4, attention split states bounded by kDecodeCtaBound); plus, when
//               retro_keeps_build_buffers, the k-means build workspace per layer.
//   host-tier layer (retro through the wave buffer, buffer/memory_planner.h per sequence): on the GPU
//     the GPU tier's retro method bytes above (the layer's wave index is a RetroLayer kept on the GPU)
//     plus meta + steady + cache + exec of every sequence (the wave buffer's own copies and buffers); on
//     the host the cluster-ordered store (K and V of every token; about half with wave.store_dtype int8).
//   once: weights (weight_bytes), the activation rows of the larger of a prefill chunk and the decode
//     batch, max(chunk, B) * (2 hidden + (Hq + 2 Hkv) D + Hq D + 3 ffn) * 4, logits B * vocab * 4 (or the
//     runner's own figure, activation_bytes_override), retro's transient (one layer at a time) the larger
//     of the k-means build workspace of one build group (retro_build_group_seqs sequences, not the batch:
//     per flat head of the group n_idx * (2 D + 36 + sort) + C * (12 D + 9)) and one index update (its
//     workspace and the grown copies of the index arrays), and, when any layer is
//     host-tier, one layer's K/V staged on the GPU (the runner builds a host-tier layer from GPU K/V).
//
// Threading contract: pure functions.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "retroinfer/attention.h"
#include "retroinfer/dtype.h"
#include "retroinfer/model_config.h"
#include "retroinfer/wave_buffer.h"
#include "retroinfer/wave_counts.h"

namespace retroinfer {

// KV placement of a session's layers (the CUDA runner's CudaSessionOptions, the planner's requests).
enum class KvPlacement : uint8_t {
  kGpu,    // every layer's KV in GPU memory
  kHost,   // every layer's KV in pinned host memory (retro through the wave buffer)
  kSplit,  // the first gpu_layers layers on the GPU, the rest on the host (retro)
  kAuto,   // the memory planner decides: kGpu when it fits, else kSplit, else refuse
};

}  // namespace retroinfer

namespace retroinfer::buffer {

std::string_view kv_placement_name(KvPlacement p);  // "gpu" | "host" | "split" | "auto"
KvPlacement parse_kv_placement(std::string_view s);  // throws Error on other names

// CTAs a flash-decoding launch may split one layer into, all flat heads together: one wave of 3 CTAs per
// multiprocessor (layer_common.h) is 396 on the H200's 132 SMs; 1024 leaves room for larger GPUs.
constexpr int64_t kDecodeCtaBound = 1024;
// The index's clusters, zone counts, outlier counts and the retrieval zone's planning bound (token-list
// rows per expected retrieval token: kRetrievalRowSlack): retroinfer/wave_counts.h.
// Estimated clusters per estimation CTA (kernels.h kEstimateChunk): one split state per 64 clusters.
constexpr int64_t kRetroEstimateChunk = 64;
// CUB's radix-sort temporary storage per sorted item, bounded: the alternate key and value buffers (8 B)
// plus the per-tile digit counts (256 digits x 4 B per tile of >= 1024 items: <= 1 B), plus a fixed
// kRetroSortFixedBytes for the pass histograms (a bound, checked against the device by the GPU tests).
constexpr int64_t kRetroSortBytesPerItem = 9;
constexpr int64_t kRetroSortFixedBytes = int64_t{1} << 20;
// The 8-bit KV cache's key calibration, f32 values per flat head and channel: the mean, the factor and the
// statistics' scratch of 2 x 32 partial sums and maxima (kv_int8_kernels.h kKeyStatSplits; model/cuda/session_plan.cpp
// asserts the match).
constexpr int64_t kInt8KvCalibrationFloats = 2 + 2 * 32;

// Device bytes of one RetroLayer (cuda_backend.h) as retro_layer.cpp allocates them, buffer by buffer.
struct RetroLayerBytesRequest {
  AttentionConfig attention;
  int num_seqs = 1, num_heads_kv = 0, group = 1, head_dim = 0;  // group: query heads per KV head
  int64_t tokens = 0;     // build()'s num_tokens per sequence (>= 1)
  int64_t kv_stride = 0;  // K/V rows per (sequence, KV head), >= tokens: room for appended tokens
  bool outlier_zone = true;      // RetroLayer::set_outlier_zone (the runner: on)
  bool keep_f32_index = false;   // set_keep_f32_index (the runner: off)
  bool keep_assignment = false;  // set_keep_assignment (the runner: off)
  int build_group_seqs = 1;      // set_build_group_seqs (0: every sequence in one k-means run)
  // true (the session plan): token and outlier lists sized for any prompt of <= tokens tokens that grows
  // to kv_stride; false: exactly as build(tokens, kv_stride) sizes them.
  bool growth_bound = false;
  // Data-dependent terms; -1: the planning bound.
  int64_t retrieval_tokens = -1;  // RetroLayer::retrieval_capacity(); bound retrieval_rows_bound(retrieval, n_idx)
  int64_t outlier_tokens = -1;    // RetroLayer::max_outliers(); bound round(outlier_fraction * n_idx)
  // Flat heads x attention splits (and x score CTAs): about one wave of the GPU, at least one per head.
  int64_t decode_ctas = kDecodeCtaBound;
};
struct RetroLayerBytes {
  int64_t n_idx = 0, clusters = 0;  // per flat head
  int64_t index = 0;   // held: the index arrays and outlier lists
  int64_t decode = 0;  // held: the decode workspace
  int64_t build = 0;   // transient: build()'s k-means workspace, beyond what it leaves as the index
  int64_t update = 0;  // transient: one index update's workspace and the grown index copies
  int64_t held() const { return index + decode; }  // RetroLayer::device_bytes() after the build is released
};
RetroLayerBytes retro_layer_bytes(const RetroLayerBytesRequest& r);

struct SessionPlanRequest {
  int num_layers = 0, hidden_size = 0, intermediate_size = 0, vocab_size = 0;
  int num_heads_q = 0, num_heads_kv = 0, head_dim = 0;
  AttentionConfig attention;
  WaveBufferConfig wave;
  int64_t max_context = 0;   // tokens per sequence (> 0)
  int prefill_chunk = 2048;  // tokens per prefill block
  int num_seqs = 1;
  // GPU-tier KV element type: kBF16 (4 D bytes per token and head) or kI8 (the 8-bit KV cache: 2 D + 8; full
  // and retro, every layer on the GPU, plus one bf16 staging layer for the layer-major prefill).
  DType kv_dtype = DType::kBF16;
  KvPlacement placement = KvPlacement::kGpu;
  int gpu_layers = -1;       // kSplit: layers on the GPU; -1 = as many as fit
  int64_t weight_bytes = 0;  // weights to count against gpu_free_bytes (0 when it already excludes them)
  // >= 0: the runner's activation, logits and GEMM workspace bytes, replacing the estimate here.
  int64_t activation_bytes_override = -1;
  int64_t gpu_free_bytes = 0;   // what the session may use on the GPU
  int64_t host_free_bytes = 0;  // what the session may pin on the host
  // The current RetroLayer keeps its k-means build buffers after build (per layer); false assumes they
  // are released (counted once, as a transient workspace).
  bool retro_keeps_build_buffers = false;
  bool retro_keeps_f32_index = false;  // the runner's RetroLayerAttention frees the f32 index copies
  bool retro_keeps_assignment = false;  // ... and keeps no per-token cluster ids
  int retro_build_group_seqs = 1;       // ... and builds one sequence's index at a time
};
// Copies the model dimensions of cfg into r.
void set_model_shape(SessionPlanRequest& r, const ModelConfig& cfg);

struct SessionPlanBreakdown {
  KvPlacement placement = KvPlacement::kGpu;  // resolved (never kAuto)
  int num_seqs = 0;
  int64_t max_context = 0;
  int gpu_layers = 0, host_layers = 0;
  int64_t kv_layer_bytes = 0;         // one layer's K+V, every sequence (GPU tier)
  int64_t method_layer_bytes = 0;     // the method's GPU extras per GPU-tier layer
  int64_t host_layer_gpu_bytes = 0;   // per host-tier layer, on the GPU
  int64_t host_layer_host_bytes = 0;  // per host-tier layer, pinned host
  // Host-tier layers: one layer's bf16 K/V staged on the GPU during the prefill and the index that clusters
  // it before the layer's store is filled (released after its build); the 8-bit KV cache: the bf16 layer.
  int64_t staging_bytes = 0;
  int64_t build_workspace_bytes = 0;  // retro's transient: one build group's workspace or one update
  int64_t activation_bytes = 0, logits_bytes = 0, weight_bytes = 0;
  int64_t gpu_bytes = 0, host_bytes = 0;            // needed in all
  int64_t gpu_free_bytes = 0, host_free_bytes = 0;  // the limits checked against
  std::string summary() const;  // one line
};

// The plan; throws Error before anything is allocated when it does not fit (bytes needed and free on
// each side, what to change) or when the request is invalid (non-retro method on the host tier, ...).
SessionPlanBreakdown plan_session(const SessionPlanRequest& r);

// The largest num_seqs in [1, limit] that plan_session accepts for r (its other fields as given), 0 when
// not even one sequence fits. Binary search: the plan's bytes grow with the batch.
int largest_batch(SessionPlanRequest r, int limit = 65536);

// The session's limits: an explicit limit (> 0) as given; 0 = the free GPU memory (free_query(), e.g.
// cuda::device_memory_info().first) minus kGpuReserveBytes, or kHostUsableFraction of MemAvailable
// (available_query(), e.g. host_memory_available()). Queries are injected so tests need no device.
// CUDA context growth, cuBLAS workspaces, CUDA graphs and allocator rounding take memory the plan does
// not itemise; 2 GiB is a planning margin (not a measured bound).
constexpr int64_t kGpuReserveBytes = int64_t{2} << 30;
// As PlannerSettings::host_usable_fraction: pinned memory beyond ~80% of MemAvailable starves the OS.
constexpr double kHostUsableFraction = 0.8;
int64_t resolve_gpu_limit(int64_t limit, const std::function<int64_t()>& free_query);
int64_t resolve_host_limit(int64_t limit, const std::function<int64_t()>& available_query);

}  // namespace retroinfer::buffer
