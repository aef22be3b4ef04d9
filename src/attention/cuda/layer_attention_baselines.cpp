// The baselines behind the runner's seam (layer_attention.h): streaming, oracle and quest on the GPU, each
// the CPU method of src/attention/ (streaming.cpp, oracle.cpp, quest.cpp with selective.h's frame) as
// tokens are appended. Exact attention is the backend's sparse decode kernel over a token list.
#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/cuda_check.h"
#include "attention/cuda/layer_attention.h"
#include "attention/cuda/layer_common.h"
#include "retroinfer/error.h"

namespace retroinfer::cuda {
namespace detail {

namespace {

void ensure(DeviceBuffer& buf, size_t bytes) {
  if (buf.bytes() < bytes) buf = DeviceBuffer(std::max<size_t>(bytes, 16));
}

// What every baseline shares: shapes, the runner's K/V, the token lists and the sparse exact attention.
class Baseline : public LayerAttention {
 public:
  Baseline(const AttentionShape& shape, const AttentionConfig& cfg, int num_seqs, int64_t max_tokens, const char* who)
      : shape_(shape), cfg_(cfg), who_(who), max_tokens_(max_tokens) {
    validate_layer_shape(shape, num_seqs, who);
    validate(cfg);
    RETROINFER_CHECK(max_tokens >= 1, who, ": max_tokens must be >= 1, got ", max_tokens);
    H_ = num_seqs * shape.num_heads_kv;
    G_ = shape.num_heads_q / shape.num_heads_kv;
    D_ = shape.head_dim;
    scale_ = effective_scale(cfg.scale, shape.head_dim);
    const int splits = decode_splits(max_tokens, H_, 1);
    part_ml_ = DeviceBuffer(size_t(H_) * splits * G_ * 8);
    part_o_ = DeviceBuffer(size_t(H_) * splits * G_ * D_ * 4);
    shared_list_ = DeviceBuffer(size_t(max_tokens) * 4);
    count_ = DeviceBuffer(size_t(H_) * 4);
  }

  void prefill_done(const uint16_t* k, const uint16_t* v, int64_t num_tokens, int64_t kv_stride, Stream s) override {
    validate_kv(k, v, num_tokens, kv_stride, who_);
    RETROINFER_CHECK(num_tokens <= max_tokens_ && kv_stride >= max_tokens_, who_, ": ", num_tokens,
                     " tokens in K/V rows of stride ", kv_stride, " for max_tokens ", max_tokens_,
                     " (need num_tokens <= max_tokens <= kv_stride)");
    k_ = k;
    v_ = v;
    n_ = num_tokens;
    kv_stride_ = kv_stride;
    on_prefill(static_cast<cudaStream_t>(s));
  }

  void decode(const float* q, const uint16_t* k_new, const uint16_t* v_new, int64_t num_tokens, float* out,
              Stream s) override {
    (void)k_new;  // GPU tier: the runner wrote the token into its K/V
    (void)v_new;
    RETROINFER_CHECK(k_ != nullptr, who_, "::decode: prefill_done() was not called");
    RETROINFER_CHECK(q != nullptr && out != nullptr, who_, "::decode: null q or out");
    RETROINFER_CHECK(num_tokens >= n_ && num_tokens <= max_tokens_, who_, "::decode: ", num_tokens,
                     " tokens after ", n_, " (tokens only grow, up to max_tokens ", max_tokens_, ")");
    n_ = num_tokens;
    stats_ = AttentionStats{};
    stats_.context_tokens = n_ * H_;
    step(q, out, static_cast<cudaStream_t>(s));
  }

  AttentionStats last_stats() const override { return stats_; }
  int64_t host_bytes() const override { return 0; }
  int64_t device_bytes() const override {
    return static_cast<int64_t>(part_ml_.bytes() + part_o_.bytes() + shared_list_.bytes() + count_.bytes()) +
           own_bytes();
  }

 protected:
  virtual void on_prefill(cudaStream_t st) { (void)st; }
  virtual void step(const float* q, float* out, cudaStream_t st) = 0;
  virtual int64_t own_bytes() const { return 0; }

