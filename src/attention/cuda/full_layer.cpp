// FullLayerAttention: exact decode attention over every cached token (see layer_attention_full.h).
#include "attention/cuda/full_layer.h"

#include <optional>

#include "attention/cuda/kv_int8_cache.h"
#include "kernels/decode_dense.h"
#include "kernels/kernels.h"
#include "kernels/prefill_attention_ref.h"
#include "retroinfer/error.h"

namespace retroinfer::cuda {
namespace {

class FullLayerAttention final : public LayerAttention {
 public:
  FullLayerAttention(const AttentionShape& shape, const AttentionConfig& cfg, int num_seqs, int64_t max_tokens,
                     DType kv_dtype)
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
    if (kv_dtype == DType::kI8) {
      RETROINFER_CHECK(decoder_.has_value(), "full attention: the 8-bit KV cache takes head_dim 64 or 128 and GQA ",
                       "groups up to ", detail::kMaxGroup, ", not head_dim ", shape.head_dim, " group ", group);
      kv8_.emplace(num_seqs * shape.num_heads_kv, max_tokens, shape.head_dim);
      device_bytes_ += kv8_->device_bytes();
    } else {
      RETROINFER_CHECK(kv_dtype == DType::kBF16, "full attention on the GPU keeps its KV in bf16 or int8, not ",
                       dtype_name(kv_dtype));
    }
  }

  // 8-bit KV: k, v are the runner's bf16 staging, quantised into the layer's own cache (and then free).
  void prefill_done(const uint16_t* k, const uint16_t* v, int64_t num_tokens, int64_t kv_stride, Stream s) override {
    RETROINFER_CHECK(k != nullptr && v != nullptr, "full attention: prefill_done with null K or V");
    RETROINFER_CHECK(num_tokens >= 0 && kv_stride >= num_tokens && kv_stride >= max_tokens_,
                     "full attention: kv_stride ", kv_stride, " must hold max_tokens ", max_tokens_, " and the ",
                     num_tokens, " prefilled tokens");
    prefilled_ = true;
    if (kv8_) {  // flat head f of the staging at f * kv_stride rows, as the cache's at f * max_tokens_
      kv8_->fill(k, v, num_tokens, kv_stride, s);
      n_ = num_tokens;
      return;
    }
    k_ = k;
    v_ = v;
    kv_stride_ = kv_stride;
  }

  void decode(const float* q, const uint16_t* k_new, const uint16_t* v_new, int64_t num_tokens, float* out,
              Stream s) override {
    RETROINFER_CHECK(prefilled_, "full attention: decode before prefill_done");
    RETROINFER_CHECK(num_tokens >= 1 && num_tokens <= max_tokens_, "full attention: num_tokens ", num_tokens,
                     " outside [1, ", max_tokens_, "]");
    if (kv8_) {  // the layer owns its KV: append the step's token, then attend over the int8 rows
      RETROINFER_CHECK(num_tokens == n_ + 1, "full attention (8-bit KV): ", num_tokens, " tokens after ", n_,
                       " (the layer appends exactly one token per step)");
      kv8_->append(k_new, v_new, num_tokens - 1, s);
      n_ = num_tokens;
      decoder_->run_int8(q, kv8_->rows(), num_tokens, max_tokens_, scale_, out, s);
    } else if (decoder_) {
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
  std::optional<KvInt8Cache> kv8_;       // the 8-bit KV cache (kv_dtype int8): the layer owns its KV
  int64_t n_ = 0;                        // kv8_: tokens held
  bool prefilled_ = false;
  int64_t device_bytes_ = 0;
  const uint16_t* k_ = nullptr;  // [num_seqs, Hkv, kv_stride_, D] bf16, owned by the runner
  const uint16_t* v_ = nullptr;
  int64_t kv_stride_ = 0;
  AttentionStats stats_;
};

}  // namespace

std::unique_ptr<LayerAttention> make_full_layer_attention(const AttentionShape& shape, const AttentionConfig& cfg,
                                                          int num_seqs, int64_t max_tokens, DType kv_dtype) {
  return std::make_unique<FullLayerAttention>(shape, cfg, num_seqs, max_tokens, kv_dtype);
}

}  // namespace retroinfer::cuda
