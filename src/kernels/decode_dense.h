// Dense decode attention (exact attention of one decode query over every cached token): the one launch
// function every dense-decode caller goes through (DenseDecoder, i.e. the model runner's full attention and
// kernel_bench's "full"; RetroLayer while nothing is indexed), the kernel choice, and the raw launchers of
// the streaming kernels of decode_dense.cu. Included only from src/backend/cuda. Notation as kernels.h.
//
// Kernels (RETROINFER_FULL_DECODE):
//   unset / "tma2d" (the default since run 15: fastest of the A/B, bench/results/run15/call4): bulk's CTA and
//                   ring, each tile copied by 2-D tensor-map copies (D / 64 boxes of 64 tokens x 64 dims per K
//                   or V tile, 128-byte swizzle) instead of 8 skewed 1-D copies; warp w takes the consecutive
//                   tokens 16w..16w+15. Where the driver has no tensor-map encoder or kv_stride >= 2^31, the
//                   launch runs bulk instead (dense_decode_stream);
//   "bulk":         decode_dense.cu with Hopper bulk copies (cp.async.bulk, mbarrier completion) into a ring
//                   of K/V tile stages filled by one producer thread (tma2d's fallback);
//   "v1":           decode.cu's decode_kernel<D, false, S> + combine_states (the kernel before these; the
//                   reference the GPU tests compare against).
// Run 15 also measured "async" (bulk's stages filled by cp.async), "bulkw" (all of a tile's ldmatrix before
// its MMAs), "bulk8" / "bulk8w" (8 compute warps, 128-token tiles) and "bulk12" (12 warps, 192-token
// tiles): none beat bulk or tma2d (bench/results/run15/call4, call3), and they were removed after it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kernels.h"

namespace retroinfer::cuda::detail {

enum class DenseKernel { kBulk, kV1, kTma2d };
inline constexpr DenseKernel kDefaultDenseKernel = DenseKernel::kTma2d;

// The kernel RETROINFER_FULL_DECODE names, read at each call (a DenseDecoder keeps the one it was made
// with). Throws Error on any other value, naming the valid ones.
DenseKernel dense_kernel();
// "bulk", "v1", "tma2d"
const char* dense_kernel_name(DenseKernel k);

// The streaming kernels' (bulk's and tma2d's) figures.
inline constexpr int kDenseTile = 64;          // tokens per pipeline stage (a K tile and a V tile)
inline constexpr int kDenseComputeWarps = 4;   // consumer warps: each takes 16 tokens of every tile
inline constexpr int kDenseThreads = (kDenseComputeWarps + 1) * 32;  // + one producer warp
// CTAs per multiprocessor by shared memory: ~97 KiB of stages per CTA (decode_dense.cu DenseLayout), two
// in the H200's 228 KiB.
inline constexpr int kDenseCtasPerSm = 2;

// Splits (CTAs per flat head) of the streaming kernels: ctas_per_sm CTAs per multiprocessor over all
// heads (floor(ctas_per_sm * sms / num_heads): one wave, no partial second one), at most one per tile of
// tokens, at least 1. Pure (testable without a device).
int dense_stream_splits(int64_t num_tokens, int num_heads, int sms, int ctas_per_sm = kDenseCtasPerSm);
// CTAs of streaming kernel k (not v1) for head_dim that fit on one multiprocessor (the occupancy query,
// made once per kernel with its shared-memory attributes set; on the H200 kDenseCtasPerSm for both).
// cudaErrorInvalidValue for v1 or another head_dim.
cudaError_t dense_ctas_per_sm(DenseKernel k, int head_dim, int* ctas);
// Splits kernel k uses for num_tokens tokens of num_heads flat heads of head_dim on this device (v1:
// decode_splits; the streaming kernels: dense_stream_splits with the device's multiprocessors and the
// kernel's occupancy, capped at kDenseCtasPerSm). Throws Error if the occupancy query fails.
int dense_splits(DenseKernel k, int64_t num_tokens, int num_heads, int head_dim);

// Raw launch parameters of the streaming kernels. Split s of flat head h covers tokens
// [s * n / S, (s + 1) * n / S) (integer division; S = num_splits <= n, so no split is empty and the
// lengths differ by at most one token), streamed in tiles of the kernel's tile tokens.
struct DenseParams {
  const float* q = nullptr;     // [H, G, D] f32 (unscaled)
  const uint16_t* k = nullptr;  // [H, kv_stride, D] bf16, 16-byte aligned
  const uint16_t* v = nullptr;  // [H, kv_stride, D] bf16, 16-byte aligned
  int64_t kv_stride = 0, num_tokens = 0;
  int num_heads = 0, group = 0, head_dim = 0;
  float scale = 0.0f;
  int num_splits = 0;  // CTAs per head, in [1, num_tokens]
  // Partial states as kernels.h DecodeParams with total_splits = num_splits, split_offset 0:
  float2* part_ml = nullptr;  // [H, num_splits, G] (m, l)
  float* part_o = nullptr;    // [H, num_splits, G, D] un-normalised numerators
  FusedMerge merge;           // off unless merge.counter is set (then out[h] is written by the last CTA)
};
// Launches streaming kernel k (cudaErrorInvalidValue for v1, a bad shape or unaligned K/V).
cudaError_t dense_decode_stream(DenseKernel k, const DenseParams& p, cudaStream_t s);

struct DenseDecodeArgs {
  DenseKernel kernel = kDefaultDenseKernel;
  const float* q = nullptr;     // [H, G, D] f32 (unscaled)
  const uint16_t* k = nullptr;  // [H, kv_stride, D] bf16
  const uint16_t* v = nullptr;  // [H, kv_stride, D] bf16
  int64_t kv_stride = 0, num_tokens = 0;
  int num_heads = 0, group = 0, head_dim = 0;
  float scale = 0.0f;  // the effective scale (effective_scale)
  // Split workspace of max_splits slots per flat head: [H, max_splits, G] float2 and [H, max_splits, G, D]
  // f32. The splits are clamped to max_splits.
  float2* part_ml = nullptr;
  float* part_o = nullptr;
  int max_splits = 0;
  // [H] int, zero (and left zero): the streaming kernels merge the splits in their last CTA per head
  // (kernels.h FusedMerge) when set, the splits fit kMergeMaxStates and out is 16-byte aligned; otherwise
  // (and always for v1) combine_states follows.
  int* merge_counter = nullptr;
  float* out = nullptr;  // [H, G, D] f32
};
// Validates, launches the chosen kernel (and the combine when needed), checks each launch (launch_check
// names `who`); returns the splits used.
int dense_decode(const DenseDecodeArgs& a, cudaStream_t s, const char* who);

}  // namespace retroinfer::cuda::detail
