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

// Fused merge (run 8): the CTA that writes the last of head h's total_splits partial states (decode and
// estimation CTAs together, counted by an atomic per head) merges them into out[h] itself, so no
// combine_states launch follows. counter: [H] int, zero before the decode; that CTA resets its head's
// entry to zero, so a graph replays without a memset. Needs total_splits * G <= kMergeMaxStates (the
// merge weights in shared memory) and a 16-byte aligned out (float4 stores); the host checks both.
struct FusedMerge {
  int* counter = nullptr;  // [H]
  float* out = nullptr;    // [H, G, D] f32
};
inline constexpr int kMergeMaxStates = 4096;  // 16 KiB of f32 weights: the estimate kernel's reduction buffer

struct EstimateParams {
  const float* logits = nullptr;  // [H, G, C] f32 (scaled, from score_clusters)
  const uint16_t* value_sums_bf16 = nullptr;  // [H, C, D]
  const int* sizes = nullptr;     // [H, C]
  const int* estimation_ids = nullptr;  // [H, k_estimation], -1 padded
  int num_heads = 0, group = 0, head_dim = 0, num_clusters = 0, k_estimation = 0;
  int num_splits = 0;
  float2* part_ml = nullptr;
  float* part_o = nullptr;
  int total_splits = 0, split_offset = 0;
  FusedMerge merge;  // as DecodeParams::merge (the same counter: both kernels' CTAs count)
  uint64_t* phase = nullptr;  // [H, kPhaseSlots] diagnostics (null: off)
};
inline constexpr int kEstimateChunk = 64;  // estimated clusters per CTA: num_splits = ceil(k_estimation / 64)
cudaError_t estimate_attention(const EstimateParams& p, cudaStream_t s);
// Run 9: estimated clusters per estimation CTA of the exact-attention grid (DecodeParams::est_ctas). A
// multiple of kEstimateChunk, so ceil(k / kEstimateFusedChunk) <= ceil(k / kEstimateChunk): run 9 fits in
// the partial-state slots the layers size for run 8's estimation splits. Equal to the decode CTA's thread
// count (one cluster per thread while loading).
inline constexpr int kEstimateFusedChunk = 128;
static_assert(kEstimateFusedChunk % kEstimateChunk == 0, "run 9 must need no more slots than run 8");

// Run 17 pre-merge (split64ep / erp): the estimation CTAs of head h count into counter[h] after writing their
// partial states; the last one merges the head's est_ctas states (fixed slot order, merge_if_last's arithmetic)
// into one unnormalised state (m, l, o: softmax_state.h) in slot `slot` of the final merge's states and counts
// into merge.counter like an exact CTA, so the final merge sums num_splits + 1 states. counter: [H] int, zero
// before the decode; the last estimation CTA of a head resets its entry (graph replays need no memset).
struct EstPremerge {
  int* counter = nullptr;     // [H]: estimation CTAs counted per head (null: off)
  float2* part_ml = nullptr;  // the final merge's states [H, total, G] (m, l) ...
  float* part_o = nullptr;    // ... and [H, total, G, D] numerators
  int total = 0, slot = 0;    // states of the final merge per head; the slot of the pre-merged state
  FusedMerge merge;           // the final merge's counter and output
};

inline constexpr int kPremergeSlots = 1;  // partial-state slots per head a layer sizes beyond attn + est splits

