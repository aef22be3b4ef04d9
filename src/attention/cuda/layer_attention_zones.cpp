// The decode launch sequence of the wave index (score -> select -> estimate -> exact -> combine), shared by
// RetroLayer and WaveBufferLayer (layer_common.h), and the zone budgets.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "kernels/cuda_check.h"
#include "attention/cuda/layer_common.h"
#include "retroinfer/error.h"

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

int exact_splits(int64_t list_tokens, int num_heads) {
  static const int per_sm = [] {
    const char* e = std::getenv("RETROINFER_EXACT_CTAS_PER_SM");
    return e != nullptr && e[0] >= '1' && e[0] <= '3' && e[1] == '\0' ? e[0] - '0' : kExactCtasPerSm;
  }();
  const int cap = std::max(1, per_sm * sm_count() / std::max(num_heads, 1));
  return std::min(decode_splits(list_tokens, num_heads, 1), cap);
}

DecodePath decode_path() {
  const char* e = std::getenv("RETROINFER_DECODE");
  DecodePath p;
  std::string_view v(e != nullptr ? e : "");
  v = v.substr(0, std::min(v.size(), v.find('+')));  // "P+X": path P, exact-grid variant X (exact_variant_from_env)
  if (v == "run6") p.fused_merge = p.pdl = p.early_loads = p.prefetch = p.balance = false;
  else if (v == "fused") p.pdl = p.early_loads = p.prefetch = p.balance = false;
  else if (v == "nopdl") p.pdl = false;
  else if (v == "run8") {  // run 8: DecodePath's defaults
  } else if (v.empty() && kRun9IsDefault) {  // unset (or empty): the default path
    p.form_scores = p.fused_estimate = true;
    p.form_in_score = kRun10FormIsDefault;
    p.combine_pdl = kRun10FormIsDefault && kRun10CombineIsDefault;
    p.fused_merge = !p.combine_pdl;
    p.select_forms = p.combine_pdl && kRun25SelectFormsIsDefault;
  } else if (v == "run9") p.form_scores = p.fused_estimate = true;
  else if (v == "run9est") p.fused_estimate = true;  // attribution: run 9's estimation part alone
  else if (v == "run9form") p.form_scores = true;    // attribution: run 9's score formation alone
  else if (v == "run10" || v == "run10form") {  // run 9 + run 10's score formation (the default spelled out)
    p.form_scores = p.fused_estimate = p.form_in_score = true;
  } else if (v == "run10c") {  // run 17: run 10 without the fused merge, combine_states chained by PDL
    p.form_scores = p.fused_estimate = p.form_in_score = p.combine_pdl = true;
    p.fused_merge = false;
  } else if (v == "run10s") {  // run 25: run10c with the scores formed by the bins selection (group > 0)
    p.form_scores = p.fused_estimate = p.form_in_score = p.combine_pdl = p.select_forms = true;
    p.fused_merge = false;
  } else if (v == "run10select" || v == "run10list" || v == "run11" || v.starts_with("run11-")) {
    RETROINFER_FAIL("RETROINFER_DECODE=", v, ": this decode path was removed after run 15 (slower than or no "
                    "faster than run 9, docs/cuda-kernels.md); use run10s (the default), run10c, run10, run9 or run8");
  } else if (!v.empty()) {
    RETROINFER_FAIL("RETROINFER_DECODE=", v, " is not a decode path: use run10s (the default), run10c, ",
                    "run10 / run10form, run9, run9est, run9form, run8, nopdl, fused or run6, or leave it unset");
  }
  return p;
}

