// Dense decode attention (exact attention of one decode query over every cached token): the one launch
// function every dense-decode caller goes through (DenseDecoder, i.e. the model runner's full attention and
// kernel_bench's "full"; RetroLayer while nothing is indexed), and the raw launchers of the streaming kernels
// of decode_dense.cu. Internal (src and the tests). Notation as kernels.h.
//
// Kernels (DenseKernel), the same CTA, ring of K/V tile stages and math, the tiles copied differently:
//   kTensorMap  each K or V tile copied by 2-D tensor-map copies (D / 64 boxes of 64 tokens x 64 dims, 128-byte
//               swizzle); warp w takes the consecutive tokens 16w..16w+15. The kernel every caller gets.
//   kBulkCopy   each tile copied by 8 skewed 1-D bulk copies (cp.async.bulk, mbarrier completion). Where no
//               tensor map can be made (the driver has no tensor-map encoder, or kv_stride >= 2^31),
//               dense_decode_stream runs it in kTensorMap's place; the tests ask for it to cover that case.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kernels.h"

namespace retroinfer::cuda::detail {

enum class DenseKernel { kTensorMap, kBulkCopy };

// The streaming kernels' figures.
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
// CTAs of streaming kernel k for head_dim that fit on one multiprocessor (the occupancy query, made once per
// kernel with its shared-memory attributes set; on the H200 kDenseCtasPerSm for both). cudaErrorInvalidValue
// for another head_dim.
cudaError_t dense_ctas_per_sm(DenseKernel k, int head_dim, int* ctas);
// Splits kernel k uses for num_tokens tokens of num_heads flat heads of head_dim on this device
// (dense_stream_splits with the device's multiprocessors and the kernel's occupancy, capped at
// kDenseCtasPerSm). Throws Error if the occupancy query fails.
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
// Launches streaming kernel k (kTensorMap: kBulkCopy where no tensor map can be made); cudaErrorInvalidValue
// for a bad shape or unaligned K/V.
cudaError_t dense_decode_stream(DenseKernel k, const DenseParams& p, cudaStream_t s);

struct DenseDecodeArgs {
  DenseKernel kernel = DenseKernel::kTensorMap;  // kBulkCopy: the fallback's kernel forced (tests)
  const float* q = nullptr;     // [H, G, D] f32 (unscaled)
  const uint16_t* k = nullptr;  // [H, kv_stride, D] bf16
  const uint16_t* v = nullptr;  // [H, kv_stride, D] bf16
  // int8 rows instead of k / v (the 8-bit KV cache): decode.cu's split-K kernel and combine_states (kernel
  // and merge_counter are then unused).
  KvInt8Rows kv8;
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
  // combine_states follows.
  int* merge_counter = nullptr;
  float* out = nullptr;  // [H, G, D] f32
};
// Validates, launches the chosen kernel (and the combine when needed), checks each launch (launch_check
// names `who`); returns the splits used.
int dense_decode(const DenseDecodeArgs& a, cudaStream_t s, const char* who);

}  // namespace retroinfer::cuda::detail
