// retro: wave-index decode attention on the CPU (see retro.h).
#include "attention/retro.h"

#include <algorithm>
#include <cmath>

#include "attention/exact.h"
#include "index/layer_budgets.h"
#include "retroinfer/cluster_trace.h"
#include "retroinfer/error.h"
#include "retroinfer/wave_counts.h"

namespace retroinfer::attention {

RetroAttention::RetroAttention(const AttentionConfig& cfg, const AttentionShape& shape) : MethodBase(cfg, shape) {
  validate(shape);
  validate(cfg);
  nominal_retrieval_fraction_ = cfg.retrieval_fraction;
}

std::vector<double> RetroAttention::calibration_missed_mass(const KvCache& kv, const float* q, int64_t n) const {
  if (!built_ || index_.indexed_tokens() == 0) return {};
  check_kv(kv);
  AttentionConfig nominal = cfg_;
  nominal.retrieval_fraction = nominal_retrieval_fraction_;
  return index::layer_missed_mass(index_, kv, nominal, shape_.num_heads_q, effective_scale(cfg_.scale, shape_.head_dim),
                                  q, n);
}

void RetroAttention::set_retrieval_multiplier(double m) {
  RETROINFER_CHECK(m > 0.0 && std::isfinite(m), "retro: retrieval multiplier ", m, " is not a positive number");
  retrieval_multiplier_ = m;
  // At most every cluster; the estimation zone takes what is left (zone_counts).
  cfg_.retrieval_fraction = std::min(1.0, nominal_retrieval_fraction_ * m);
}

index::KMeansParams RetroAttention::kmeans_params() const {
  index::KMeansParams p;
  p.tokens_per_cluster = cfg_.tokens_per_cluster;
  p.segment_tokens = cfg_.segment_tokens;
  p.segment_iters = cfg_.kmeans_segment_iters;
  p.global_iters = cfg_.kmeans_global_iters;
  return p;
}

void RetroAttention::build(const KvCache& kv) {
  const int64_t sink = cfg_.sink_tokens;
  index_.heads.assign(shape_.num_heads_kv, index::HeadIndex{});
  for (auto& hi : index_.heads) hi.head_dim = shape_.head_dim;
  index_.indexed_begin = sink;
  index_.indexed_end = sink;
  num_updates_ = 0;
  steps_since_build_ = 0;
  set_retrieval_multiplier(1.0);
  last_size_ = -1;
  last_sel_.assign(shape_.num_heads_kv, index::ZoneSelection{});
  built_ = true;
  const SteadySplit sp = steady_split(kv.size(), cfg_);
  if (retro_indexed_tokens(sp, cfg_.tokens_per_cluster) == 0) return;  // not one cluster's worth: all steady
  const int64_t end = sp.recent_begin;
  const index::KMeansParams p = kmeans_params();
  // Heads one after another: the k-means is parallel inside, or the caller runs layers in parallel
  // (Session::index_prompt).
  for (int h = 0; h < shape_.num_heads_kv; ++h)
    index::index_tokens(kv, h, sink, end, p, index_.heads[h], cfg_.outlier_fraction);
  index_.indexed_end = end;
}

void RetroAttention::on_prefill(const KvCache& kv) {
  check_kv(kv);
  build(kv);
}

void RetroAttention::sync(const KvCache& kv) {
  check_kv(kv);
  if (!built_) build(kv);
  RETROINFER_CHECK(kv.size() >= index_.indexed_end || index_.indexed_tokens() == 0, "retro: the KV cache holds ",
                   kv.size(), " tokens but the index covers up to token ", index_.indexed_end,
                   "; call on_prefill again after clearing or replacing the cache");
  const index::KMeansParams p = kmeans_params();
  while (index_update_due(kv.size() - index_.indexed_end, cfg_)) {
    const int64_t b = index_.indexed_end, e = b + cfg_.update_tokens;
    for (int h = 0; h < shape_.num_heads_kv; ++h)
      index::index_block(kv, h, b, e, cfg_.update_clusters, p, index_.heads[h], cfg_.outlier_fraction);
    index_.indexed_end = e;
    ++num_updates_;
  }
}

void RetroAttention::size_plan(int h, HeadPlan& plan) const {
  const int k = index_.heads[h].num_clusters();
  plan.logits.resize(static_cast<size_t>(group()) * k);
  plan.scores.resize(k);
}

void RetroAttention::select_head(int h, HeadPlan& plan) const {
  const index::HeadIndex& hi = index_.heads[h];
  const int k = hi.num_clusters();
  index::scores_from_logits(hi.sizes.data(), k, plan.logits.data(), group(), plan.scores.data());
  index::select_zones(plan.scores.data(), k, zone_counts(k, cfg_), plan.sel);
}

void RetroAttention::plan_head(int h, const float* qg, HeadPlan& plan) const {
  const index::HeadIndex& hi = index_.heads[h];
  size_plan(h, plan);
  index::cluster_logits_range(hi, qg, group(), effective_scale(cfg_.scale, shape_.head_dim), 0, hi.num_clusters(),
                              plan.logits.data());
  select_head(h, plan);
}

AttentionStats RetroAttention::decode(const KvCache& kv, const float* q, float* out) {
  RETROINFER_CHECK(q != nullptr && out != nullptr, "retro: decode with a null q or out");
  sync(kv);
  const int g = group();
  const int d = shape_.head_dim;
  const float sc = effective_scale(cfg_.scale, d);
  const int64_t size = kv.size();
  const int64_t steady_a = std::min(index_.indexed_begin, size);  // [0, steady_a)
  const int64_t steady_b = std::min(index_.indexed_end, size);    // [steady_b, size)
  const int64_t steady = steady_a + (size - steady_b);
  const int nh = shape_.num_heads_kv;
  // A head's work in kParts parts, in three parallel loops: the cluster logits by parts of the clusters, the
  // selection by heads (scores, zones, the exact token list), the attention by parts of the exact tokens and
  // of the estimated clusters. With whole heads as the unit, 3 KV heads (SmolLM2) on 2 threads left one thread
  // idle for a third of the layer. Each part's state is merged into its head's in part order, so the output
  // does not depend on the thread count.
  constexpr int kParts = 2;
  const int items = nh * kParts;
  // Heads in parallel from full attention's threshold (context tokens x KV heads, full.cpp): below it a layer's
  // retro work takes microseconds and, on a loaded host, the OpenMP barrier would cost more (perf: 96% of a
  // small-context test in libgomp's spin). Above it a serial layer would leave the product threads idle long
  // enough to fall asleep, and waking them at every product costs more than the heads' work.
  constexpr int64_t kParallelMinTokens = 2048;
  const bool parallel = size * nh >= kParallelMinTokens;
  std::vector<HeadPlan> plans(nh);
  std::vector<std::vector<int64_t>> tokens(nh);  // per head: outliers and retrieval members, in token order
  for (int h = 0; h < nh; ++h) size_plan(h, plans[h]);
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int w = 0; w < items; ++w) {
    const int h = w / kParts, p = w % kParts, k = index_.heads[h].num_clusters();
    index::cluster_logits_range(index_.heads[h], q + static_cast<size_t>(h) * g * d, g, sc, k * p / kParts,
                                k * (p + 1) / kParts, plans[h].logits.data());
  }
#pragma omp parallel for schedule(dynamic, 1) if (parallel && nh > 1)
  for (int h = 0; h < nh; ++h) {
    const index::HeadIndex& hi = index_.heads[h];
    HeadPlan& plan = plans[h];
    tokens[h] = hi.outliers;  // the outlier zone: always read exactly
    if (hi.num_clusters() == 0) continue;
    select_head(h, plan);
    // Retrieval zone: the members of the chosen clusters, read exactly in token order with the outliers.
    for (int32_t j : plan.sel.retrieval)
      tokens[h].insert(tokens[h].end(), hi.members.begin() + hi.offsets[j], hi.members.begin() + hi.offsets[j + 1]);
    std::sort(tokens[h].begin(), tokens[h].end());
  }
  // Part p of head h: p = 0 also the steady zone; each part a share of the exact tokens and of the estimation
  // zone (each cluster as s_j tokens of logit q.c_j and value VS_j / s_j), merged into one state.
  std::vector<GroupState> parts(static_cast<size_t>(items), GroupState(g, d));
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int w = 0; w < items; ++w) {
    const int h = w / kParts, p = w % kParts;
    const float* qg = q + static_cast<size_t>(h) * g * d;
    GroupState& part = parts[w];
    if (p == 0) {
      accumulate_range(kv, h, qg, sc, 0, steady_a, part);
      accumulate_range(kv, h, qg, sc, steady_b, size, part);
    }
    const auto n = static_cast<int64_t>(tokens[h].size());
    const int64_t t0 = n * p / kParts, t1 = n * (p + 1) / kParts;
    accumulate_tokens(kv, h, qg, sc, tokens[h].data() + t0, t1 - t0, part);
    const index::HeadIndex& hi = index_.heads[h];
    const std::vector<int32_t>& est_ids = plans[h].sel.estimation;
    const auto ne = static_cast<int>(est_ids.size());
    const int e0 = ne * p / kParts, e1 = ne * (p + 1) / kParts;
    if (e1 > e0) {
      GroupState est(g, d);
      accumulate_estimates(plans[h].logits.data(), hi.num_clusters(), est_ids.data() + e0, e1 - e0, hi.sizes.data(),
                           hi.value_sums.data(), est);
      part.merge(est);
    }
  }
  AttentionStats s;
  for (int h = 0; h < nh; ++h) {
    GroupState& head = parts[static_cast<size_t>(h) * kParts];
    for (int p = 1; p < kParts; ++p) head.merge(parts[static_cast<size_t>(h) * kParts + p]);
    head.finish(out + static_cast<size_t>(h) * g * d);
    s.exact_tokens += steady + static_cast<int64_t>(tokens[h].size());
    s.retrieved_clusters += static_cast<int64_t>(plans[h].sel.retrieval.size());
    s.estimated_clusters += static_cast<int64_t>(plans[h].sel.estimation.size());
    last_sel_[h] = std::move(plans[h].sel);
  }
  last_size_ = size;
  last_steady_a_ = steady_a;
  last_steady_b_ = steady_b;
  if (trace_ != nullptr) record_selection(size);
  ++steps_since_build_;
  s.context_tokens = size * nh;
  return s;
}

