// The decode launch sequence of the wave index (score -> select -> exact + estimation -> combine), shared by
// RetroLayer and WaveBufferLayer (layer_common.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda_check.h"
#include "attention/cuda/layer_common.h"
#include "retroinfer/error.h"

namespace retroinfer::cuda::detail {

int exact_splits(int64_t list_tokens, int num_heads) {
  const int cap = std::max(1, kExactCtasPerSm * sm_count() / std::max(num_heads, 1));
  return std::min(decode_splits(list_tokens, num_heads, 1), cap);
}

std::vector<std::pair<std::string, float>> summarize_phases(const std::vector<uint64_t>& raw, int num_heads) {
  constexpr uint64_t kUnset = ~uint64_t{0};
  constexpr int S = kSelPhases;
  static const char* const kNames[S] = {"start", "scores", "histogram", "threshold_bins",
                                        "candidates", "thresholds", "compaction", "expansion"};
  // Timeline over all heads (globaltimer ns, relative to the first score CTA's start): first start and
  // last end of each kernel. Inside the selection: per-head phase lengths from clock64, converted by the
  // heads' globaltimer / clock ratio over the whole kernel; medians over the heads.
  struct Span {
    uint64_t first = kUnset, last = 0;
    void start(uint64_t t) { if (t != kUnset) first = std::min(first, t); }
    void end(uint64_t t) { if (t != kUnset) last = std::max(last, t); }
    bool ok() const { return first != kUnset && last != 0; }
  };
  Span score, select, exact, est, merge, first_tile, loop_end, barrier, score_start, score_issued, score_q;
  struct CtaSpans {  // kSlotSpan: exact (0) and estimation (1) CTAs
    uint64_t start_last = 0, end_first = kUnset;
    double dur_ns = 0.0, ctas = 0.0;
  } span[2];
  std::vector<std::vector<double>> ph(S + 1);
  double ratio_sum = 0.0;
  int ratio_n = 0;
  for (int h = 0; h < num_heads; ++h) {
    const uint64_t* r = raw.data() + size_t(h) * kPhaseSlots;
    const uint64_t* ns = r + 2;
    const uint64_t* clk = r + 2 + S;
    score.start(r[0]);
    if (r[1] != kUnset) score.end(~r[1]);
    exact.start(r[kSlotExact]);
    if (r[kSlotExact + 1] != kUnset) exact.end(~r[kSlotExact + 1]);
    est.start(r[kSlotEst]);
    if (r[kSlotEst + 1] != kUnset) est.end(~r[kSlotEst + 1]);
    if (r[kSlotMerge] != kUnset) merge.end(~r[kSlotMerge]);
    first_tile.start(r[kSlotScore + 4]);
    if (r[kSlotScore] != kUnset) first_tile.end(~r[kSlotScore]);
    loop_end.start(r[kSlotScore + 1]);
    if (r[kSlotScore + 2] != kUnset) loop_end.end(~r[kSlotScore + 2]);
    if (r[kSlotScore + 3] != kUnset) barrier.end(~r[kSlotScore + 3]);
    if (r[kSlotScoreStart] != kUnset) score_start.end(~r[kSlotScoreStart]);
    if (r[kSlotScoreIssued] != kUnset) score_issued.end(~r[kSlotScoreIssued]);
    score_q.start(r[kSlotScoreQ]);
    if (r[kSlotScoreQ + 1] != kUnset) score_q.end(~r[kSlotScoreQ + 1]);
    for (int k = 0; k < 2; ++k) {
      const uint64_t* sp = r + kSlotSpan + 4 * k;
      if (sp[3] == kUnset) continue;  // no CTA stamped
      if (sp[0] != kUnset) span[k].start_last = std::max(span[k].start_last, ~sp[0]);
      span[k].end_first = std::min(span[k].end_first, sp[1]);
      span[k].dur_ns += double(sp[2] + 1);
      span[k].ctas += double(sp[3] + 1);
    }
    if (ns[0] == kUnset || ns[S - 1] == kUnset || clk[S - 1] <= clk[0]) continue;
    select.start(ns[0]);
    select.end(ns[S - 1]);
    ratio_sum += double(ns[S - 1] - ns[0]) / double(clk[S - 1] - clk[0]);
    ++ratio_n;
  }
  std::vector<std::pair<std::string, float>> out;
  if (!score.ok()) return out;
  const uint64_t t0 = score.first;
  auto add = [&](const std::string& name, double ns) { out.emplace_back("phase." + name, float(ns * 1e-6)); };
  auto rel = [&](uint64_t t) { return double(int64_t(t - t0)); };
  add("score_end", rel(score.last));
  // Inside the score grid (the stream / tma kernels stamp the last CTA's start and the first tile; every
  // kernel the loop end).
  if (score_start.last != 0) add("score_start_last", rel(score_start.last));
  if (score_issued.last != 0) add("score_issued_last", rel(score_issued.last));
  if (score_q.ok()) {
    add("score_q_first", rel(score_q.first));
    add("score_q_last", rel(score_q.last));
  }
  if (first_tile.ok()) {
    add("score_first_tile_first", rel(first_tile.first));
    add("score_first_tile_last", rel(first_tile.last));
  }
  if (loop_end.ok()) {
    add("score_loop_end_first", rel(loop_end.first));
    add("score_loop_end_last", rel(loop_end.last));
  }
  if (barrier.last != 0) add("score_barrier_last", rel(barrier.last));
  if (select.ok()) {
    add("select_start", rel(select.first));
    add("select_end", rel(select.last));
  }
  if (exact.ok()) {
    add("exact_start", rel(exact.first));
    add("exact_end", rel(exact.last));
  }
  if (est.ok()) {
    add("estimate_start", rel(est.first));
    add("estimate_end", rel(est.last));
  }
  if (merge.last != 0) add("merge_end", rel(merge.last));
  static const char* const kSpanNames[2] = {"exact", "estimate"};
  for (int k = 0; k < 2; ++k) {
    if (span[k].ctas <= 0.0) continue;
    const std::string n = kSpanNames[k];
    add(n + "_start_last", rel(span[k].start_last));
    add(n + "_end_first", rel(span[k].end_first));
    add(n + "_cta_mean", span[k].dur_ns / span[k].ctas);
    out.emplace_back("phase." + n + "_ctas", float(span[k].ctas));
  }
  if (ratio_n > 0) {
    const double ns_per_cycle = ratio_sum / ratio_n;
    for (int h = 0; h < num_heads; ++h) {
      const uint64_t* r = raw.data() + size_t(h) * kPhaseSlots;
      const uint64_t* ns = r + 2;
      const uint64_t* clk = r + 2 + S;
      if (ns[0] == kUnset || ns[S - 1] == kUnset) continue;
      for (int j = 1; j < S; ++j) ph[j].push_back(double(clk[j] - clk[j - 1]) * ns_per_cycle);
      ph[0].push_back(double(ns[S - 1] - ns[0]));
    }
    auto median = [](std::vector<double> x) {
      std::sort(x.begin(), x.end());
      return x.empty() ? 0.0 : x[x.size() / 2];
    };
    for (int j = 1; j < S; ++j) add(std::string("select_") + kNames[j], median(ph[j]));
    add("select_head_total", median(ph[0]));
  }
  return out;
}

namespace {

// Where the selection's scores are formed (layer_common.h ZoneDecodeArgs: by shape, the same scores bit for bit).
enum class ScoreFormation { kInSelection, kInScoreGrid, kOwnGrid };
ScoreFormation score_formation(const ZoneDecodeArgs& a) {
  const int C = a.num_clusters;
  if (C > 0 && C <= kSelectBinsMaxItems && a.group <= 4 && C % 4 == 0)
    return ScoreFormation::kInSelection;
  if (C > 0 && score_form_fits(C, a.head_dim, a.num_heads)) return ScoreFormation::kInScoreGrid;
  return ScoreFormation::kOwnGrid;
}

ScoreParams score_params(const ZoneDecodeArgs& a, ScoreFormation form) {
  ScoreParams sp;
  sp.q = a.q;
  sp.centroids_bf16 = a.centroids_bf16;
  sp.centroids_q8 = a.centroids_q8;
  sp.centroid_scale = a.centroid_scale;
  sp.sizes = a.sizes;
  sp.logits = a.logits;
  sp.norm_partial = a.norm_partial;
  sp.num_heads = a.num_heads;
  sp.group = a.group;
  sp.head_dim = a.head_dim;
  sp.num_clusters = a.num_clusters;
  sp.scale = a.scale;
  sp.phase = a.phase;
  sp.scores = form == ScoreFormation::kInScoreGrid ? a.scores : nullptr;
  return sp;
}

SelectParams select_params(const ZoneDecodeArgs& a, ScoreFormation form, int norm_parts, bool pdl) {
  SelectParams se;
  se.logits = a.logits;
  se.norm_partial = a.norm_partial;
  se.norm_parts = norm_parts;
  se.scores = a.scores;
  se.num_heads = a.num_heads;
  se.group = form == ScoreFormation::kInSelection ? a.group : 0;  // 0: ready scores
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
  se.grid_ws = a.grid_ws;
  se.list_stride = a.list_stride;
  se.phase = a.phase;
  se.pdl = pdl;
  se.prefetch = true;
  return se;
}

// The exact grid over the exact list and, when n_e > 0, the estimation grid of est_ctas CTAs per head chained
// behind it (kernels.h DecodeParams::est).
DecodeParams decode_params(const ZoneDecodeArgs& a, int est_ctas, int total, bool pdl) {
  DecodeParams dp;
  dp.q = a.q;
  dp.k = a.k;
  dp.v = a.v;
  dp.kv8 = a.kv8;
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
  dp.phase = a.phase;
  dp.balance = true;
  if (est_ctas > 0) {  // the estimation CTAs' slots follow the exact splits
    dp.est_ctas = est_ctas;
    dp.est.logits = a.logits;
    dp.est.value_sums_bf16 = a.value_sums_bf16;
    dp.est.sizes = a.sizes;
    dp.est.estimation_ids = a.estimation_ids;
    dp.est.num_clusters = a.num_clusters;
    dp.est.k_estimation = a.n_estimation;
    dp.est.split_offset = a.attn_splits;
    dp.chain_pdl = pdl;
  }
  return dp;
}

}  // namespace

void launch_zone_decode(const ZoneDecodeArgs& a, cudaStream_t st, const std::function<void(const char*)>& mark,
                        const std::function<void()>& after_select) {
  auto marked = [&](const char* name) {
    if (mark) mark(name);
  };
  const int est_ctas = a.n_estimation > 0 ? static_cast<int>(ceil_div(a.n_estimation, kEstimateChunk)) : 0;
  RETROINFER_CHECK(est_ctas <= a.est_splits, "launch_zone_decode: the estimation needs ", est_ctas,
                   " slots per head but the layer sized ", a.est_splits,
                   " (est_splits must be ceil(n_estimation / kEstimateChunk))");
  const int total = a.attn_splits + est_ctas;
  // Programmatic launches only on a created stream (graph capture needs one anyway): the legacy default
  // stream's implicit synchronisation is left as it is. Stage timing records events between the kernels.
  const bool pdl = !a.timing && st != nullptr && st != cudaStreamLegacy;
  const ScoreFormation form = score_formation(a);
  const ScoreParams sp = score_params(a, form);
  launch_check(score_clusters(sp, st), "score_clusters", st);
  marked("score");

  const int norm_parts = score_blocks(a.num_clusters, a.head_dim, a.num_heads);
  if (form == ScoreFormation::kOwnGrid) {  // the selection then reads ready scores
    FormScoresParams fp;
    fp.logits = a.logits;
    fp.norm_partial = a.norm_partial;
    fp.norm_parts = norm_parts;
    fp.scores = a.scores;
    fp.num_heads = a.num_heads;
    fp.group = a.group;
    fp.num_items = a.num_clusters;
    fp.pdl = pdl;
    launch_check(form_scores(fp, st), "form_scores", st);
  }
  launch_check(select_and_expand(select_params(a, form, norm_parts, pdl), st), "select_and_expand", st);
  marked("select");
  if (after_select) after_select();

  DecodeParams dp = decode_params(a, est_ctas, total, pdl);
  // PDL only straight after the selection: the wave buffer's / outliers' kernels between keep plain order.
  dp.pdl = pdl && !after_select;
  launch_check(decode_attention(dp, st), "decode_attention(sparse)", st);
  marked("exact_attention");
  CombineParams c;
  c.part_ml = a.part_ml;
  c.part_o = a.part_o;
  c.num_heads = a.num_heads;
  c.group = a.group;
  c.head_dim = a.head_dim;
  c.total_splits = total;
  c.out = a.out;
  c.phase = a.phase;
  c.pdl = pdl;  // straight after the decode grids
  launch_check(combine_states(c, st), "combine_states", st);
  marked("combine");
}

}  // namespace retroinfer::cuda::detail
