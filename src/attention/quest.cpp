// quest (Tang et al., "Quest: Query-Aware Sparsity for Efficient Long-Context LLM Inference", 2024):
// pages of quest_page_tokens keys over the non-steady region with per-channel min and max keys; a page's
// upper bound on q·k is Σ_i max(q_i min_i, q_i max_i); the top pages are attended exactly.
//
// Layout: page p of KV head h covers tokens [sink + p*P, sink + (p+1)*P) (P = quest_page_tokens). Only
// full pages that end at or before size - window are indexed; they are built in on_prefill and, during
// decode, incrementally as the window slides past new full pages. The tokens of the non-steady region not
// yet in a full page (< P of them) are attended exactly like the steady zone.
//
// Budget: indexed = max(0, size - sink - window), budget = baseline_budget(indexed); the method reads
// quest_budget_pages(budget, P) = floor(budget / P) pages (at least one when budget > 0, at most all built
// pages; retroinfer/wave_counts.h).
//
// GQA: one selection per KV head; a page's group score is the MAX of its bound over the group's query
// heads (a page that may matter to any head of the group is kept; a sum would let one head's large
// logits drown the others, and Quest's bound is per head to begin with). The bound uses the logit scale.
//
// Instance contract: one instance follows one cache (pages are built once and kept); if the cache is seen
// to shrink (cleared and refilled), the pages are rebuilt from scratch.
#include <cmath>

#include "attention/selective.h"

namespace retroinfer::attention {
namespace {

class QuestAttention final : public SelectiveMethod {
 public:
  QuestAttention(const AttentionConfig& cfg, const AttentionShape& shape)
      : SelectiveMethod(cfg, shape), min_(shape.num_heads_kv), max_(shape.num_heads_kv) {}

  void on_prefill(const KvCache& kv) override {
    check_kv(kv);
    build_pages(kv);
  }

 protected:
  void prepare(const KvCache& kv) override { build_pages(kv); }

  void select(const KvCache& kv, int kvh, const float* q, float scale, TokenRanges& out) const override {
    const int64_t size = kv.size();
    const int64_t p_tok = cfg_.quest_page_tokens;
    const SteadySplit sp = steady_split(size, cfg_);
    const int64_t paged_end = sp.sink_end + num_pages_ * p_tok;  // == sink_tokens + pages * P
    out.add(0, sp.sink_end);
    out.add(paged_end, size);  // partial page + recent window
    const int64_t budget = baseline_budget(cfg_, sp.indexed());
    const int64_t k = std::min(quest_budget_pages(budget, cfg_.quest_page_tokens), num_pages_);
    if (k <= 0) return;
    if (k == num_pages_) {
      out.add(sp.sink_end, paged_end);
      return;
    }
    const int g = group();
    const int d = shape_.head_dim;
    const float* mn = min_[kvh].data();
    const float* mx = max_[kvh].data();
    std::vector<float> score(static_cast<size_t>(num_pages_));  // [num_pages]
    for (int64_t p = 0; p < num_pages_; ++p) score[p] = quest_page_bound(q, g, d, mn + p * d, mx + p * d, scale);
    for (int64_t p : top_k_indices(score, k)) {
      const int64_t b = sp.sink_end + p * p_tok;
      out.add(b, b + p_tok);
    }
  }

 private:
  // Extends the page summaries to every full page of [sink, size - window).
  void build_pages(const KvCache& kv) {
    const int64_t p_tok = cfg_.quest_page_tokens;
    const int d = shape_.head_dim;
    const SteadySplit sp = steady_split(kv.size(), cfg_);
    // Pages start at token sink_tokens; a cache shorter than the sinks has no region yet.
    const int64_t full = sp.sink_end == cfg_.sink_tokens ? sp.indexed() / p_tok : 0;
    if (full < num_pages_) {  // the cache shrank: start over
      num_pages_ = 0;
      for (int h = 0; h < shape_.num_heads_kv; ++h) {
        min_[h].clear();
        max_[h].clear();
      }
    }
    if (full == num_pages_) return;
    const int64_t first = num_pages_;
#pragma omp parallel for schedule(static)
    for (int h = 0; h < shape_.num_heads_kv; ++h) {
      min_[h].resize(static_cast<size_t>(full) * d);
      max_[h].resize(static_cast<size_t>(full) * d);
      std::vector<float> key(d);
      for (int64_t p = first; p < full; ++p) {
        float* pmn = &min_[h][static_cast<size_t>(p) * d];
        float* pmx = &max_[h][static_cast<size_t>(p) * d];
        std::fill(pmn, pmn + d, INFINITY);
        std::fill(pmx, pmx + d, -INFINITY);
        for (int64_t t = sp.sink_end + p * p_tok; t < sp.sink_end + (p + 1) * p_tok; ++t) {
          kv.load_key(h, t, key.data());
          for (int i = 0; i < d; ++i) {
            pmn[i] = std::min(pmn[i], key[i]);
            pmx[i] = std::max(pmx[i], key[i]);
          }
        }
      }
    }
    num_pages_ = full;
  }

  int64_t num_pages_ = 0;              // full pages built, the same for every KV head
  std::vector<std::vector<float>> min_;  // [num_heads_kv][num_pages, head_dim] f32: per-channel min key
  std::vector<std::vector<float>> max_;  // [num_heads_kv][num_pages, head_dim] f32: per-channel max key
};

}  // namespace

std::unique_ptr<AttentionMethod> make_quest(const AttentionConfig& cfg, const AttentionShape& shape) {
  return std::make_unique<QuestAttention>(cfg, shape);
}

}  // namespace retroinfer::attention
