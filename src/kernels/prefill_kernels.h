// Causal GQA prefill attention: kernel parameters and raw launcher (src/attention/cuda only). The host class
// retroinfer::cuda::PrefillAttention (prefill_attention.cpp, declared in cuda_model.h) validates shapes and
// turns failures into exceptions; the launcher validates nothing.
//
// Notation: n query positions [pos0, pos0 + n) of one sequence; Hq query heads, Hkv KV heads, G = Hq / Hkv
// (1..8), D = head_dim (64 or 128).
//   q    [n, Hq, D] f32 (post-RoPE, unscaled); query head qh reads KV head qh / G
//   k, v [Hkv, kv_stride, D] bf16 (uint16 bits), token t of KV head h at (h * kv_stride + t) * D
//   out  [n, Hq, D] f32 (or out_bf16: bf16); row (i, qh) = softmax_{t <= pos0 + i}(scale * q . k_t) . v_t
//
// Kernel (flash-attention-2 style, tensor cores through mma.sync m16n8k16 bf16 with f32 accumulators):
// one CTA of 4 warps owns kPrefillRows = 128 "packed" query rows of one KV head, where packed row r is
// (token r / G, group member r % G): every query head of a GQA group shares each K/V tile the CTA loads. A
// tile holds whole tokens, kPrefillRows / G of them (G = 3, 5, 6, 7: 2 or 3 padding rows; prefill_tile_tokens).
// Each warp owns 32 consecutive packed rows (two m16 tiles). K/V tiles of kPrefillKeys = 64 tokens stream
// through two or three shared-memory stages (three where two CTAs still fit a multiprocessor; cp.async,
// XOR-swizzled 16-byte chunks, conflict-free ldmatrix); the softmax is online (running max and sum per
// row, f32, exp2 with the scale folded in); causal masking is applied only on the tiles that cross the
// diagonal, and tiles beyond a row range's last key are never loaded. CTAs are issued heaviest first
// (largest query positions) to balance the causal triangle, in bands of row tiles whose KV heads take turns
// (prefill_cta), so that the CTAs running at once share one or two heads' K/V in L2.
//
// Precision: q is rounded to bf16 for the QK^T product (the K/V are bf16 already) and the probabilities P
// are rounded to bf16 for the PV product; logits, the running max/sum and the output accumulate in f32.
// tests/gpu/test_cuda_prefill.cpp bounds the error this adds.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace retroinfer::cuda::detail {

struct PrefillParams {
  const float* q = nullptr;     // [n, Hq, D] f32 (the portable kernel's)
  const uint16_t* q_bf16 = nullptr;  // [n, Hq, D]: q rounded to bf16 (the Hopper kernel's, by tensor-map copies)
  const uint16_t* k = nullptr;  // [Hkv, kv_stride, D] bf16
  const uint16_t* v = nullptr;  // [Hkv, kv_stride, D] bf16
  float* out = nullptr;         // [n, Hq, D] f32, or
  uint16_t* out_bf16 = nullptr;  // [n, Hq, D] bf16 (round to nearest even; exactly one of out, out_bf16)
  int64_t kv_stride = 0;        // >= pos0 + n
  int pos0 = 0;                 // first query position; pos0 + n < 2^31
  int n = 0;                    // query positions (>= 1); n * G < 2^31
  int num_heads_q = 0, num_heads_kv = 0, group = 0, head_dim = 0;
  float scale_log2 = 0.0f;  // logit scale times log2(e)
  // Key splits (split-KV): a chunk of few query rows over a long cache launches too few CTAs to fill the GPU
  // (64 rows x 8 KV heads: 8 CTAs, each streaming every key); with splits > 1 each (row tile, KV head) is
  // split into `splits` ranges of key tiles, one CTA each, which write unnormalised parts (part_o) and each
  // row's running (max, sum) (part_ml); a second kernel merges them by log-sum-exp into out.
  int splits = 1;
  float* part_o = nullptr;   // [splits, n, Hq, D] f32 (splits > 1)
  float* part_ml = nullptr;  // [splits, n, Hq, 2] f32: max (log2 units, scaled), sum
  // The Hopper kernel's work counter (one device word, owned by the caller; the launch zeroes it on its stream
  // first): its CTAs, one per multiprocessor, take the work items (row tile, KV head, split) in the order of
  // prefill_cta from it until none is left. Launches sharing a counter must not overlap (one stream).
  unsigned* work = nullptr;
};

inline constexpr int kPrefillRows = 128;  // packed query rows per CTA (4 warps x 32; Hopper: 2 warpgroups x 64)
inline constexpr int kPrefillKeys = 64;   // keys per K/V tile (portable kernel)
// Keys per K/V tile of the Hopper kernel (head_dim 128): 176 in two stages spreads each tile's fixed costs over
// 37% more keys than 128 in three (H200: 2-4% faster at 32K and 128K; docs/cuda-kernels.md).
inline constexpr int kHopperKeys = 176;
inline constexpr int kPrefillWarps = 4;
// Row tiles per band of the CTA order (prefill_common.cuh, prefill_cta): about one wave of the Hopper kernel
// (one CTA per multiprocessor, 132 on an H100 / H200) for each KV head in turn.
inline constexpr int kPrefillBandTiles = 128;

inline constexpr int kPrefillMaxSplits = 16;     // key splits at most
inline constexpr int kPrefillMinSplitTiles = 8;  // key tiles per split at least (512 keys)
// The split parts' workspace of one PrefillAttention (allocated at its first split launch): splits are cut to
// what fits, splits x n x Hq x (D + 2) floats (64 query tokens of Llama-3-8B's shape in 15 splits).
inline constexpr int64_t kPrefillSplitWorkspaceBytes = int64_t{16} << 20;

// Work items of a launch, ceil(n / (kPrefillRows / G)) * Hkv * splits: the portable kernel's CTAs, what the Hopper
// kernel's persistent CTAs take from PrefillParams::work.
int64_t prefill_ctas(const PrefillParams& p);
// The key splits for p (its `splits` ignored) on a GPU of sm_count multiprocessors: 1 when the row tiles alone
// give two CTAs a multiprocessor, else enough to (at most kPrefillMaxSplits, each of at least
// kPrefillMinSplitTiles key tiles).
int prefill_splits(const PrefillParams& p, int sm_count);
// The whole launch (the main kernel, then the split merge when p.splits > 1). hopper: the wgmma kernel of
// prefill_attention_hopper.cu (head_dim 128 on a compute capability 9.0 GPU: prefill_hopper_supported), else the
// portable mma.sync kernel (sm_80 and later).
cudaError_t prefill_attention(const PrefillParams& p, cudaStream_t s, bool hopper);
// True when the current device runs the Hopper kernel (compute capability 9.0 exactly: sm_90a code; and the
// driver's tensor-map encoder, for its K/V copies).
bool prefill_hopper_supported();
// The Hopper kernel alone (no split merge); cudaErrorInvalidValue unless head_dim is 128.
cudaError_t prefill_attention_hopper(const PrefillParams& p, cudaStream_t s);

}  // namespace retroinfer::cuda::detail
