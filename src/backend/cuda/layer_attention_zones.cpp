// The decode launch sequence of the wave index (score -> select -> estimate -> exact -> combine), shared by
// RetroLayer and WaveBufferLayer (layer_common.h), and the zone budgets.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/layer_common.h"
#include "buffer/session_planner.h"
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

DecodePath decode_path() {
  const char* e = std::getenv("RETROINFER_DECODE");
  DecodePath p;
  const std::string_view v(e != nullptr ? e : "");
  if (v == "run6") p.fused_merge = p.pdl = p.early_loads = p.prefetch = p.balance = false;
  else if (v == "fused") p.pdl = p.early_loads = p.prefetch = p.balance = false;
  else if (v == "nopdl") p.pdl = false;
  else if (e == nullptr && kRun9IsDefault) {
    p.form_scores = p.fused_estimate = true;
    p.form_in_score = kRun10FormIsDefault;
  } else if (v == "run9") p.form_scores = p.fused_estimate = true;
  else if (v == "run9est") p.fused_estimate = true;  // attribution: run 9's estimation part alone
  else if (v == "run9form") p.form_scores = true;    // attribution: run 9's score formation alone
  else if (v == "run10" || v == "run10form" || v == "run10select" || v == "run10list") {  // run 9 + run 10's parts
    p.form_scores = p.fused_estimate = true;
    p.form_in_score = v == "run10" || v == "run10form";
    p.smem_offsets = v == "run10" || v == "run10select";
    p.list_ahead = v == "run10" || v == "run10list";
  } else if (v == "run11" || v.starts_with("run11-")) {  // "run11-x2-c64-oest": knobs in the name
    p.form_scores = p.fused_estimate = p.run11 = true;
  }
  return p;
}

static_assert(kRun11CtaBound == buffer::kDecodeCtaBound, "run 11's exact slots stay within the planner's bound");

namespace {

// One run 11 knob value (layer_common.h Run11Knobs): `what` names its source in the error.
void run11_splits(Run11Knobs& k, std::string_view v, int attn_splits, std::string_view what) {
  const bool times = !v.empty() && v[0] == 'x';
  const std::string digits(v.substr(times ? 1 : 0));
  char* end = nullptr;
  const long x = digits.empty() ? 0 : std::strtol(digits.c_str(), &end, 10);
  RETROINFER_CHECK(end != nullptr && *end == '\0' && x >= 1 && (times ? x <= kRun11MaxSplitsX : x <= 1 << 20), what,
                   ": exact splits '", v, "': expected xK (K = 1..", kRun11MaxSplitsX,
                   ", times run 9's exact splits) or a split count N >= 1");
  k.splits = times ? static_cast<int>(x) * attn_splits : static_cast<int>(x);
}
void run11_chunk(Run11Knobs& k, std::string_view v, std::string_view what) {
  RETROINFER_CHECK(v == "64" || v == "128", what, ": estimation chunk '", v, "': expected 64 or 128");
  k.est_chunk = v == "64" ? 64 : 128;
}
void run11_order(Run11Knobs& k, std::string_view v, std::string_view what) {
  RETROINFER_CHECK(v == "exact" || v == "est" || v == "head", what, ": CTA order '", v,
                   "': expected exact, est or head");
  k.order = v == "exact" ? kRun11OrderExactFirst : (v == "est" ? kRun11OrderEstFirst : kRun11OrderHead);
}

}  // namespace

