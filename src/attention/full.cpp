// full: exact decode attention over every cached token (the reference every other method is judged by).
#include "attention/exact.h"
#include "attention/methods.h"

namespace retroinfer::attention {
namespace {

class FullAttention final : public MethodBase {
 public:
  using MethodBase::MethodBase;
  void on_prefill(const KvCache& kv) override { check_kv(kv); }
  AttentionStats decode(const KvCache& kv, const float* q, float* out) override {
    check_kv(kv);
    const int g = group();
    const int d = shape_.head_dim;
    const float sc = effective_scale(cfg_.scale, d);
#pragma omp parallel for schedule(static)
    for (int h = 0; h < shape_.num_heads_kv; ++h) {
      GroupState gs(g, d);
      const size_t off = static_cast<size_t>(h) * g * d;
      accumulate_range(kv, h, q + off, sc, 0, kv.size(), gs);
      gs.finish(out + off);
    }
    AttentionStats s;
    s.context_tokens = kv.size() * shape_.num_heads_kv;
    s.exact_tokens = s.context_tokens;
    return s;
  }
};

}  // namespace

std::unique_ptr<AttentionMethod> make_full(const AttentionConfig& cfg, const AttentionShape& shape) {
  return std::make_unique<FullAttention>(cfg, shape);
}

}  // namespace retroinfer::attention
