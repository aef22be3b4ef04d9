// streaming (StreamingLLM-style): attend exactly to the attention sinks and a recent window only.
//
// For a comparison at an equal exact-token budget the recent window is extended by the baseline budget:
// with indexed = max(0, size - sink - window) tokens outside the steady zone, the method reads the first
// `sink` tokens and the last window + baseline_budget(indexed) tokens (clamped to the cache).
#include "attention/selective.h"

namespace retroinfer::attention {
namespace {

class StreamingAttention final : public SelectiveMethod {
 public:
  using SelectiveMethod::SelectiveMethod;
  void on_prefill(const KvCache& kv) override { check_kv(kv); }

 protected:
  void select(const KvCache& kv, int kvh, const float* q, float scale, TokenRanges& out) const override {
    (void)kvh;
    (void)q;
    (void)scale;
    const SteadySplit sp = steady_split(kv.size(), cfg_);
    const int64_t extra = std::min(baseline_budget(cfg_, sp.indexed()), sp.indexed());
    out.add(0, sp.sink_end);
    out.add(sp.recent_begin - extra, kv.size());
  }
};

}  // namespace

std::unique_ptr<AttentionMethod> make_streaming(const AttentionConfig& cfg, const AttentionShape& shape) {
  return std::make_unique<StreamingAttention>(cfg, shape);
}

}  // namespace retroinfer::attention
