// Full (exact) decode attention behind the LayerAttention seam, over the runner's GPU K/V.
#pragma once

#include <memory>

#include "retroinfer/cuda_backend.h"

namespace retroinfer::cuda {

// AttentionKind::kFull, KvTier::kGpu. Shapes the DenseDecoder takes (head_dim 64 / 128, GQA group <= 8)
// run through it (flash decoding); any other shape through the reference kernel (prefill_attention_ref.h,
// one query row per sequence). kv_dtype kI8: the layer keeps its own 8-bit KV cache (kv_int8_cache.h; the
// runner's K/V at prefill_done is staging it quantises, and decode appends k_new / v_new itself). Throws Error
// on an invalid shape, config or KV dtype.
std::unique_ptr<LayerAttention> make_full_layer_attention(const AttentionShape& shape, const AttentionConfig& cfg,
                                                          int num_seqs, int64_t max_tokens,
                                                          DType kv_dtype = DType::kBF16);

}  // namespace retroinfer::cuda
