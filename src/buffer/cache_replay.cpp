// Offline block-cache replay of a cluster trace (include/retroinfer/cache_replay.h), through the wave
// buffer's own LRU (PageLru) under the cache manager's admission rule.
#include "retroinfer/cache_replay.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "buffer/page_lru.h"
#include "retroinfer/error.h"

namespace retroinfer {

double CacheReplayCounts::share(uint64_t clusters) const {
  const uint64_t n = hit_clusters + miss_clusters;
  return n == 0 ? 0.0 : double(clusters) / double(n);
}

double CacheReplayCounts::token_hit_ratio() const {
  const uint64_t n = hit_tokens + miss_tokens;
  return n == 0 ? 0.0 : double(hit_tokens) / double(n);
}

CacheReplayCounts& CacheReplayCounts::operator+=(const CacheReplayCounts& o) {
  hit_clusters += o.hit_clusters;
  miss_clusters += o.miss_clusters;
  hit_tokens += o.hit_tokens;
  miss_tokens += o.miss_tokens;
  first_misses += o.first_misses;
  first_misses_near += o.first_misses_near;
  return *this;
}

namespace {

using HeadKey = std::tuple<int32_t, int32_t, int32_t>;  // (layer, seq, head)

// One flat head's records in step order, with the sizes of all its clusters gathered from the whole trace
// (a cluster is only selected once it exists, so knowing its size earlier changes nothing).
struct HeadTrace {
  std::vector<const ClusterTraceRecord*> steps;
  std::vector<int32_t> sizes;  // [most clusters seen]
  int64_t prompt_tokens = 0;   // tokens at the build: the cache's capacity is a fraction of these
};

std::map<HeadKey, HeadTrace> group_heads(const ClusterTrace& trace) {
  std::map<HeadKey, HeadTrace> heads;
  for (const ClusterTraceRecord& r : trace.records) heads[{r.layer, r.seq, r.head}].steps.push_back(&r);
  for (auto& [key, ht] : heads) {
    std::stable_sort(ht.steps.begin(), ht.steps.end(),
                     [](const ClusterTraceRecord* a, const ClusterTraceRecord* b) { return a->step < b->step; });
    int32_t most = 0;
    for (size_t i = 0; i < ht.steps.size(); ++i) {
      const ClusterTraceRecord& r = *ht.steps[i];
      RETROINFER_CHECK(i == 0 || r.step > ht.steps[i - 1]->step, "cluster trace: layer ", r.layer, " sequence ", r.seq,
                       " head ", r.head, " has two records of step ", r.step,
                       " (appended traces of several prompts must use distinct sequence numbers)");
      most = std::max(most, r.num_clusters);
    }
    ht.sizes.assign(size_t(most), -1);
    for (const ClusterTraceRecord* r : ht.steps)
      for (size_t j = 0; j < r->ids.size(); ++j) {
        int32_t& s = ht.sizes[size_t(r->ids[j])];
        RETROINFER_CHECK(s < 0 || s == r->sizes[j], "cluster trace: layer ", r->layer, " sequence ", r->seq, " head ",
                         r->head, " names cluster ", r->ids[j], " with sizes ", s, " and ", r->sizes[j],
                         " (a cluster's size never changes)");
        s = r->sizes[j];
      }
    for (int32_t& s : ht.sizes) s = std::max(s, 0);  // never selected: never resident
    const ClusterTraceRecord& first = *ht.steps.front();
    ht.prompt_tokens = std::max<int64_t>(first.context_tokens - first.step - 1, 0);
  }
  return heads;
}

}  // namespace

std::vector<CacheReplayResult> replay_cluster_trace(const ClusterTrace& trace, const CacheReplayOptions& opt) {
  RETROINFER_CHECK(opt.page_tokens >= 1, "cache replay: page_tokens must be >= 1, got ", opt.page_tokens);
  RETROINFER_CHECK(opt.window_steps >= 1, "cache replay: window_steps must be >= 1, got ", opt.window_steps);
  RETROINFER_CHECK(!opt.cache_fractions.empty(), "cache replay: give at least one cache fraction");
  for (double f : opt.cache_fractions)
    RETROINFER_CHECK(f > 0.0 && f <= 1.0, "cache replay: cache fraction ", f, " outside (0, 1]");
  const std::map<HeadKey, HeadTrace> heads = group_heads(trace);
  int32_t last_step = 0;
  for (const ClusterTraceRecord& r : trace.records) last_step = std::max(last_step, r.step);
  const size_t windows = trace.records.empty() ? 0 : size_t(last_step / opt.window_steps) + 1;

  std::vector<CacheReplayResult> out;
  for (double f : opt.cache_fractions) {
    CacheReplayResult res;
    res.cache_fraction = f;
    res.per_layer.assign(size_t(std::max(trace.header.num_layers, 0)), {});
    res.per_window.assign(windows, {});
    bool first_head = true;
    std::vector<int32_t> misses;
    for (const auto& [key, ht] : heads) {
      // As WaveBufferLayer sizes its cache from cache_fraction (allocate_cache_and_rows).
      const int64_t cap = (static_cast<int64_t>(std::ceil(f * double(ht.prompt_tokens))) + opt.page_tokens - 1) /
                          opt.page_tokens;
      res.capacity_pages_min = first_head ? cap : std::min(res.capacity_pages_min, cap);
      res.capacity_pages_max = first_head ? cap : std::max(res.capacity_pages_max, cap);
      first_head = false;
      buffer::PageLru lru(ht.sizes, opt.page_tokens, cap);
      CacheReplayCounts& layer = res.per_layer[size_t(std::get<0>(key))];
      std::vector<int32_t> last_selected(ht.sizes.size(), -1);  // step of each cluster's latest selection
      const auto near_recent = [&](int32_t id, int32_t step) {
        for (int32_t n = std::max(id - kNearIds, 0); n <= std::min<int32_t>(id + kNearIds, int32_t(ht.sizes.size()) - 1);
             ++n)
          if (n != id && last_selected[size_t(n)] >= std::max(step - kNearSteps, 0)) return true;
        return false;
      };
      for (const ClusterTraceRecord* r : ht.steps) {
        CacheReplayCounts c;
        misses.clear();
        for (size_t j = 0; j < r->ids.size(); ++j) {
          const int32_t id = r->ids[j];
          if (lru.touch(id, r->step)) {
            ++c.hit_clusters;
            c.hit_tokens += uint64_t(r->sizes[j]);
          } else {
            ++c.miss_clusters;
            c.miss_tokens += uint64_t(r->sizes[j]);
            misses.push_back(id);
            if (last_selected[size_t(id)] < 0) {
              ++c.first_misses;
              if (near_recent(id, r->step)) ++c.first_misses_near;
            }
          }
        }
        for (int32_t id : r->ids) last_selected[size_t(id)] = r->step;
        for (int32_t id : misses) lru.admit(id, r->step);  // ids ascend: the manager's admission order
        layer += c;
        res.per_window[size_t(r->step / opt.window_steps)] += c;
        res.total += c;
      }
    }
    out.push_back(std::move(res));
  }
  return out;
}

}  // namespace retroinfer