struct DecodeParams {
  const float* q = nullptr;   // [H, G, D] f32 (unscaled)
  const uint16_t* k = nullptr;  // K
  const uint16_t* v = nullptr;  // V
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
  FusedMerge merge;  // off unless merge.counter is set
  bool pdl = false;  // launch as a programmatic dependent of the previous kernel on the stream
  uint64_t* phase = nullptr;  // [H, kPhaseSlots] diagnostics (null: off)
  // Run 8: each head's tokens split evenly over its num_splits CTAs on the device (ceil(count / splits)
  // rounded up to whole tiles), instead of split_tokens (sized by the host for the list capacity).
  bool balance = false;
  // Run 9: est_ctas more CTAs per head (blockIdx.x in [num_splits, num_splits + est_ctas)) run the
  // estimation zone over kEstimateFusedChunk estimated clusters each, after the same PDL wait, instead of
  // estimate_attention on a side stream. est holds their inputs: logits, value sums, sizes, ids, group,
  // head_dim (= this kernel's), num_clusters, k_estimation, and est.split_offset = the slot of the first
  // of them (num_splits); part_ml / part_o / total_splits / merge / phase are this struct's. 0: none.
  EstimateParams est;
  int est_ctas = 0;
  // How the run 9 grid runs when est_ctas > 0 (ExactVariant): kExactV1 = one grid (above); kExactSplit /
  // kExactSplit64 = the exact splits as one grid, then the est_ctas estimation CTAs (exact_est_chunk clusters
  // each) as a second grid launched right after it, a programmatic dependent of it when chain_pdl (decode.cu
  // decode_exact_kernel); the est-first variants (exact_est_first) launch the estimation grid first and the
  // exact grid as its programmatic dependent when chain_pdl.
  int exact_variant = 0;
  bool chain_pdl = false;
  // Run 17 pre-merge (exact_premerges: split64ep / erp; decode.cu estimate_premerge_kernel): the estimation
  // CTAs' states pre-merged into one by the last estimation CTA of each head. The host sets premerge.counter
  // only (null: the variant runs its est-first grids without the pre-merge, the usual layout), and then
  // total_splits = num_splits + 1 + est_ctas and est.split_offset = num_splits + 1; decode.cu fills the rest for
  // the estimation grid (launch_premerged).
  EstPremerge premerge;
};
// RETROINFER_EXACT (exact_variant_from_env, read at every decode; layer_attention_zones.cpp) picks how run 9's
// exact + estimation grid runs (DecodeParams::exact_variant):
//   v1       run 9's grid: the exact splits and the estimation CTAs (128 clusters) in one kernel (the default
//            before run 16)
//   split    two grids, the estimation chained behind the exact one (128-cluster CTAs of estimate_cta without
//            the exact role's registers and shared memory; the same partial states as v1 bit for bit)
//   split64  as split with 64-cluster estimation CTAs (18.3 KiB of shared memory and 64 registers at D = 128:
//            eight to a multiprocessor without exact CTAs; meant to fit beside three exact CTAs, which it does
//            not by registers, see run 17 below; run 8's chunking, so ceil(n_e / 64) = est_splits slots; within
//            rounding of v1; the default since run 16)
// Run 17 (issue #4: the estimation grid ran mostly after the exact grid, whose CTAs hold 155 registers, so no
// 64-cluster estimation CTA fit beside three of them), each split64's chunks, code and partial states bit for
// bit (decode.cu "Run 17 exact-grid variants"):
//   split64r    the exact kernel capped at 128 registers (__launch_bounds__(128, 4)): one estimation CTA fits
//               beside three exact CTAs (shared memory then limits it to one)
//   split64i    the exact kernel's token ids loaded ahead: each warp loads the ids of its next 8 tiles in one
//               batch (4 registers per lane), so no tile's copies wait on an L2 round trip of their own
//   split64ri   both
//   split64rh   split64r with estimation CTAs that stage their rows half a chunk at a time and lay out their
//               weights and sums for G query heads (9.25 KiB at D = 128, G = 4): two fit beside three capped
//               exact CTAs, for one more round trip each
//   split64rih  split64ri with split64rh's estimation CTAs
//   split64e    the estimation grid first (it waits for the selection and triggers), the exact grid chained
//               behind it as its programmatic dependent (no wait of its own; its last CTA waits at its end)
//   split64eri  split64e with split64ri's exact kernel
// Run 17 pre-merge (issue #4: under split64e at 128K batch 4 the final merge over 42 states per head ended ~6 us
// after the exact grid), the est-first grids with the estimation states pre-merged (DecodeParams::premerge):
//   split64ep   split64e whose last estimation CTA of each head merges the head's estimation states into one,
//               off the critical path; the final merge sums num_splits + 1 states (exact slots, then the
//               pre-merged one). Within rounding of split64 (another merge tree), bit-identical run to run
//   split64erp  split64ep with split64r's exact kernel (128 registers)
enum ExactVariant : int {
  kExactV1 = 0,
  kExactSplit,
  kExactSplit64,
  kExactSplit64R,
  kExactSplit64I,
  kExactSplit64RI,
  kExactSplit64RH,
  kExactSplit64RIH,
  kExactSplit64E,
  kExactSplit64ERI,
  kExactSplit64EP,
  kExactSplit64ERP,
  kExactVariants
};
// run 17: split64r (the exact kernel at <= 128 registers) took 0.3-3.1 us off split64 at every shape of
// bench/results/run17/ab2-ab4 (32K-1M, batch 1/4/16, both flushes); run 16: split64 79.9 vs 81.3 us at 128K
// batch 4, 193.8 vs 206.3 at batch 16.
inline constexpr int kExactDefault = kExactSplit64R;
// Estimated clusters per estimation CTA of a variant (its est_ctas = ceil(n_e / this) <= est_splits).
constexpr int exact_est_chunk(int variant) {
  return variant == kExactV1 || variant == kExactSplit ? kEstimateFusedChunk : kEstimateChunk;
}
// The run 17 properties of a variant (all false for v1, split, split64).
constexpr bool exact_caps_registers(int variant) {
  return variant == kExactSplit64R || variant == kExactSplit64RI || variant == kExactSplit64RH ||
         variant == kExactSplit64RIH || variant == kExactSplit64ERI || variant == kExactSplit64ERP;
}
constexpr bool exact_ids_ahead(int variant) {
  return variant == kExactSplit64I || variant == kExactSplit64RI || variant == kExactSplit64RIH ||
         variant == kExactSplit64ERI;
}
constexpr bool exact_est_halves(int variant) { return variant == kExactSplit64RH || variant == kExactSplit64RIH; }
constexpr bool exact_est_first(int variant) {
  return variant == kExactSplit64E || variant == kExactSplit64ERI || variant == kExactSplit64EP ||
         variant == kExactSplit64ERP;
}
constexpr bool exact_premerges(int variant) { return variant == kExactSplit64EP || variant == kExactSplit64ERP; }
int exact_variant_from_env();  // throws retroinfer::Error for a value that names no variant
const char* exact_variant_name(int variant);
inline constexpr int kDecodeWarps = 4;   // warps per CTA
inline constexpr int kDecodeTile = 16;   // tokens per warp tile
cudaError_t decode_attention(const DecodeParams& p, cudaStream_t s);
// cp.async stages per warp of the decode kernel: 2 by default; RETROINFER_DECODE_STAGES=3 keeps 2 tiles in
// flight per warp (run 4, bench/results/run4: no gain at batch 4). CTAs that fit on one multiprocessor by
// shared memory: 3 with 2 stages (68 KiB each), 2 with 3 stages (102 KiB each).
int decode_stages();
int decode_ctas_per_sm();
// Run 17 diagnostics: the per-CTA resources of the exact and estimation kernels that a split* variant
// launches now (decode_stages()) at head_dim, group and total_splits (cudaFuncGetAttributes: registers per
// thread; shared memory = the launch's dynamic bytes + the kernel's static bytes, without the shared memory
// the device reserves per CTA), and the current device's limits per multiprocessor. cudaErrorInvalidValue for
// v1, another head_dim or group.
struct ExactGridFootprint {
  int exact_regs = 0, est_regs = 0;
  size_t exact_smem = 0, est_smem = 0;
  int sm_regs = 0;                        // registers per multiprocessor
  size_t sm_smem = 0, cta_reserved = 0;   // shared memory per multiprocessor, reserved per CTA (bytes)
};
cudaError_t exact_grid_footprint(int variant, int head_dim, int group, int total_splits, ExactGridFootprint* out);