void RetroAttention::record_selection(int64_t size) {
  ClusterTraceRecord r;
  r.step = static_cast<int32_t>(steps_since_build_);
  r.layer = trace_layer_;
  r.context_tokens = size;
  for (int h = 0; h < shape_.num_heads_kv; ++h) {
    const index::HeadIndex& hi = index_.heads[h];
    r.head = h;
    r.num_clusters = hi.num_clusters();
    r.ids = last_sel_[h].retrieval;
    std::sort(r.ids.begin(), r.ids.end());
    r.sizes.resize(r.ids.size());
    for (size_t j = 0; j < r.ids.size(); ++j) r.sizes[j] = hi.sizes[r.ids[j]];
    trace_->write(r);
  }
}

template <typename Code>
void RetroAttention::fill_zones(int h, int64_t size, int64_t steady_a, int64_t steady_b,
                                const index::ZoneSelection& sel, const Code (&zone_code)[5], Code* zones) const {
  std::fill(zones, zones + size, zone_code[static_cast<int>(index::Zone::kIgnored)]);
  std::fill(zones, zones + steady_a, zone_code[static_cast<int>(index::Zone::kSteady)]);
  std::fill(zones + steady_b, zones + size, zone_code[static_cast<int>(index::Zone::kSteady)]);
  const index::HeadIndex& hi = index_.heads[h];
  auto mark = [&](const std::vector<int32_t>& ids, index::Zone zone) {
    const Code code = zone_code[static_cast<int>(zone)];
    for (int32_t j : ids)
      for (int64_t m = hi.offsets[j]; m < hi.offsets[j + 1]; ++m) zones[hi.members[m]] = code;
  };
  mark(sel.retrieval, index::Zone::kRetrieval);
  mark(sel.estimation, index::Zone::kEstimation);
  const Code outlier = zone_code[static_cast<int>(index::Zone::kOutlier)];
  for (int64_t t : hi.outliers) zones[t] = outlier;
}

