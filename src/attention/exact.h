// Exact attention building blocks shared by every CPU method: accumulate the softmax state of the query
// heads of one GQA group over a list or a range of tokens of one KV head.
#pragma once

#include <cstdint>
#include <vector>

#include "retroinfer/kv_cache.h"
#include "retroinfer/softmax_state.h"

namespace retroinfer::attention {

// The states of the `group` query heads that share one KV head.
struct GroupState {
  int group = 0;
  int head_dim = 0;
  std::vector<SoftmaxScalars> st;  // [group]
  std::vector<float> o;            // [group, head_dim], un-normalised
  GroupState(int g, int d) : group(g), head_dim(d), st(g), o(static_cast<size_t>(g) * d, 0.0f) {}
  void merge(const GroupState& b) {
    for (int g = 0; g < group; ++g)
      softmax_merge(st[g], &o[static_cast<size_t>(g) * head_dim], b.st[g],
                    &b.o[static_cast<size_t>(g) * head_dim], head_dim);
  }
  // out: [group, head_dim] normalised.
  void finish(float* out) const {
    for (int g = 0; g < group; ++g)
      softmax_finish(st[g], &o[static_cast<size_t>(g) * head_dim], out + static_cast<size_t>(g) * head_dim,
                     head_dim);
  }
};

// q: [group, head_dim] f32 (the query heads of KV head kvh). Adds tokens [begin, end) of kvh.
void accumulate_range(const KvCache& kv, int kvh, const float* q, float scale, int64_t begin, int64_t end,
                      GroupState& gs);
// Adds the listed tokens of kvh (any order; each must be < kv.size()).
void accumulate_tokens(const KvCache& kv, int kvh, const float* q, float scale, const int64_t* tokens,
                       int64_t n, GroupState& gs);

// Adds the estimated clusters ids[0..n) of one KV head: cluster j counts as sizes[j] tokens of logit
// logits[g * num_clusters + j] (query head g) and value value_sums[j] / sizes[j] (the estimation zone; the same
// sum as softmax_push of each, with one rescale per query head). logits: [group, num_clusters];
// value_sums: [num_clusters, head_dim].
void accumulate_estimates(const float* logits, int64_t num_clusters, const int32_t* ids, int n, const int32_t* sizes,
                          const float* value_sums, GroupState& gs);

// Scale actually used: cfg scale, or 1/sqrt(head_dim) when it is 0.
float effective_scale(float scale, int head_dim);

}  // namespace retroinfer::attention
