// FullLayerAttention: exact decode attention over every cached token (see layer_attention_full.h).
#include "attention/cuda/full_layer.h"

#include <optional>

#include "kernels/kernels.h"
#include "kernels/prefill_attention_ref.h"
#include "retroinfer/error.h"

namespace retroinfer::cuda {
namespace {

class FullLayerAttention final : public LayerAttention {
 public:
  FullLayerAttention(const AttentionShape& shape, const AttentionConfig& cfg, int num_seqs, int64_t max_tokens)
      : shape_(shape), scale_(cfg.scale), num_seqs_(num_seqs), max_tokens_(max_tokens) {
    validate(shape);
    validate(cfg);
    RETROINFER_CHECK(num_seqs >= 1, "full attention: num_seqs must be >= 1, got ", num_seqs);
    RETROINFER_CHECK(max_tokens >= 1, "full attention: max_tokens must be >= 1, got ", max_tokens);
    const int group = shape.num_heads_q / shape.num_heads_kv;
    if ((shape.head_dim == 64 || shape.head_dim == 128) && group <= detail::kMaxGroup) {
      decoder_.emplace(shape, num_seqs, max_tokens);
      const int64_t H = int64_t{num_seqs} * shape.num_heads_kv;
      // DenseDecoder's split workspace: per (flat head, split, group member) a (max, sum) float2 and a
      // head_dim f32 partial output, and an int merge counter per flat head (dense_decoder.cpp).
      device_bytes_ = H * decoder_->num_splits(max_tokens) * group * (8 + 4 * int64_t{shape.head_dim}) + H * 4;
    } else {
      RETROINFER_CHECK(shape.head_dim % 2 == 0 && shape.head_dim <= model::kRefMaxHeadDim, "full attention: head_dim ",
                       shape.head_dim, " is not supported (even, <= ", model::kRefMaxHeadDim, ")");
    }
  }

  void prefill_done(const uint16_t* k, const uint16_t* v, int64_t num_tokens, int64_t kv_stride, Stream) override {
    RETROINFER_CHECK(k != nullptr && v != nullptr, "full attention: prefill_done with null K or V");
    RETROINFER_CHECK(num_tokens >= 0 && kv_stride >= num_tokens && kv_stride >= max_tokens_,
                     "full attention: kv_stride ", kv_stride, " must hold max_tokens ", max_tokens_, " and the ",
                     num_tokens, " prefilled tokens");
    k_ = k;
    v_ = v;
    kv_stride_ = kv_stride;
  }

  void decode(const float* q, const uint16_t*, const uint16_t*, int64_t num_tokens, float* out, Stream s) override {
    RETROINFER_CHECK(k_ != nullptr, "full attention: decode before prefill_done");
    RETROINFER_CHECK(num_tokens >= 1 && num_tokens <= max_tokens_, "full attention: num_tokens ", num_tokens,
                     " outside [1, ", max_tokens_, "]");
    if (decoder_) {
      decoder_->run(q, k_, v_, num_tokens, kv_stride_, scale_, out, s);
    } else {
      model::RefAttentionArgs a;
      a.q = q;
      a.k = k_;
      a.v = v_;
      a.out = out;
      a.kv_stride = kv_stride_;
      a.pos0 = num_tokens - 1;
      a.n = 1;
      a.num_seqs = num_seqs_;
      a.scale = scale_;
      model::prefill_attention_reference(shape_, a, s);
    }
    stats_ = AttentionStats{};
    stats_.context_tokens = num_tokens * shape_.num_heads_kv * num_seqs_;
    stats_.exact_tokens = stats_.context_tokens;
  }

  AttentionStats last_stats() const override { return stats_; }
  int64_t device_bytes() const override { return device_bytes_; }
  int64_t host_bytes() const override { return 0; }

 private:
  AttentionShape shape_;
  float scale_ = 0.0f;
  int num_seqs_ = 1;
  int64_t max_tokens_ = 0;
  std::optional<DenseDecoder> decoder_;  // empty: the reference kernel
  int64_t device_bytes_ = 0;
  const uint16_t* k_ = nullptr;  // [num_seqs, Hkv, kv_stride_, D] bf16, owned by the runner
  const uint16_t* v_ = nullptr;
  int64_t kv_stride_ = 0;
  AttentionStats stats_;
};

}  // namespace

std::unique_ptr<LayerAttention> make_full_layer_attention(const AttentionShape& shape, const AttentionConfig& cfg,
                                                          int num_seqs, int64_t max_tokens) {
  return std::make_unique<FullLayerAttention>(shape, cfg, num_seqs, max_tokens);
}

}  // namespace retroinfer::cuda