Run11Knobs run11_knobs(int attn_splits) {
  Run11Knobs k;
  k.splits = kRun11DefaultSplitsX * attn_splits;
  auto env = [](const char* name) -> std::string_view {
    const char* e = std::getenv(name);
    return e != nullptr ? std::string_view(e) : std::string_view();
  };
  if (const auto v = env("RETROINFER_RUN11_SPLITS"); !v.empty())
    run11_splits(k, v, attn_splits, "RETROINFER_RUN11_SPLITS");
  if (const auto v = env("RETROINFER_RUN11_EST_CHUNK"); !v.empty()) run11_chunk(k, v, "RETROINFER_RUN11_EST_CHUNK");
  if (const auto v = env("RETROINFER_RUN11_ORDER"); !v.empty()) run11_order(k, v, "RETROINFER_RUN11_ORDER");
  // The path name's tokens (RETROINFER_DECODE=run11-x2-c64-oest) override the variables.
  std::string_view path = env("RETROINFER_DECODE");
  if (path.starts_with("run11-")) {
    path.remove_prefix(6);
    while (!path.empty()) {
      const size_t dash = path.find('-');
      const std::string_view t = path.substr(0, dash);
      path = dash == std::string_view::npos ? std::string_view() : path.substr(dash + 1);
      RETROINFER_CHECK(!t.empty(), "RETROINFER_DECODE: an empty run 11 token (expected run11-xK-nN-cC-oO parts)");
      if (t[0] == 'x') run11_splits(k, t, attn_splits, "RETROINFER_DECODE");
      else if (t[0] == 'n') run11_splits(k, t.substr(1), attn_splits, "RETROINFER_DECODE");
      else if (t[0] == 'c') run11_chunk(k, t.substr(1), "RETROINFER_DECODE");
      else if (t[0] == 'o') run11_order(k, t.substr(1), "RETROINFER_DECODE");
      else RETROINFER_FAIL("RETROINFER_DECODE: run 11 token '", t, "': expected xK (splits x run 9's), nN (N splits), "
                           "c64 / c128 (estimation chunk), oexact / oest / ohead (CTA order)");
    }
  }
  return k;
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
  Span score, select, exact, est, merge;
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
  // clusters each; fewer slots than the a.est_splits the layer sized, see kernels.h). Run 11: est_chunk
  // clusters each (64 = kEstimateChunk: est_splits slots) and attn exact splits (more slots: zone_state_slots).
  const Run11Knobs k11 = path.run11 ? run11_knobs(a.attn_splits) : Run11Knobs{};
  const int est_chunk = path.run11 ? k11.est_chunk : kEstimateFusedChunk;
  const int est_ctas = path.fused_estimate && a.n_estimation > 0
                           ? static_cast<int>(ceil_div(a.n_estimation, est_chunk)) : 0;
  RETROINFER_CHECK(est_ctas <= a.est_splits, "launch_zone_decode: run 9 / 11 needs ", est_ctas,
                   " estimation slots per head but the layer sized ", a.est_splits,
                   " (est_splits must be ceil(n_estimation / kEstimateChunk))");
  const int slots = zone_state_slots(a.attn_splits, a.est_splits, a.num_heads);  // what the layers allocate
  const int attn = path.run11 ? std::clamp(k11.splits, 1, slots - est_ctas) : a.attn_splits;
  const int total = attn + (path.fused_estimate ? est_ctas : a.est_splits);
  const bool fused = path.fused_merge && int64_t{total} * a.group <= kMergeMaxStates &&
                     reinterpret_cast<uintptr_t>(a.out) % 16 == 0;
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
  sp.sizes = a.sizes;
  sp.logits = a.logits;
  sp.norm_partial = a.norm_partial;
  sp.num_heads = a.num_heads;
  sp.group = a.group;
  sp.head_dim = a.head_dim;
  sp.num_clusters = a.num_clusters;
  sp.scale = a.scale;
  sp.phase = a.phase;
  sp.early_loads = path.early_loads;
  // Run 10: the scores formed by the score grid itself when all its CTAs fit at once (else run 9's
  // form_scores grid below).
  const bool form_in_score = path.form_scores && path.form_in_score && path.early_loads && a.num_clusters > 0 &&
                             score_form_fits(a.num_clusters, a.head_dim, a.num_heads);
  sp.scores = form_in_score ? a.scores : nullptr;
  launch_check(score_clusters(sp, st), "score_clusters", st);
  marked("score");

  const int norm_parts = score_blocks(a.num_clusters, a.head_dim, a.num_heads);
  if (path.form_scores && !form_in_score) {  // run 9: the scores by their own grid; the selection reads them (group 0)
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
  se.group = path.form_scores ? 0 : a.group;
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
  se.prefetch = path.prefetch;
  se.smem_offsets = path.smem_offsets;
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
    ep.split_offset = attn;
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
  dp.num_splits = attn;
  dp.split_tokens = split_tokens(a.exact_capacity, attn);
  dp.part_ml = a.part_ml;
  dp.part_o = a.part_o;
  dp.total_splits = total;
  dp.split_offset = 0;
  dp.merge = fm;
  dp.phase = a.phase;
  dp.balance = path.balance;
  dp.list_ahead = path.list_ahead;  // run 10 (used with est_ctas > 0)
  dp.run11 = path.run11;
  dp.run11_order = k11.order;
  dp.est_chunk = est_chunk;
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
    dp.est.split_offset = attn;
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
  launch_check(combine_states(c, st), "combine_states", st);
  marked("combine");
}

}  // namespace retroinfer::cuda::detail