  // One list for every head: [0, a_end) then [b_begin, n_), then exact attention over it.
  void attend_ranges(const float* q, float* out, int64_t a_end, int64_t b_begin, cudaStream_t st) {
    RangeListParams rp;
    rp.num_heads = H_;
    rp.a_end = a_end;
    rp.b_begin = b_begin;
    rp.b_end = n_;
    rp.list = shared_list_.as<int>();
    rp.count = count_.as<int>();
    launch_check(range_list(rp, st), "range_list", st);
    const int64_t count = a_end + (n_ - b_begin);
    stats_.exact_tokens = count * H_;
    attend_list(q, out, shared_list_.as<int>(), count_.as<int>(), 0, count, st);
  }

  // Sparse exact attention over list[h, 0 .. count[h]) (list_stride 0: one shared list) of at most
  // `capacity` tokens, merged into out.
  void attend_list(const float* q, float* out, const int* list, const int* count, int64_t list_stride,
                   int64_t capacity, cudaStream_t st) {
    const int splits = decode_splits(std::max<int64_t>(capacity, 1), H_, 1);
    DecodeParams dp;
    dp.q = q;
    dp.k = k_;
    dp.v = v_;
    dp.kv_stride = kv_stride_;
    dp.token_list = list;
    dp.token_count = count;
    dp.list_stride = list_stride;
    dp.num_heads = H_;
    dp.group = G_;
    dp.head_dim = D_;
    dp.scale = scale_;
    dp.num_splits = splits;
    dp.split_tokens = split_tokens(std::max<int64_t>(capacity, 1), splits);
    dp.part_ml = part_ml_.as<float2>();
    dp.part_o = part_o_.as<float>();
    dp.total_splits = splits;
    dp.split_offset = 0;
    launch_check(decode_attention(dp, st), who_, st);
    CombineParams c;
    c.part_ml = dp.part_ml;
    c.part_o = dp.part_o;
    c.num_heads = H_;
    c.group = G_;
    c.head_dim = D_;
    c.total_splits = splits;
    c.out = out;
    launch_check(combine_states(c, st), who_, st);
  }

  AttentionShape shape_;
  AttentionConfig cfg_;
  const char* who_;
  int64_t max_tokens_ = 0;
  int H_ = 0, G_ = 0, D_ = 0;
  float scale_ = 0.0f;
  const uint16_t* k_ = nullptr;
  const uint16_t* v_ = nullptr;
  int64_t n_ = 0, kv_stride_ = 0;
  AttentionStats stats_;
  DeviceBuffer part_ml_, part_o_;  // [H, splits(max_tokens), G] / [.., D]: split partial states
  DeviceBuffer shared_list_;       // [max_tokens]: the one token list of attend_ranges
  DeviceBuffer count_;             // [H]
};

// streaming (attention/streaming.cpp): the sinks and the last window + budget tokens.
class StreamingLayerAttention final : public Baseline {
 public:
  StreamingLayerAttention(const AttentionShape& shape, const AttentionConfig& cfg, int num_seqs, int64_t max_tokens)
      : Baseline(shape, cfg, num_seqs, max_tokens, "StreamingLayerAttention") {}

