// Common frame of the baselines (streaming, quest, oracle): per KV head, a method picks a set of token
// ranges to read exactly (steady zone + its selection); attention is exact over those ranges and nothing
// else. The frame runs the selection and the exact attention per KV head (OpenMP over KV heads), fills
// AttentionStats and records the last selection for the last_zones() evaluation hook.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "attention/exact.h"
#include "attention/methods.h"
#include "retroinfer/error.h"
#include "retroinfer/wave_counts.h"  // steady_split, baseline_budget

namespace retroinfer::attention {

// Disjoint half-open token ranges [begin, end) of one KV head, in any order.
struct TokenRanges {
  std::vector<std::pair<int64_t, int64_t>> r;
  void clear() { r.clear(); }
  void add(int64_t begin, int64_t end) {
    if (end > begin) r.emplace_back(begin, end);
  }
  int64_t count() const {
    int64_t n = 0;
    for (const auto& [b, e] : r) n += e - b;
    return n;
  }
};

// Indices (ascending) of the k largest scores; ties go to the lower index so the choice is deterministic.
inline std::vector<int64_t> top_k_indices(const std::vector<float>& score, int64_t k) {
  const int64_t n = static_cast<int64_t>(score.size());
  k = std::clamp<int64_t>(k, 0, n);
  std::vector<int64_t> idx(n);
  for (int64_t i = 0; i < n; ++i) idx[i] = i;
  auto better = [&](int64_t a, int64_t b) { return score[a] > score[b] || (score[a] == score[b] && a < b); };
  if (k < n) std::nth_element(idx.begin(), idx.begin() + k, idx.end(), better);
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

// quest's page score for the group's query heads q ([group, head_dim] f32): the largest over the group of
// the upper bound sum_i max(q_i min_i, q_i max_i) of q . k over every key k with page_min <= k <= page_max
// (element-wise), times the logit scale. page_min, page_max: [head_dim] f32.
inline float quest_page_bound(const float* q, int group, int head_dim, const float* page_min, const float* page_max,
                              float scale) {
  float score = -INFINITY;
  for (int j = 0; j < group; ++j) {
    const float* qj = q + static_cast<size_t>(j) * head_dim;
    float bound = 0.0f;
    for (int i = 0; i < head_dim; ++i) bound += qj[i] >= 0.0f ? qj[i] * page_max[i] : qj[i] * page_min[i];
    score = std::max(score, bound * scale);
  }
  return score;
}

class SelectiveMethod : public MethodBase {
 public:
  using MethodBase::MethodBase;

  AttentionStats decode(const KvCache& kv, const float* q, float* out) final {
    check_kv(kv);
    RETROINFER_CHECK(q != nullptr && out != nullptr, attention_kind_name(cfg_.kind),
                     ": decode needs non-null q and out");
    prepare(kv);
    const int g = group();
    const int d = shape_.head_dim;
    const float sc = effective_scale(cfg_.scale, d);
    last_.resize(shape_.num_heads_kv);
    last_size_ = -1;
    // select() and the accumulation do not throw (inputs are validated above), as an OpenMP region needs.
#pragma omp parallel for schedule(static)
    for (int h = 0; h < shape_.num_heads_kv; ++h) {
      const size_t off = static_cast<size_t>(h) * g * d;
      TokenRanges& ranges = last_[h];
      ranges.clear();
      select(kv, h, q + off, sc, ranges);
      GroupState gs(g, d);
      for (const auto& [b, e] : ranges.r) accumulate_range(kv, h, q + off, sc, b, e, gs);
      gs.finish(out + off);
    }
    last_size_ = kv.size();
    AttentionStats s;
    s.context_tokens = kv.size() * shape_.num_heads_kv;
    for (const auto& r : last_) s.exact_tokens += r.count();
    return s;
  }

  bool last_zones(int kvh, std::vector<uint8_t>& zones) const override {
    if (last_size_ < 0 || kvh < 0 || kvh >= static_cast<int>(last_.size())) return false;
    zones.assign(static_cast<size_t>(last_size_), kZoneIgnored);
    for (const auto& [b, e] : last_[kvh].r) std::fill(zones.begin() + b, zones.begin() + e, kZoneExact);
    return true;
  }

 protected:
  // Serial per-call preparation before the per-head selections (quest builds new pages here).
  virtual void prepare(const KvCache& kv) { (void)kv; }
  // Appends the disjoint ranges KV head kvh reads exactly (steady zone included) for the group's queries
  // q: [group, head_dim] f32 (logit scale `scale`). Runs concurrently for different kvh; must not throw.
  virtual void select(const KvCache& kv, int kvh, const float* q, float scale, TokenRanges& out) const = 0;

 private:
  std::vector<TokenRanges> last_;  // [num_heads_kv]: the ranges of the last decode() call
  int64_t last_size_ = -1;         // cache size at the last decode(); -1 before the first
};

}  // namespace retroinfer::attention
