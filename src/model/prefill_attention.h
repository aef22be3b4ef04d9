// Causal prefill attention of the CPU runner, two kernels with the same result as retroinfer::prefill_attention
// (the scalar reference in src/attention) up to f32 summation order and the exponential's ~2e-7 relative error
// (tests/unit/test_model.cpp compares them):
//   - BLAS: for each KV head, the stacked query heads of its GQA group in tiles of rows, the tiles in parallel;
//     per tile the scores against blocks of keys (cblas_sgemm), an online softmax across key blocks, and the
//     probability-weighted values (cblas_sgemm), skipping key blocks no row of the tile sees; the softmax step
//     vectorised (core/vec_math.h);
//   - fused (AVX2 + FMA; AVX-512 F where present): the same tiling with register-blocked kernels over packed keys
//     and values, scores kept in registers and L1 (prefill_attention_x86.h, prefill_attention_tiles.h).
// cpu_prefill_attention picks the fused kernel where it runs.
#pragma once

#include <cstdint>
#include <vector>

#include "retroinfer/attention.h"
#include "retroinfer/kv_cache.h"

namespace retroinfer::model {

// Reusable buffers (grow on demand), shaped by the kernel that last used them. Not shared between threads.
struct PrefillAttentionScratch {
  std::vector<float> q;     // BLAS: [group * n, head_dim]: the group's query rows, head-major
  std::vector<float> s;     // scores, then probabilities: BLAS [threads, <= kRowTile, <= kKeyBlock];
                            // fused [threads, kFusedMaxStripRows, kFusedKeyBlock]
  std::vector<float> o;     // un-normalised outputs: BLAS [group * n, head_dim]; fused [threads, kFusedTileRows, d]
  std::vector<float> m, l;  // running max and denominator: BLAS [group * n]; fused [threads, kFusedTileRows]
  std::vector<float> k, v;  // one head's keys / values in f32: BLAS [tokens, head_dim] (non-f32 caches only);
                            // fused in 16-key / 16-dim panels (prefill_attention_tiles.h)
};

// Key block of the online softmax, and the query rows a thread takes at a time: a tile's scores are
// kRowTile * kKeyBlock floats (512 KiB), held in the core's L2 from one product to the next; 256 rows per
// BLAS call keep the repacking of each key block (once per tile) small beside the products.
inline constexpr int64_t kKeyBlock = 512;
inline constexpr int64_t kRowTile = 256;

// Positions [pos0, pos0 + n) attend to cached tokens [0, pos0 + i]. q, out: [n, num_heads_q, head_dim] f32.
// scale: 0 means 1 / sqrt(head_dim).
void blas_prefill_attention(const KvCache& kv, const AttentionShape& shape, float scale, int64_t pos0, int64_t n,
                            const float* q, float* out, PrefillAttentionScratch& scratch);

// The same attention with register-blocked AVX2 + FMA (or AVX-512) kernels that keep each strip of rows' scores
// in registers and L1 (prefill_attention_x86.h): no BLAS, none of its zeroing and repacking. Needs
// fused_prefill_attention_supported(shape): an AVX2 + FMA processor and head_dim a multiple of 16 up to 256.
bool fused_prefill_attention_supported(const AttentionShape& shape);
void fused_prefill_attention(const KvCache& kv, const AttentionShape& shape, float scale, int64_t pos0, int64_t n,
                             const float* q, float* out, PrefillAttentionScratch& scratch);

// The CPU runner's prefill attention: the fused kernels where supported, else the BLAS path.
void cpu_prefill_attention(const KvCache& kv, const AttentionShape& shape, float scale, int64_t pos0, int64_t n,
                           const float* q, float* out, PrefillAttentionScratch& scratch);

}  // namespace retroinfer::model