// RETROINFER_EXACT, or the "+X" suffix of RETROINFER_DECODE (kernel_bench --paths run10,run10+split: the
// variants timed on the same built layer), which takes precedence.
int exact_variant_from_env() {
  const char* d = std::getenv("RETROINFER_DECODE");
  const std::string_view dv(d != nullptr ? d : "");
  const size_t plus = dv.find('+');
  const char* e = std::getenv("RETROINFER_EXACT");
  const bool suffix = plus != std::string_view::npos;
  const std::string_view v = suffix ? dv.substr(plus + 1) : std::string_view(e != nullptr ? e : "");
  const char* from = suffix ? "the suffix of RETROINFER_DECODE" : "RETROINFER_EXACT";
  if (v.empty() && !suffix) return kExactDefault;
  for (int i = 0; i < kExactVariants; ++i)
    if (v == exact_variant_name(i)) return i;
  RETROINFER_FAIL(from, ": \"", v, "\" is not an exact-grid variant: use split64r (the default), split64, split, v1, ",
                  "split64i, split64ri, split64rh, split64rih, split64e, split64eri, split64ep or ",
                  "split64erp, or leave it unset");
}

const char* exact_variant_name(int variant) {
  switch (variant) {
    case kExactV1: return "v1";
    case kExactSplit: return "split";
    case kExactSplit64: return "split64";
    case kExactSplit64R: return "split64r";
    case kExactSplit64I: return "split64i";
    case kExactSplit64RI: return "split64ri";
    case kExactSplit64RH: return "split64rh";
    case kExactSplit64RIH: return "split64rih";
    case kExactSplit64E: return "split64e";
    case kExactSplit64ERI: return "split64eri";
    case kExactSplit64EP: return "split64ep";
    case kExactSplit64ERP: return "split64erp";
    default: return "?";
  }
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

void launch_zone_decode(const ZoneDecodeArgs& a, cudaStream_t st, const std::function<void(const char*)>& mark,
                        const std::function<void()>& after_select) {
  auto marked = [&](const char* name) {
    if (mark) mark(name);
  };
  // Run 8 (decode_path()): the merge in the last CTA of each head, programmatic dependent launches.
  const DecodePath path = a.merge_counter != nullptr ? decode_path() : DecodePath{false, false, false, false, false};
  // Run 9: the estimation as est_ctas CTAs per head of the exact-attention grid (kEstimateFusedChunk
  // clusters each; fewer slots than the a.est_splits the layer sized, see kernels.h), or of the estimation
  // grid chained behind it (RETROINFER_EXACT=split*: exact_est_chunk clusters each, <= a.est_splits slots).
  const int exact_variant = exact_variant_from_env();  // read (and checked) at every decode
  const int est_ctas = path.fused_estimate && a.n_estimation > 0
                           ? static_cast<int>(ceil_div(a.n_estimation, exact_est_chunk(exact_variant))) : 0;
  RETROINFER_CHECK(est_ctas <= a.est_splits, "launch_zone_decode: run 9 needs ", est_ctas,
                   " estimation slots per head but the layer sized ", a.est_splits,
                   " (est_splits must be ceil(n_estimation / kEstimateChunk))");
  const int states = a.attn_splits + (path.fused_estimate ? est_ctas : a.est_splits);
  const bool fused = path.fused_merge && int64_t{states} * a.group <= kMergeMaxStates &&
                     reinterpret_cast<uintptr_t>(a.out) % 16 == 0;
  // split64ep / erp (kernels.h EstPremerge): one more slot per head for the pre-merged estimation state (the
  // layers size kPremergeSlots extra); only with the fused merge and the layer's estimation counter, else the
  // variant runs as split64e / its register-capped form without the pre-merge.
  const bool premerge = fused && est_ctas > 0 && exact_premerges(exact_variant) && a.est_counter != nullptr &&
                        int64_t{states + kPremergeSlots} * a.group <= kMergeMaxStates;
  const int total = states + (premerge ? kPremergeSlots : 0);
  // Programmatic launches only on a created stream (graph capture needs one anyway): the legacy default
  // stream's implicit synchronisation is left as it is.
  const bool pdl = path.pdl && !a.timing && st != nullptr && st != cudaStreamLegacy;
  FusedMerge fm;
  if (fused) {
    fm.counter = a.merge_counter;
    fm.out = a.out;
  }
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
  // Run 10: the scores formed by the score grid itself when all its CTAs fit at once (else run 9's
  // form_scores grid below).
  // run10s: the bins selection forms the scores from the logits and partials itself (its group > 0 path), so the
  // score grid needs no grid barrier; only where the bins kernel runs (the grid selection reads ready scores).
  // Only where the selection's fast formation applies (select_bins.cu scores_from_logit_quads: G <= 4 and whole item
  // quads; its general path is ~5x slower on one multiprocessor than the score grid's formation over ~24 CTAs).
  const bool select_forms = path.select_forms && a.num_clusters > 0 && a.num_clusters <= kSelectGridMinItems &&
                            a.group <= 4 && a.num_clusters % 4 == 0;
  const bool form_in_score = !select_forms && path.form_scores && path.form_in_score && path.early_loads &&
                             a.num_clusters > 0 && score_form_fits(a.num_clusters, a.head_dim, a.num_heads);
  sp.scores = form_in_score ? a.scores : nullptr;
  launch_check(score_clusters(sp, st), "score_clusters", st);
  marked("score");

  const int norm_parts = score_blocks(a.num_clusters, a.head_dim, a.num_heads);
  // run 9: the scores by their own grid; the selection reads them (group 0)
  if (path.form_scores && !form_in_score && !select_forms) {
    FormScoresParams fp;
    fp.logits = sp.logits;
    fp.norm_partial = sp.norm_partial;
    fp.norm_parts = norm_parts;
    fp.scores = a.scores;
    fp.num_heads = a.num_heads;
    fp.group = a.group;
    fp.num_items = a.num_clusters;
    fp.pdl = pdl;
    launch_check(form_scores(fp, st), "form_scores", st);
  }
  SelectParams se;
  se.logits = sp.logits;
  se.norm_partial = sp.norm_partial;
  se.norm_parts = norm_parts;
  se.scores = a.scores;
  se.num_heads = a.num_heads;
  se.group = path.form_scores && !select_forms ? 0 : a.group;
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
  se.prefetch = path.prefetch;
  launch_check(select_and_expand(se, st), "select_and_expand", st);
  marked("select");

  const bool fork = a.n_estimation > 0 && a.side != nullptr && !path.fused_estimate;
  if (fork) {
    RETROINFER_CUDA_CHECK(cudaEventRecord(a.fork, st));
    RETROINFER_CUDA_CHECK(cudaStreamWaitEvent(a.side, a.fork, 0));
  }
  if (a.n_estimation > 0 && !path.fused_estimate) {
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
    ep.phase = a.phase;
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
  dp.phase = a.phase;
  dp.balance = path.balance;
  if (est_ctas > 0) {  // run 9: the estimation CTAs of this grid (slots after the exact splits)
    dp.est_ctas = est_ctas;
    dp.est.logits = sp.logits;
    dp.est.value_sums_bf16 = a.value_sums_bf16;
    dp.est.sizes = a.sizes;
    dp.est.estimation_ids = a.estimation_ids;
    dp.est.num_heads = a.num_heads;
    dp.est.group = a.group;
    dp.est.head_dim = a.head_dim;
    dp.est.num_clusters = a.num_clusters;
    dp.est.k_estimation = a.n_estimation;
    dp.est.num_splits = est_ctas;
    dp.est.split_offset = a.attn_splits + (premerge ? kPremergeSlots : 0);
    dp.exact_variant = exact_variant;
    if (premerge) dp.premerge.counter = a.est_counter;
    dp.chain_pdl = pdl;  // the estimation grid a programmatic dependent of the exact grid (kernels.h)
  }
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
  c.phase = a.phase;
  // run10c: straight after the decode grids (PDL), unless a side-stream join stands between them.
  c.pdl = pdl && path.combine_pdl && !fork;
  launch_check(combine_states(c, st), "combine_states", st);
  marked("combine");
}

}  // namespace retroinfer::cuda::detail