void RetroAttention::zones(const KvCache& kv, const float* q, std::vector<index::Zone>& zones) {
  RETROINFER_CHECK(q != nullptr, "retro: zones with a null q");
  sync(kv);
  const int64_t size = kv.size();
  const int64_t steady_a = std::min(index_.indexed_begin, size);
  const int64_t steady_b = std::min(index_.indexed_end, size);
  zones.resize(static_cast<size_t>(shape_.num_heads_kv) * size);
  static constexpr index::Zone kIdentity[5] = {index::Zone::kSteady, index::Zone::kRetrieval,
                                               index::Zone::kEstimation, index::Zone::kIgnored,
                                               index::Zone::kOutlier};
  for (int h = 0; h < shape_.num_heads_kv; ++h) {
    HeadPlan plan;
    if (index_.heads[h].num_clusters() > 0) plan_head(h, q + static_cast<size_t>(h) * group() * shape_.head_dim, plan);
    fill_zones(h, size, steady_a, steady_b, plan.sel, kIdentity, zones.data() + static_cast<int64_t>(h) * size);
  }
}

bool RetroAttention::last_zones(int kvh, std::vector<uint8_t>& zones) const {
  if (last_size_ < 0 || kvh < 0 || kvh >= shape_.num_heads_kv) return false;
  static constexpr uint8_t kCodes[5] = {kZoneExact, kZoneExact, kZoneEstimated, kZoneIgnored, kZoneExact};
  zones.resize(static_cast<size_t>(last_size_));
  fill_zones(kvh, last_size_, last_steady_a_, last_steady_b_, last_sel_[kvh], kCodes, zones.data());
  return true;
}

std::unique_ptr<AttentionMethod> make_retro(const AttentionConfig& cfg, const AttentionShape& shape) {
  return std::make_unique<RetroAttention>(cfg, shape);
}

}  // namespace retroinfer::attention
