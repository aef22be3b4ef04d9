// full: exact decode attention over every cached token (the reference every other method is judged by).
#include <algorithm>
#include <vector>

#include "attention/exact.h"
#include "attention/methods.h"

namespace retroinfer::attention {
namespace {

// Decode splits a KV head's tokens into chunks of at least this many (at most kMaxChunks): below it a task's
// work does not repay its share of the parallel region and the merge.
constexpr int64_t kChunkMinTokens = 256;
constexpr int64_t kMaxChunks = 16;
// Token-heads below which decode attention stays on the calling thread: 2048 of them are tens of
// microseconds of work, about what waking the pool's threads costs on a busy 2-core host.
constexpr int64_t kParallelMinTokens = 2048;

class FullAttention final : public MethodBase {
 public:
  using MethodBase::MethodBase;
  void on_prefill(const KvCache& kv) override { check_kv(kv); }
  AttentionStats decode(const KvCache& kv, const float* q, float* out) override {
    check_kv(kv);
    const int g = group();
    const int d = shape_.head_dim;
    const float sc = effective_scale(cfg_.scale, d);
    // Work items of (KV head, token chunk), so that every thread has work when the KV heads are fewer than
    // the threads (SmolLM2 has 3, Qwen2.5-Coder-0.5B 2); each chunk's softmax state is merged into its head's
    // (log-sum-exp merge) in chunk order. The chunks depend on the context only, not on the thread count: the
    // same output with any.
    const int nh = shape_.num_heads_kv;
    const int64_t size = kv.size();
    const int64_t chunks = std::clamp<int64_t>(size / kChunkMinTokens, 1, kMaxChunks);
    const int64_t per = (size + chunks - 1) / chunks;
    std::vector<GroupState> parts(static_cast<size_t>(nh * chunks), GroupState(g, d));
#pragma omp parallel for schedule(dynamic, 1) if (nh * chunks > 1 && size * nh >= kParallelMinTokens)
    for (int64_t w = 0; w < nh * chunks; ++w) {
      const int h = static_cast<int>(w / chunks);
      const int64_t c = w % chunks;
      const int64_t begin = std::min(size, c * per), end = std::min(size, (c + 1) * per);
      accumulate_range(kv, h, q + static_cast<size_t>(h) * g * d, sc, begin, end, parts[w]);
    }
    for (int h = 0; h < nh; ++h) {
      GroupState& gs = parts[static_cast<size_t>(h * chunks)];
      for (int64_t c = 1; c < chunks; ++c) gs.merge(parts[static_cast<size_t>(h * chunks + c)]);
      gs.finish(out + static_cast<size_t>(h) * g * d);
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