struct CombineParams {
  const float2* part_ml = nullptr;
  const float* part_o = nullptr;
  int num_heads = 0, group = 0, head_dim = 0, total_splits = 0;
  float* out = nullptr;  // [H, G, D] f32
  uint64_t* phase = nullptr;  // [H, kPhaseSlots] diagnostics (null: off)
  // Run 17 (RETROINFER_DECODE=run10c): launched as a programmatic dependent of the grid before it (created
  // streams only); its CTAs wait for that grid (griddepcontrol.wait) before reading the partial states.
  bool pdl = false;
};
cudaError_t combine_states(const CombineParams& p, cudaStream_t s);


// Splits of a token range over CTAs: enough CTAs for ~`waves` full waves of the chip (decode_ctas_per_sm()
// CTAs of the decode kernel fit on one multiprocessor by shared memory), each split a multiple of a CTA's
// tile round.
inline int decode_splits(int64_t tokens, int num_heads, int waves) {
  const int64_t round = int64_t{kDecodeTile} * kDecodeWarps;
  const int64_t want = int64_t{decode_ctas_per_sm()} * sm_count() * waves / num_heads;  // floor: no partial extra wave
  const int64_t most = ceil_div(tokens, round);
  const int64_t s = want < most ? want : most;
  return static_cast<int>(s > 0 ? s : 1);
}
inline int64_t split_tokens(int64_t tokens, int splits) {
  const int64_t round = int64_t{kDecodeTile} * kDecodeWarps;
  return ceil_div(ceil_div(tokens, splits), round) * round;
}

}  // namespace retroinfer::cuda::detail
