// The attention interface: names, validation, the factory, batching and dense prefill.
#include "retroinfer/attention.h"

#include <cmath>

#include "attention/exact.h"
#include "attention/methods.h"
#include "retroinfer/error.h"

namespace retroinfer {

std::string_view attention_kind_name(AttentionKind k) {
  switch (k) {
    case AttentionKind::kFull: return "full";
    case AttentionKind::kRetro: return "retro";
    case AttentionKind::kQuest: return "quest";
    case AttentionKind::kStreaming: return "streaming";
    case AttentionKind::kOracle: return "oracle";
  }
  return "?";
}

AttentionKind parse_attention_kind(std::string_view s) {
  for (auto k : {AttentionKind::kFull, AttentionKind::kRetro, AttentionKind::kQuest, AttentionKind::kStreaming,
                 AttentionKind::kOracle})
    if (attention_kind_name(k) == s) return k;
  RETROINFER_FAIL("unknown attention method '", s, "': expected full, retro, quest, streaming or oracle");
}

void validate(const AttentionShape& s) {
  RETROINFER_CHECK(s.num_heads_q > 0, "attention shape: num_heads_q must be positive, got ", s.num_heads_q);
  RETROINFER_CHECK(s.num_heads_kv > 0, "attention shape: num_heads_kv must be positive, got ", s.num_heads_kv);
  RETROINFER_CHECK(s.head_dim > 0, "attention shape: head_dim must be positive, got ", s.head_dim);
  RETROINFER_CHECK(s.num_heads_q % s.num_heads_kv == 0, "attention shape: num_heads_q (", s.num_heads_q,
                   ") must be a multiple of num_heads_kv (", s.num_heads_kv, ")");
}

int default_tokens_per_cluster(int head_dim) {
  RETROINFER_CHECK(head_dim >= 1, "default_tokens_per_cluster: head_dim must be >= 1, got ", head_dim);
  // 128: the head dimension the paper's 16 was set for (Llama-3-8B); measured below it only at 64
  // (SmolLM2 on the H200, docs/accuracy.md run 14: teacher-forced perplexity against full over 128 / 64
  // windows at 4K / 8K: 2 tokens per cluster +0.82% / +0.13%, 4 tokens +1.3% / +1.2%, 8 tokens +2.9% /
  // +1.9%; run 13's tasks: 4 tokens 35.3 / 21.4 average vs full's 36.0 / 22.0, 8 tokens 32.0 / 19.1).
  // The price of 2: an index of n / 2 centroids per head, whose scoring pass reads a quarter of the K/V
  // bytes (bf16) each step, and the CPU's decode roughly halves in speed against 4 (docs/accuracy.md).
  constexpr int kPaperHeadDim = 128;
  return head_dim >= kPaperHeadDim ? 16 : 2;
}

void validate(const AttentionConfig& c) {
  RETROINFER_CHECK(std::isfinite(c.scale) && c.scale >= 0.0f, "attention config: scale must be >= 0, got ",
                   c.scale);
  RETROINFER_CHECK(c.sink_tokens >= 0, "attention config: sink_tokens must be >= 0, got ", c.sink_tokens);
  RETROINFER_CHECK(c.window_tokens >= 0, "attention config: window_tokens must be >= 0, got ", c.window_tokens);
  RETROINFER_CHECK(c.tokens_per_cluster >= 1, "attention config: tokens_per_cluster must be >= 1, got ",
                   c.tokens_per_cluster);
  RETROINFER_CHECK(c.segment_tokens >= c.tokens_per_cluster,
                   "attention config: segment_tokens must be >= tokens_per_cluster, got ", c.segment_tokens);
  RETROINFER_CHECK(c.kmeans_segment_iters >= 0 && c.kmeans_global_iters >= 0,
                   "attention config: k-means iteration counts must be >= 0");
  RETROINFER_CHECK(c.retrieval_fraction >= 0.0 && c.retrieval_fraction <= 1.0,
                   "attention config: retrieval_fraction must be in [0, 1], got ", c.retrieval_fraction);
  RETROINFER_CHECK(c.estimation_fraction >= 0.0 && c.estimation_fraction <= 1.0,
                   "attention config: estimation_fraction must be in [0, 1], got ", c.estimation_fraction);
  RETROINFER_CHECK(c.retrieval_fraction + c.estimation_fraction <= 1.0 + 1e-9,
                   "attention config: retrieval_fraction + estimation_fraction must be <= 1, got ",
                   c.retrieval_fraction + c.estimation_fraction);
  RETROINFER_CHECK(c.outlier_fraction >= 0.0 && c.outlier_fraction <= 1.0,
                   "attention config: outlier_fraction must be in [0, 1], got ", c.outlier_fraction);
  RETROINFER_CHECK(c.update_tokens >= 1 && c.update_clusters >= 1 && c.update_clusters <= c.update_tokens,
                   "attention config: need 1 <= update_clusters <= update_tokens, got ", c.update_clusters, " and ",
                   c.update_tokens);
  RETROINFER_CHECK(c.quest_page_tokens >= 1, "attention config: quest_page_tokens must be >= 1, got ",
                   c.quest_page_tokens);
}

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

int64_t MethodBase::baseline_budget(int64_t indexed) const {
  if (cfg_.budget_tokens >= 0) return cfg_.budget_tokens;
  return static_cast<int64_t>(std::llround(cfg_.retrieval_fraction * static_cast<double>(indexed)));
}

}  // namespace attention
}  // namespace retroinfer
