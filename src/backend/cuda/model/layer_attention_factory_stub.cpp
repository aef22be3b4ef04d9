// make_layer_attention for this branch alone: full attention on GPU-resident K/V only. The real factory
// (src/backend/cuda/layer_attention*.cpp: retro, quest, streaming, oracle, the host tier) calls
// make_full_layer_attention for full; delete this file when merging it.
#include "backend/cuda/model/layer_attention_full.h"
#include "retroinfer/error.h"

namespace retroinfer::cuda {

std::unique_ptr<LayerAttention> make_layer_attention(const AttentionShape& shape, const AttentionConfig& cfg,
                                                     int num_seqs, int64_t max_tokens, KvTier tier,
                                                     const WaveBufferConfig&) {
  RETROINFER_CHECK(cfg.kind == AttentionKind::kFull && tier == KvTier::kGpu, "CUDA decode attention '",
                   attention_kind_name(cfg.kind), "' with ", tier == KvTier::kGpu ? "GPU" : "host",
                   "-resident KV is not implemented in this build (only full attention on the GPU); use "
                   "--attention full");
  return make_full_layer_attention(shape, cfg, num_seqs, max_tokens);
}

}  // namespace retroinfer::cuda