 private:
  void step(const float* q, float* out, cudaStream_t st) override {
    const SteadySplit sp = steady_split(n_, cfg_);
    const int64_t extra = std::min(baseline_budget(cfg_, sp.indexed()), sp.indexed());
    attend_ranges(q, out, sp.sink_end, sp.recent_begin - extra, st);
  }
};

// oracle (attention/oracle.cpp): the steady zone plus the top-k non-steady tokens by their summed (over
// the GQA group) true attention probability, each query head normalised over the whole cache.
class OracleLayerAttention final : public Baseline {
 public:
  OracleLayerAttention(const AttentionShape& shape, const AttentionConfig& cfg, int num_seqs, int64_t max_tokens)
      : Baseline(shape, cfg, num_seqs, max_tokens, "OracleLayerAttention") {
    const size_t Hs = H_;
    logits_ = DeviceBuffer(Hs * G_ * max_tokens * 4);
    partial_ = DeviceBuffer(Hs * G_ * oracle_blocks(max_tokens) * 8);
    scores_ = DeviceBuffer(Hs * max_tokens * 4);
    list_ = DeviceBuffer(Hs * max_tokens * 4);
    list_count_ = DeviceBuffer(Hs * 4);
    // Selection buffers for the largest k (the budget grows with the cache): no allocation while decoding.
    const SteadySplit sp = steady_split(max_tokens, cfg);
    const int64_t k_max = std::max<int64_t>(1, std::min(baseline_budget(cfg, sp.indexed()), sp.indexed()));
    ids_ = DeviceBuffer(Hs * k_max * 4);
    scan_ = DeviceBuffer(Hs * (k_max + 1) * 4);
  }

 private:
  void step(const float* q, float* out, cudaStream_t st) override {
    const SteadySplit sp = steady_split(n_, cfg_);
    const int64_t k = std::min(baseline_budget(cfg_, sp.indexed()), sp.indexed());
    if (k <= 0) return attend_ranges(q, out, sp.sink_end, sp.recent_begin, st);
    if (k == sp.indexed()) return attend_ranges(q, out, n_, n_, st);  // everything
    const size_t Hs = H_;
    ensure(ids_, Hs * k * 4);
    ensure(scan_, Hs * (k + 1) * 4);
    OracleParams op;
    op.q = q;
    op.k = k_;
    op.kv_stride = kv_stride_;
    op.num_tokens = n_;
    op.idx_begin = sp.sink_end;
    op.n_idx = sp.indexed();
    op.num_heads = H_;
    op.group = G_;
    op.head_dim = D_;
    op.scale = scale_;
    op.logits = logits_.as<float>();
    op.partial = partial_.as<float2>();
    op.scores = scores_.as<float>();
    launch_check(oracle_scores(op, st), "oracle_scores", st);
    // Tokens as items of one token each; ties to the lower token (attention/selective.h top_k_indices).
    SelectParams se;
    se.scores = op.scores;
    se.num_heads = H_;
    se.group = 0;
    se.num_items = static_cast<int>(sp.indexed());
    se.k_retrieval = static_cast<int>(k);
    se.k_estimation = 0;
    se.retrieval_ids = ids_.as<int>();
    se.page_tokens = 1;
    se.n_idx = sp.indexed();
    se.idx_begin = sp.sink_end;
    se.num_tokens = n_;
    se.token_list = list_.as<int>();
    se.token_count = list_count_.as<int>();
    se.scan_scratch = scan_.as<int>();
    const int64_t cap = n_ - sp.indexed() + k;  // steady + k: exact (every score is finite)
    se.list_stride = cap;
    launch_check(select_and_expand(se, st), "select_and_expand(oracle)", st);
    stats_.exact_tokens = cap * H_;
    attend_list(q, out, list_.as<int>(), list_count_.as<int>(), cap, cap, st);
  }
  int64_t own_bytes() const override {
    return static_cast<int64_t>(logits_.bytes() + partial_.bytes() + scores_.bytes() + list_.bytes() +
                                list_count_.bytes() + ids_.bytes() + scan_.bytes());
  }

