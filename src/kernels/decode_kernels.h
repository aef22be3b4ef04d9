// Decode attention kernels (decode.cu): exact split-K attention, estimation, merge of partial states.
// Shared notation: kernels/kernel_common.h. Launchers validate nothing and return the launch status.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/kernel_common.h"
#include "kernels/select_kernels.h"

namespace retroinfer::cuda::detail {

// ---- decode attention (decode.cu) ----

// Fused merge: the CTA that writes the last of head h's total_splits partial states (counted by an atomic
// per head) merges them into out[h] itself, so no combine_states launch follows. The dense decode's
// streaming kernels take it (decode_dense.h DenseParams::merge). counter: [H] int, zero before the decode;
// that CTA resets its head's entry to zero, so a graph replays without a memset. Needs total_splits * G <=
// kMergeMaxStates (the merge weights in shared memory) and a 16-byte aligned out (float4 stores); the host
// checks both.
struct FusedMerge {
  int* counter = nullptr;  // [H]
  float* out = nullptr;    // [H, G, D] f32
};
inline constexpr int kMergeMaxStates = 4096;  // 16 KiB of f32 weights in the CTA's spent shared memory

// The estimation zone of a decode (DecodeParams::est): per estimated cluster j of head h, weight
// size_j * e^{logit_j} in the denominator and e^{logit_j} * VS_j in the numerator (docs/design.md §2).
struct EstimationZone {
  const float* logits = nullptr;              // [H, G, C] f32 (scaled, from score_clusters)
  const uint16_t* value_sums_bf16 = nullptr;  // [H, C, D]
  const int* sizes = nullptr;                 // [H, C]
  const int* estimation_ids = nullptr;        // [H, k_estimation], -1 padded
  int num_clusters = 0, k_estimation = 0;
  int split_offset = 0;  // partial-state slot of the first estimation CTA (after the exact splits)
};
// Estimated clusters per estimation CTA: est_ctas = ceil(k_estimation / kEstimateChunk) partial states per
// head. 64 keeps a CTA at 18.3 KiB of shared memory and 64 registers (D = 128), so that one fits on a
// multiprocessor beside three exact CTAs and eight fill one alone.
inline constexpr int kEstimateChunk = 64;

// int8 K/V rows (the 8-bit KV cache, --kv-dtype int8): row t of flat head h holds D int8 values q and one f32
// scale s (x = q * s): values [H, kv_stride, D] (16-byte aligned), scales [H, kv_stride]. Keys relative to
// the key calibration k_mean, k_factor ([H, D] f32 each; kv_int8_kernels.h): key t is y * k_factor + k_mean,
// so decode scores (q * k_factor) . y and adds q . k_mean.
struct KvInt8Rows {
  const int8_t* k = nullptr;
  const int8_t* v = nullptr;
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  const float* k_mean = nullptr;
  const float* k_factor = nullptr;
  bool on() const { return k != nullptr; }
};

struct DecodeParams {
  const float* q = nullptr;   // [H, G, D] f32 (unscaled)
  const uint16_t* k = nullptr;  // K, bf16 [H, kv_stride, D] (null with kv8)
  const uint16_t* v = nullptr;  // V
  KvInt8Rows kv8;               // int8 K/V instead of k / v (kv8.on())
  int64_t kv_stride = 0;
  // Tokens: dense [0, num_tokens) when token_list is null, else token_list[h, 0 .. token_count[h]).
  int64_t num_tokens = 0;
  const int* token_list = nullptr;  // [H, list_stride]
  const int* token_count = nullptr;  // [H]
  int64_t list_stride = 0;
  int num_heads = 0, group = 0, head_dim = 0;
  float scale = 0.0f;
  int num_splits = 0;      // CTAs per head
  int64_t split_tokens = 0;  // tokens per split (multiple of kDecodeTile * warps)
  // Partial states: [H, total_splits, G] scalars (m, l) and [H, total_splits, G, D] numerators; this
  // kernel writes slots [split_offset, split_offset + num_splits).
  float2* part_ml = nullptr;
  float* part_o = nullptr;
  int total_splits = 0, split_offset = 0;
  bool pdl = false;  // launch as a programmatic dependent of the previous kernel on the stream
  uint64_t* phase = nullptr;  // [H, kPhaseSlots] diagnostics (null: off)
  // Each head's tokens split evenly over its num_splits CTAs on the device (ceil(count / splits) rounded up
  // to whole tiles) instead of split_tokens, which the host sizes for the list's capacity: a selection fills
  // only part of it (~64% at 128K), and the CTAs past the head's count would otherwise idle.
  bool balance = false;
  // est_ctas > 0 (token lists only): the estimation zone as a second grid of est_ctas CTAs per head
  // (kEstimateChunk estimated clusters each, partial states in slots est.split_offset + j of this struct's
  // part_ml / part_o / total_splits), launched right after the exact grid, as its programmatic dependent when
  // chain_pdl. The exact grid is then the register-capped kernel whose CTAs let the estimation grid launch
  // right after their own PDL wait, so that estimation CTAs fill the room beside the exact ones (decode.cu
  // decode_exact_kernel, estimate_kernel).
  EstimationZone est;
  int est_ctas = 0;
  bool chain_pdl = false;
};
inline constexpr int kDecodeWarps = 4;   // warps per CTA
inline constexpr int kDecodeTile = 16;   // tokens per warp tile
// CTAs of the decode kernels that fit on one multiprocessor by shared memory: two cp.async stages of K and V
// tiles per warp, 68 KiB per CTA at D = 128 (228 KiB / (68 + 1 reserved) KiB).
inline constexpr int kDecodeCtasPerSm = 3;
cudaError_t decode_attention(const DecodeParams& p, cudaStream_t s);
// Diagnostics: the per-CTA resources of the exact grid's kernel and the estimation grid's kernel that a
// decode with estimation launches (cudaFuncGetAttributes: registers per thread; shared memory = the launch's
// dynamic bytes + the kernel's static bytes, without what the device reserves per CTA), and the current
// device's limits per multiprocessor. cudaErrorInvalidValue for another head_dim or group.
struct ExactGridFootprint {
  int exact_regs = 0, est_regs = 0;
  size_t exact_smem = 0, est_smem = 0;
  int sm_regs = 0;                        // registers per multiprocessor
  size_t sm_smem = 0, cta_reserved = 0;   // shared memory per multiprocessor, reserved per CTA (bytes)
};
cudaError_t exact_grid_footprint(int head_dim, int group, ExactGridFootprint* out);

struct CombineParams {
  const float2* part_ml = nullptr;
  const float* part_o = nullptr;
  int num_heads = 0, group = 0, head_dim = 0, total_splits = 0;
  float* out = nullptr;  // [H, G, D] f32
  uint64_t* phase = nullptr;  // [H, kPhaseSlots] diagnostics (null: off)
  // Launched as a programmatic dependent of the grid before it (created streams only): its CTAs start while
  // that grid drains and wait (griddepcontrol.wait) before reading the partial states.
  bool pdl = false;
};
cudaError_t combine_states(const CombineParams& p, cudaStream_t s);


// Splits of a token range over CTAs: enough CTAs for ~`waves` full waves of the chip (kDecodeCtasPerSm
// CTAs of the decode kernel fit on one multiprocessor by shared memory), each split a multiple of a CTA's
// tile round.
inline int decode_splits(int64_t tokens, int num_heads, int waves) {
  const int64_t round = int64_t{kDecodeTile} * kDecodeWarps;
  const int64_t want = int64_t{kDecodeCtasPerSm} * sm_count() * waves / num_heads;  // floor: no partial extra wave
  const int64_t most = ceil_div(tokens, round);
  const int64_t s = want < most ? want : most;
  return static_cast<int>(s > 0 ? s : 1);
}
inline int64_t split_tokens(int64_t tokens, int splits) {
  const int64_t round = int64_t{kDecodeTile} * kDecodeWarps;
  return ceil_div(ceil_div(tokens, splits), round) * round;
}

}  // namespace retroinfer::cuda::detail
