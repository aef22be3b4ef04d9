// The decode launch sequence of the wave index (score -> select -> estimate -> exact -> combine), shared by
// RetroLayer and WaveBufferLayer (layer_common.h), and the zone budgets.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string_view>

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

DecodePath decode_path() {
  const char* e = std::getenv("RETROINFER_DECODE");
  DecodePath p;
  if (e == nullptr) return p;
  const std::string_view v(e);
  if (v == "run6") p.fused_merge = p.pdl = false;
  else if (v == "fused") p.pdl = false;
  return p;
}

std::vector<std::pair<std::string, float>> summarize_phases(const std::vector<uint64_t>& raw, int num_heads) {
  constexpr uint64_t kUnset = ~uint64_t{0};
  constexpr int S = kSelPhases;
  static const char* const kNames[S] = {"start", "scores", "histogram", "threshold_bins",
                                        "candidates", "thresholds", "compaction", "expansion"};
  // Per head: score span and the gap to the selection's start (globaltimer ns); the selection's phases
  // in clock64 cycles, converted to ns by the head's own globaltimer / clock ratio over the whole kernel.
  std::vector<std::vector<double>> v(S + 3);
  double ns_per_cycle_sum = 0.0;
  int ratio_heads = 0;
  for (int h = 0; h < num_heads; ++h) {
    const uint64_t* ph = raw.data() + size_t(h) * kPhaseSlots;
    const uint64_t* ns = ph + 2;
    const uint64_t* clk = ph + 2 + S;
    if (ns[0] == kUnset || ns[S - 1] == kUnset || clk[S - 1] <= clk[0]) continue;
    ns_per_cycle_sum += double(ns[S - 1] - ns[0]) / double(clk[S - 1] - clk[0]);
    ++ratio_heads;
  }
  if (ratio_heads == 0) return {};
  const double ns_per_cycle = ns_per_cycle_sum / ratio_heads;
  uint64_t sel_first = kUnset, sel_last = 0, score_last = 0;
  for (int h = 0; h < num_heads; ++h) {
    const uint64_t* ph = raw.data() + size_t(h) * kPhaseSlots;
    const uint64_t* ns = ph + 2;
    const uint64_t* clk = ph + 2 + S;
    if (ns[0] == kUnset || ns[S - 1] == kUnset) continue;
    const bool score = ph[0] != kUnset && ph[1] != kUnset;
    if (score) {
      const uint64_t end = ~ph[1];
      v[0].push_back(double(end - ph[0]));
      v[1].push_back(double(int64_t(ns[0] - end)));
      score_last = std::max(score_last, end);
    }
    for (int j = 1; j < S; ++j) v[1 + j].push_back(double(clk[j] - clk[j - 1]) * ns_per_cycle);
    v[S + 1].push_back(double(ns[S - 1] - ns[0]));
    sel_first = std::min(sel_first, ns[0]);
    sel_last = std::max(sel_last, ns[S - 1]);
  }
  std::vector<std::pair<std::string, float>> out;
  auto median = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x.empty() ? 0.0 : x[x.size() / 2];
  };
  auto add = [&](const std::string& name, double ns) { out.emplace_back("phase." + name, float(ns * 1e-6)); };
  if (!v[0].empty()) {
    add("score_span", median(v[0]));
    add("score_end_to_select_start", median(v[1]));
  }
  for (int j = 1; j < S; ++j) add(std::string("select_") + kNames[j], median(v[1 + j]));
  add("select_head_total", median(v[S + 1]));
  // Critical path of the selection over all heads: first start to last end, and from the score's last end.
  add("select_first_start_to_last_end", double(sel_last - sel_first));
  if (score_last > 0) add("score_last_end_to_select_last_end", double(int64_t(sel_last - score_last)));
  return out;
}

void launch_zone_decode(const ZoneDecodeArgs& a, cudaStream_t st, const std::function<void(const char*)>& mark,
                        const std::function<void()>& after_select) {
  auto marked = [&](const char* name) {
    if (mark) mark(name);
  };
  const int total = a.attn_splits + a.est_splits;
  // Run 8 (decode_path()): the merge in the last CTA of each head, programmatic dependent launches.
  const DecodePath path = a.merge_counter != nullptr ? decode_path() : DecodePath{false, false};
  const bool fused = path.fused_merge && int64_t{total} * a.group <= kMergeMaxStates &&
                     reinterpret_cast<uintptr_t>(a.out) % 16 == 0;
  const bool pdl = path.pdl && !a.timing;
  FusedMerge fm;
  if (fused) {
    fm.counter = a.merge_counter;
    fm.out = a.out;
  }
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
  sp.phase = a.phase;
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
  se.phase = a.phase;
  se.pdl = pdl;
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
    ep.merge = fm;
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
  dp.merge = fm;
  // PDL only straight after the selection: the wave buffer's / outliers' kernels between keep plain order.
  dp.pdl = pdl && !after_select;
  launch_check(decode_attention(dp, st), "decode_attention(sparse)", st);
  marked("exact_attention");
  if (fork) RETROINFER_CUDA_CHECK(cudaStreamWaitEvent(st, a.join, 0));
  if (fused) {  // the last CTA of each head has merged; the join above orders the estimation's CTAs
    marked("combine");
    return;
  }
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