  DeviceBuffer logits_;   // [H, G, max_tokens] f32
  DeviceBuffer partial_;  // [H, G, oracle_blocks(max_tokens)] (max, sum)
  DeviceBuffer scores_;   // [H, max_tokens] f32
  DeviceBuffer list_;     // [H, steady + k] token lists
  DeviceBuffer list_count_, ids_, scan_;
};

// quest (attention/quest.cpp): full pages of quest_page_tokens over [sink, size - window), built at
// prefill and as the window slides past new full pages; floor(budget / page) pages (at least one when
// budget > 0) by the group's max page bound; the partial page and the window are steady.
// Page bounds live in two buffers of the same capacity: a new page is computed alone and the bounds are
// re-laid to the new page count (the score kernel's stride) by one strided copy, no synchronisation.
class QuestLayerAttention final : public Baseline {
 public:
  QuestLayerAttention(const AttentionShape& shape, const AttentionConfig& cfg, int num_seqs, int64_t max_tokens)
      : Baseline(shape, cfg, num_seqs, max_tokens, "QuestLayerAttention") {
    pt_ = cfg.quest_page_tokens;
    const SteadySplit sp = steady_split(max_tokens, cfg);
    p_max_ = sp.indexed() / pt_;
    const size_t Hs = H_, pages = std::max<int64_t>(p_max_, 1);
    for (auto* b : {&min_[0], &max_[0], &min_[1], &max_[1]}) *b = DeviceBuffer(Hs * pages * D_ * 2);
    scores_ = DeviceBuffer(Hs * pages * 4);
    // Exact tokens: sinks + partial page + window + the chosen pages.
    const int64_t k_max = std::max<int64_t>(1, std::min<int64_t>(pages_for(baseline_budget(cfg, sp.indexed())), p_max_));
    list_cap_ = int64_t{cfg.sink_tokens} + cfg.window_tokens + pt_ + k_max * pt_;
    list_ = DeviceBuffer(Hs * list_cap_ * 4);
    list_count_ = DeviceBuffer(Hs * 4);
    ids_ = DeviceBuffer(Hs * k_max * 4);
    scan_ = DeviceBuffer(Hs * (k_max + 1) * 4);
    new_min_ = DeviceBuffer(Hs * D_ * 2);  // one new page per step while decoding
    new_max_ = DeviceBuffer(Hs * D_ * 2);
  }

 private:
  int64_t pages_for(int64_t budget) const { return quest_budget_pages(budget, pt_); }
  void on_prefill(cudaStream_t st) override {
    pages_ = 0;
    grow_pages(st);
  }
  // Extends the page bounds to every full page of [sink, size - window).
  void grow_pages(cudaStream_t st) {
    const SteadySplit sp = steady_split(n_, cfg_);
    // Pages start at token sink_tokens; a cache shorter than the sinks has no region yet.
    const int64_t full = sp.sink_end == cfg_.sink_tokens ? sp.indexed() / pt_ : 0;
    if (full <= pages_) return;
    const int other = 1 - cur_;
    const size_t row = size_t(D_) * 2;
    QuestParams qp;
    qp.keys = k_;
    qp.kv_stride = kv_stride_;
    qp.idx_begin = cfg_.sink_tokens + pages_ * pt_;
    qp.n_idx = (full - pages_) * pt_;
    qp.num_heads = H_;
    qp.group = G_;
    qp.head_dim = D_;
    qp.page_tokens = pt_;
    qp.num_pages = static_cast<int>(full - pages_);
    if (pages_ == 0) {  // straight into the current buffers
      qp.page_min = min_[cur_].as<uint16_t>();
      qp.page_max = max_[cur_].as<uint16_t>();
      launch_check(quest_pages(qp, st), "quest_pages", st);
      pages_ = full;
      return;
    }
    // New pages into the tail of the other buffers' rows, old pages re-laid beside them, then swap.
    ensure(new_min_, size_t(H_) * qp.num_pages * row);
    ensure(new_max_, size_t(H_) * qp.num_pages * row);
    qp.page_min = new_min_.as<uint16_t>();
    qp.page_max = new_max_.as<uint16_t>();
    launch_check(quest_pages(qp, st), "quest_pages", st);
    const size_t old_w = size_t(pages_) * row, new_w = size_t(full - pages_) * row, pitch = size_t(full) * row;
    for (int j = 0; j < 2; ++j) {
      DeviceBuffer& dst = j == 0 ? min_[other] : max_[other];
      const DeviceBuffer& src = j == 0 ? min_[cur_] : max_[cur_];
      const DeviceBuffer& add = j == 0 ? new_min_ : new_max_;
      RETROINFER_CUDA_CHECK(cudaMemcpy2DAsync(dst.data(), pitch, src.data(), old_w, old_w, H_, cudaMemcpyDeviceToDevice, st));
      RETROINFER_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(dst.data()) + old_w, pitch, add.data(), new_w, new_w, H_,
                                              cudaMemcpyDeviceToDevice, st));
    }
    cur_ = other;
    pages_ = full;
  }

