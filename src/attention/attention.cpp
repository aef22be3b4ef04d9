// The attention interface: the factory, batching and dense prefill (names and validation of the parameters:
// src/core/attention_config.cpp).
#include "retroinfer/attention.h"

#include <cmath>

#include "attention/exact.h"
#include "attention/methods.h"
#include "retroinfer/error.h"

namespace retroinfer {

std::unique_ptr<AttentionMethod> make_attention(const AttentionConfig& cfg, const AttentionShape& shape) {
  validate(shape);
  validate(cfg);
  switch (cfg.kind) {
    case AttentionKind::kFull: return attention::make_full(cfg, shape);
    case AttentionKind::kRetro: return attention::make_retro(cfg, shape);
    case AttentionKind::kQuest: return attention::make_quest(cfg, shape);
    case AttentionKind::kStreaming: return attention::make_streaming(cfg, shape);
    case AttentionKind::kOracle: return attention::make_oracle(cfg, shape);
  }
  RETROINFER_FAIL("unknown attention kind");
}

void decode_batch(std::span<DecodeItem> items) {
  for (auto& it : items) {
    RETROINFER_CHECK(it.method && it.kv && it.q && it.out, "decode_batch: item with a null pointer");
    it.stats = it.method->decode(*it.kv, it.q, it.out);
  }
}

void prefill_attention(const KvCache& kv, const AttentionShape& shape, float scale, int64_t pos0, int64_t n,
                       const float* q, float* out) {
  validate(shape);
  RETROINFER_CHECK(kv.num_heads_kv() == shape.num_heads_kv && kv.head_dim() == shape.head_dim,
                   "prefill_attention: KV cache has ", kv.num_heads_kv(), " heads of dim ", kv.head_dim(),
                   ", the shape says ", shape.num_heads_kv, " of dim ", shape.head_dim);
  RETROINFER_CHECK(pos0 >= 0 && n >= 0 && pos0 + n <= kv.size(), "prefill_attention: positions [", pos0, ", ",
                   pos0 + n, ") exceed the ", kv.size(), " cached tokens");
  const float sc = attention::effective_scale(scale, shape.head_dim);
  const int group = shape.num_heads_q / shape.num_heads_kv;
  const int d = shape.head_dim;
  const int64_t work = n * shape.num_heads_kv;
#pragma omp parallel for schedule(dynamic, 4)
  for (int64_t w = 0; w < work; ++w) {
    const int64_t i = w / shape.num_heads_kv;
    const int kvh = static_cast<int>(w % shape.num_heads_kv);
    const int64_t row = (i * shape.num_heads_q + static_cast<int64_t>(kvh) * group) * d;
    attention::GroupState gs(group, d);
    attention::accumulate_range(kv, kvh, q + row, sc, 0, pos0 + i + 1, gs);
    gs.finish(out + row);
  }
}

namespace attention {

void MethodBase::check_kv(const KvCache& kv) const {
  RETROINFER_CHECK(kv.num_heads_kv() == shape_.num_heads_kv && kv.head_dim() == shape_.head_dim,
                   attention_kind_name(cfg_.kind), ": KV cache has ", kv.num_heads_kv(), " heads of dim ",
                   kv.head_dim(), ", the method was made for ", shape_.num_heads_kv, " of dim ", shape_.head_dim);
  RETROINFER_CHECK(kv.size() > 0, attention_kind_name(cfg_.kind), ": decode on an empty KV cache");
}

}  // namespace attention
}  // namespace retroinfer
