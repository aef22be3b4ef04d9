// Full (exact) decode attention behind the LayerAttention seam, over the runner's GPU K/V.
#pragma once

#include <memory>

#include "retroinfer/cuda_backend.h"

namespace retroinfer::cuda {

// AttentionKind::kFull, KvTier::kGpu. Shapes the DenseDecoder takes (head_dim 64 / 128, GQA group <= 8)
// run through it (flash decoding); any other shape through the reference kernel (prefill_attention_ref.h,
// one query row per sequence). Throws Error on an invalid shape or config.
std::unique_ptr<LayerAttention> make_full_layer_attention(const AttentionShape& shape, const AttentionConfig& cfg,
                                                          int num_seqs, int64_t max_tokens);

}  // namespace retroinfer::cuda