  void step(const float* q, float* out, cudaStream_t st) override {
    grow_pages(st);
    const SteadySplit sp = steady_split(n_, cfg_);
    const int64_t paged_end = sp.sink_end + pages_ * pt_;
    const int64_t k = std::min(pages_for(baseline_budget(cfg_, sp.indexed())), pages_);
    if (k <= 0) return attend_ranges(q, out, sp.sink_end, paged_end, st);
    if (k == pages_) return attend_ranges(q, out, n_, n_, st);  // every page: the whole cache
    QuestParams qp;
    qp.num_heads = H_;
    qp.group = G_;
    qp.head_dim = D_;
    qp.num_pages = static_cast<int>(pages_);
    qp.page_min = min_[cur_].as<uint16_t>();
    qp.page_max = max_[cur_].as<uint16_t>();
    qp.q = q;
    qp.scores = scores_.as<float>();
    launch_check(quest_score(qp, st), "quest_score", st);
    SelectParams se;
    se.scores = qp.scores;
    se.num_heads = H_;
    se.group = 0;
    se.num_items = static_cast<int>(pages_);
    se.k_retrieval = static_cast<int>(k);
    se.k_estimation = 0;
    se.retrieval_ids = ids_.as<int>();
    se.page_tokens = pt_;
    se.n_idx = pages_ * pt_;
    se.idx_begin = sp.sink_end;
    se.num_tokens = n_;
    se.token_list = list_.as<int>();
    se.token_count = list_count_.as<int>();
    se.scan_scratch = scan_.as<int>();
    se.list_stride = list_cap_;
    launch_check(select_and_expand(se, st), "select_and_expand(quest)", st);
    const int64_t exact = (n_ - pages_ * pt_) + k * pt_;  // full pages: exact
    stats_.exact_tokens = exact * H_;
    attend_list(q, out, list_.as<int>(), list_count_.as<int>(), list_cap_, exact, st);
  }
  int64_t own_bytes() const override {
    int64_t b = 0;
    for (const DeviceBuffer* x : {&min_[0], &max_[0], &min_[1], &max_[1], &new_min_, &new_max_, &scores_, &list_,
                                  &list_count_, &ids_, &scan_})
      b += static_cast<int64_t>(x->bytes());
    return b;
  }

  int pt_ = 16;
  int64_t p_max_ = 0, pages_ = 0, list_cap_ = 0;
  int cur_ = 0;
  DeviceBuffer min_[2], max_[2];    // [H, pages, D] bf16 at stride pages_ (capacity p_max_)
  DeviceBuffer new_min_, new_max_;  // [H, new pages, D] bf16
  DeviceBuffer scores_;             // [H, pages] f32
  DeviceBuffer list_, list_count_, ids_, scan_;
};

}  // namespace

std::unique_ptr<LayerAttention> make_quest_layer_attention(const AttentionShape& shape, const AttentionConfig& cfg,
                                                           int num_seqs, int64_t max_tokens) {
  return std::make_unique<QuestLayerAttention>(shape, cfg, num_seqs, max_tokens);
}
std::unique_ptr<LayerAttention> make_streaming_layer_attention(const AttentionShape& shape,
                                                               const AttentionConfig& cfg, int num_seqs,
                                                               int64_t max_tokens) {
  return std::make_unique<StreamingLayerAttention>(shape, cfg, num_seqs, max_tokens);
}
std::unique_ptr<LayerAttention> make_oracle_layer_attention(const AttentionShape& shape, const AttentionConfig& cfg,
                                                            int num_seqs, int64_t max_tokens) {
  return std::make_unique<OracleLayerAttention>(shape, cfg, num_seqs, max_tokens);
}

}  // namespace detail
}  // namespace retroinfer::cuda
