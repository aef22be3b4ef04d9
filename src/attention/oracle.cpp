// oracle: the steady zone plus the exact top-k tokens of the non-steady region by true attention
// probability: the upper bound of any token-selection method at the same budget (it pays a full pass over
// the keys to choose, so it is a yardstick, not a method to deploy).
//
// GQA: one selection per KV head; a token's score is its summed softmax probability over the group's
// query heads, each head normalised over the whole cache (its true attention distribution).
// k = min(baseline_budget(indexed), indexed), indexed = max(0, size - sink - window).
#include <cmath>

#include "attention/selective.h"

namespace retroinfer::attention {
namespace {

class OracleAttention final : public SelectiveMethod {
 public:
  using SelectiveMethod::SelectiveMethod;
  void on_prefill(const KvCache& kv) override { check_kv(kv); }

 protected:
  void select(const KvCache& kv, int kvh, const float* q, float scale, TokenRanges& out) const override {
    const int64_t size = kv.size();
    const SteadySplit sp = steady_split(size, cfg_);
    out.add(0, sp.sink_end);
    out.add(sp.recent_begin, size);
    const int64_t k = std::min(baseline_budget(cfg_, sp.indexed()), sp.indexed());
    if (k <= 0) return;
    if (k == sp.indexed()) {
      out.add(sp.sink_end, sp.recent_begin);
      return;
    }
    const int g = group();
    const int d = shape_.head_dim;
    // logits[j, t] for query head j of the group over every cached token.
    std::vector<float> logits(static_cast<size_t>(g) * size);  // [group, size]
    std::vector<float> score(static_cast<size_t>(sp.indexed()), 0.0f);  // [indexed]
    for (int j = 0; j < g; ++j) {
      float* lj = &logits[static_cast<size_t>(j) * size];
      float m = -INFINITY;
      for (int64_t t = 0; t < size; ++t) {
        lj[t] = kv.dot_key(kvh, t, q + static_cast<size_t>(j) * d) * scale;
        m = std::max(m, lj[t]);
      }
      double l = 0.0;
      for (int64_t t = 0; t < size; ++t) l += std::exp(static_cast<double>(lj[t] - m));
      const float lse = m + static_cast<float>(std::log(l));
      for (int64_t t = sp.sink_end; t < sp.recent_begin; ++t) score[t - sp.sink_end] += std::exp(lj[t] - lse);
    }
    // Coalesce the chosen tokens into ranges.
    const std::vector<int64_t> top = top_k_indices(score, k);
    int64_t b = -1;
    int64_t e = -1;
    for (int64_t i : top) {
      const int64_t t = sp.sink_end + i;
      if (t == e) {
        ++e;
      } else {
        out.add(b, e);
        b = t;
        e = t + 1;
      }
    }
    out.add(b, e);
  }
};

}  // namespace

std::unique_ptr<AttentionMethod> make_oracle(const AttentionConfig& cfg, const AttentionShape& shape) {
  return std::make_unique<OracleAttention>(cfg, shape);
}

}  // namespace retroinfer::attention
