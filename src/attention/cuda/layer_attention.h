// The decode-attention methods behind the runner's per-layer seam (include/retroinfer/cuda_model.h
// LayerAttention), src/backend/cuda only. The factory make_layer_attention is in layer_attention.cpp (retro
// on the GPU and host tiers), the baselines (quest, streaming, oracle) in layer_attention_baselines.cpp.
//
// Every class follows the CPU method of the same name (src/attention/*.cpp) step for step as tokens are
// appended: the steady zone, budgets and selections are recomputed from the current token count exactly
// as the CPU's decode() does. last_stats() is computed on the host from sizes and budgets (no sync);
// where the exact count depends on the device's selection it is an upper bound (retro: the retrieval
// clusters' sizes are bounded by the n_r largest clusters); exact_stats() reads the device's counts back
// (retro: the per-head exact-list lengths; the wave buffer: the execution buffer's rows), and
// CudaSession::last_stats() reports those.
#pragma once

#include <cstdint>
#include <memory>

#include "retroinfer/cuda_backend.h"

namespace retroinfer::cuda {

// Full attention (DenseDecoder), written on the model-runner branch
// (src/backend/cuda/model/layer_attention_full.cpp).
std::unique_ptr<LayerAttention> make_full_layer_attention(const AttentionShape& shape, const AttentionConfig& cfg,
                                                          int num_seqs, int64_t max_tokens,
                                                          DType kv_dtype = DType::kBF16);

namespace detail {
std::unique_ptr<LayerAttention> make_quest_layer_attention(const AttentionShape& shape, const AttentionConfig& cfg,
                                                           int num_seqs, int64_t max_tokens);
std::unique_ptr<LayerAttention> make_streaming_layer_attention(const AttentionShape& shape,
                                                               const AttentionConfig& cfg, int num_seqs,
                                                               int64_t max_tokens);
std::unique_ptr<LayerAttention> make_oracle_layer_attention(const AttentionShape& shape, const AttentionConfig& cfg,
                                                            int num_seqs, int64_t max_tokens);
// The baselines' exact-token budget: baseline_budget (retroinfer/wave_counts.h).
}  // namespace detail

}  // namespace retroinfer::cuda
