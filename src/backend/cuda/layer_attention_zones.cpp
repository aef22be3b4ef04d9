// The decode launch sequence of the wave index (score -> select -> estimate -> exact -> combine), shared by
// RetroLayer and WaveBufferLayer (layer_common.h), and the zone budgets.
#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/layer_common.h"

namespace retroinfer::cuda::detail {

ZoneCounts zone_counts(int num_clusters, const AttentionConfig& cfg) {
  ZoneCounts z;
  if (num_clusters <= 0) return z;
  constexpr double kSlack = 1e-9;  // ceil(0.3 * 10) must be 3, not 4 (index/wave_index.cpp)
  auto share = [&](double f) {
    return static_cast<int>(std::min<double>(num_clusters, std::ceil(f * num_clusters - kSlack)));
  };
  z.n_retrieval = share(cfg.retrieval_fraction);
  if (cfg.retrieval_fraction > 0.0) z.n_retrieval = std::max(z.n_retrieval, 1);
  z.n_estimation = cfg.estimation ? std::min(share(cfg.estimation_fraction), num_clusters - z.n_retrieval) : 0;
  return z;
}

void launch_zone_decode(const ZoneDecodeArgs& a, cudaStream_t st, const std::function<void(const char*)>& mark,
                        const std::function<void()>& after_select) {
  auto marked = [&](const char* name) {
    if (mark) mark(name);
  };
  const int total = a.attn_splits + a.est_splits;
  ScoreParams sp;
  sp.q = a.q;
  sp.centroids_bf16 = a.centroids_bf16;
  sp.sizes = a.sizes;
  sp.logits = a.logits;
  sp.norm_partial = a.norm_partial;
  sp.num_heads = a.num_heads;
  sp.group = a.group;
  sp.head_dim = a.head_dim;
  sp.num_clusters = a.num_clusters;
  sp.scale = a.scale;
  launch_check(score_clusters(sp, st), "score_clusters", st);
  marked("score");

  SelectParams se;
  se.logits = sp.logits;
  se.norm_partial = sp.norm_partial;
  se.norm_parts = score_blocks(a.num_clusters, a.head_dim, a.num_heads);
  se.scores = a.scores;
  se.num_heads = a.num_heads;
  se.group = a.group;
  se.num_items = a.num_clusters;
  se.k_retrieval = a.n_retrieval;
  se.k_estimation = a.n_estimation;
  se.retrieval_ids = a.retrieval_ids;
  se.estimation_ids = a.estimation_ids;
  se.offsets = a.offsets;
  se.members = a.members;
  se.n_idx = a.n_idx;
  se.idx_begin = a.idx_begin;
  se.num_tokens = a.num_tokens;
  se.token_list = a.token_list;
  se.token_count = a.token_count;
  se.scan_scratch = a.scan_scratch;
  se.list_stride = a.list_stride;
  launch_check(select_and_expand(se, st), "select_and_expand", st);
  marked("select");

  const bool fork = a.n_estimation > 0 && a.side != nullptr;
  if (fork) {
    RETROINFER_CUDA_CHECK(cudaEventRecord(a.fork, st));
    RETROINFER_CUDA_CHECK(cudaStreamWaitEvent(a.side, a.fork, 0));
  }
  if (a.n_estimation > 0) {
    cudaStream_t es = fork ? a.side : st;
    EstimateParams ep;
    ep.logits = sp.logits;
    ep.value_sums_bf16 = a.value_sums_bf16;
    ep.sizes = a.sizes;
    ep.estimation_ids = a.estimation_ids;
    ep.num_heads = a.num_heads;
    ep.group = a.group;
    ep.head_dim = a.head_dim;
    ep.num_clusters = a.num_clusters;
    ep.k_estimation = a.n_estimation;
    ep.num_splits = a.est_splits;
    ep.part_ml = a.part_ml;
    ep.part_o = a.part_o;
    ep.total_splits = total;
    ep.split_offset = a.attn_splits;
    launch_check(estimate_attention(ep, es), "estimate_attention", es);
    if (fork) RETROINFER_CUDA_CHECK(cudaEventRecord(a.join, es));
    marked("estimate");
  }
  if (after_select) after_select();

  DecodeParams dp;
  dp.q = a.q;
  dp.k = a.k;
  dp.v = a.v;
  dp.kv_stride = a.kv_stride;
  dp.token_list = a.exact_list;
  dp.token_count = a.exact_count;
  dp.list_stride = a.exact_list_stride;
  dp.num_heads = a.num_heads;
  dp.group = a.group;
  dp.head_dim = a.head_dim;
  dp.scale = a.scale;
  dp.num_splits = a.attn_splits;
  dp.split_tokens = split_tokens(a.exact_capacity, a.attn_splits);
  dp.part_ml = a.part_ml;
  dp.part_o = a.part_o;
  dp.total_splits = total;
  dp.split_offset = 0;
  launch_check(decode_attention(dp, st), "decode_attention(sparse)", st);
  marked("exact_attention");
  if (fork) RETROINFER_CUDA_CHECK(cudaStreamWaitEvent(st, a.join, 0));
  CombineParams c;
  c.part_ml = a.part_ml;
  c.part_o = a.part_o;
  c.num_heads = a.num_heads;
  c.group = a.group;
  c.head_dim = a.head_dim;
  c.total_splits = total;
  c.out = a.out;
  launch_check(combine_states(c, st), "combine_states", st);
  marked("combine");
}

}  // namespace retroinfer::cuda::detail
