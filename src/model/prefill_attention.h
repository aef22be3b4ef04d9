// Causal prefill attention through BLAS: for each KV head, the scores of the stacked query heads of its
// GQA group against blocks of keys (cblas_sgemm), an online softmax across key blocks, and the
// probability-weighted values (cblas_sgemm); the softmax step vectorised (core/vec_math.h). Same result as
// retroinfer::prefill_attention (the scalar reference in src/attention) up to f32 summation order and the
// exponential's ~2e-7 relative error; tests/unit/test_model.cpp compares the two.
#pragma once

#include <cstdint>
#include <vector>

#include "retroinfer/attention.h"
#include "retroinfer/kv_cache.h"

namespace retroinfer::model {

// Reusable buffers (grow on demand). Not shared between threads.
struct PrefillAttentionScratch {
  std::vector<float> q;     // [group * n, head_dim]: the group's query rows, head-major
  std::vector<float> s;     // [group * n, key_block]: scores, then probabilities
  std::vector<float> o;     // [group * n, head_dim]: un-normalised outputs
  std::vector<float> m, l;  // [group * n]: running max and denominator
  std::vector<float> k, v;  // [tokens, head_dim]: f32 copies of one head's keys / values (bf16 caches only)
};

// Key block of the online softmax: bounds the score buffer at group * n * kKeyBlock floats.
inline constexpr int64_t kKeyBlock = 1024;

// Positions [pos0, pos0 + n) attend to cached tokens [0, pos0 + i]. q, out: [n, num_heads_q, head_dim] f32.
// scale: 0 means 1 / sqrt(head_dim).
void blas_prefill_attention(const KvCache& kv, const AttentionShape& shape, float scale, int64_t pos0, int64_t n,
                            const float* q, float* out, PrefillAttentionScratch& scratch);

}  // namespace retroinfer::model
