// `retroinfer eval needle`: where retro's zones put a needle's tokens (see needle_probe.h).
#include "eval/needle_probe.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>

#include "attention/retro.h"
#include "core/dot.h"
#include "retroinfer/attention.h"
#include "retroinfer/error.h"

namespace retroinfer::eval {

void attention_probs(const KvCache& kv, int kvh, const float* qg, int group, float scale, std::vector<float>& out) {
  RETROINFER_CHECK(kvh >= 0 && kvh < kv.num_heads_kv() && group > 0 && qg != nullptr,
                   "attention_probs: bad KV head ", kvh, " or group ", group);
  const int64_t n = kv.size();
  const int d = kv.head_dim();
  out.resize(static_cast<size_t>(group) * n);
  for (int g = 0; g < group; ++g) {
    float* p = out.data() + static_cast<int64_t>(g) * n;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t t = 0; t < n; ++t) {
      p[t] = kv.dot_key(kvh, t, qg + static_cast<int64_t>(g) * d) * scale;
      m = std::max(m, p[t]);
    }
    double sum = 0.0;
    for (int64_t t = 0; t < n; ++t) {
      p[t] = std::exp(p[t] - m);
      sum += p[t];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t t = 0; t < n; ++t) p[t] *= inv;
  }
}

HeadCoverage& HeadCoverage::operator+=(const HeadCoverage& o) {
  needle += o.needle;
  in_oracle += o.in_oracle;
  in_oracle_retro += o.in_oracle_retro;
  in_retro += o.in_retro;
  in_retro_est += o.in_retro_est;
  needle_mass += o.needle_mass;
  mass_oracle += o.mass_oracle;
  mass_retro += o.mass_retro;
  mass_retro_est += o.mass_retro_est;
  return *this;
}

HeadCoverage head_coverage(std::span<const float> probs, int group, std::span<const int64_t> needle,
                           std::span<const uint8_t> oracle_zones, std::span<const uint8_t> retro_zones) {
  const int64_t n = static_cast<int64_t>(oracle_zones.size());
  RETROINFER_CHECK(group > 0 && static_cast<int64_t>(retro_zones.size()) == n &&
                       static_cast<int64_t>(probs.size()) == group * n,
                   "head_coverage: probs hold ", probs.size(), " values for group ", group, " and zones of ",
                   oracle_zones.size(), " / ", retro_zones.size(), " tokens; they must agree");
  constexpr uint8_t kExact = AttentionMethod::kZoneExact, kEst = AttentionMethod::kZoneEstimated;
  HeadCoverage c;
  std::vector<double> mass(n, 0.0);  // [size] mean probability over the group
  for (int g = 0; g < group; ++g)
    for (int64_t t = 0; t < n; ++t) mass[t] += probs[static_cast<size_t>(g * n + t)] / group;
  for (int64_t t = 0; t < n; ++t) {
    if (oracle_zones[t] == kExact) c.mass_oracle += mass[t];
    if (retro_zones[t] == kExact) c.mass_retro += mass[t];
    if (retro_zones[t] == kEst) c.mass_retro_est += mass[t];
  }
  for (int64_t t : needle) {
    RETROINFER_CHECK(t >= 0 && t < n, "head_coverage: needle token ", t, " outside the ", n, " cached tokens");
    ++c.needle;
    c.needle_mass += mass[t];
    const bool o = oracle_zones[t] == kExact, r = retro_zones[t] == kExact;
    c.in_oracle += o;
    c.in_retro += r;
    c.in_oracle_retro += o && r;
    c.in_retro_est += retro_zones[t] == kEst;
  }
  return c;
}

std::vector<ClusterRank> cluster_ranks(const index::HeadIndex& hi, const KvCache& kv, int kvh, const float* qg,
                                       int group, float scale, std::span<const int64_t> tokens) {
  const int k = hi.num_clusters();
  const int d = hi.head_dim;
  std::vector<float> logits(static_cast<size_t>(group) * k), scores(k);  // [group, k], [k]
  if (k > 0) index::score_clusters(hi, qg, group, scale, logits.data(), scores.data());
  // Max over the group of each head's softmax probability of the cluster.
  std::vector<float> smax(k, -std::numeric_limits<float>::infinity());
  for (int g = 0; g < group; ++g) {
    const float* lg = logits.data() + static_cast<int64_t>(g) * k;
    float m = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < k; ++j)
      if (hi.sizes[j] > 0) m = std::max(m, lg[j]);
    double sum = 0.0;
    for (int j = 0; j < k; ++j)
      if (hi.sizes[j] > 0) sum += std::exp(static_cast<double>(lg[j] - m));
    for (int j = 0; j < k; ++j)
      if (hi.sizes[j] > 0) smax[j] = std::max(smax[j], static_cast<float>(std::exp(static_cast<double>(lg[j] - m)) / sum));
  }
  std::vector<int32_t> owner(static_cast<size_t>(kv.size()), -1);  // [size] cluster of each token
  for (int j = 0; j < k; ++j)
    for (int64_t m = hi.offsets[j]; m < hi.offsets[j + 1]; ++m)
      if (hi.members[m] < kv.size()) owner[hi.members[m]] = j;
  auto rank = [&](const std::vector<float>& s, int j) {
    int32_t r = 0;
    for (int i = 0; i < k; ++i)
      if (hi.sizes[i] > 0 && (s[i] > s[j] || (s[i] == s[j] && i < j))) ++r;
    return r;
  };
  std::vector<float> key(d);
  std::vector<ClusterRank> out;
  for (int64_t t : tokens) {
    RETROINFER_CHECK(t >= 0 && t < kv.size(), "cluster_ranks: token ", t, " outside the ", kv.size(), " cached tokens");
    ClusterRank cr;
    const int j = owner[t];
    if (j >= 0) {
      cr.cluster = j;
      cr.size = hi.sizes[j];
      cr.rank_sum = rank(scores, j);
      cr.rank_max = rank(smax, j);
      kv.load_key(kvh, t, key.data());
      const float* c = hi.centroids.data() + static_cast<int64_t>(j) * d;
      float gap = -std::numeric_limits<float>::infinity();
      for (int g = 0; g < group; ++g) {
        const float* q = qg + static_cast<int64_t>(g) * d;
        gap = std::max(gap, (core::dot_f32(q, key.data(), d) - core::dot_f32(q, c, d)) * scale);
      }
      cr.centroid_gap = gap;
    }
    out.push_back(cr);
  }
  return out;
}

std::pair<int64_t, int64_t> token_span(const Tokenizer& tok, std::string_view prompt, size_t byte_begin,
                                       size_t byte_end) {
  RETROINFER_CHECK(byte_begin <= byte_end && byte_end <= prompt.size(), "token_span: bytes [", byte_begin, ", ",
                   byte_end, ") outside the ", prompt.size(), "-byte prompt");
  const auto count = [&](size_t b) { return static_cast<int64_t>(tok.encode(prompt.substr(0, b), false, true).size()); };
  return {count(byte_begin), count(byte_end)};
}

AttentionConfig retro_variant(const AttentionConfig& base, std::string_view spec) {
  AttentionConfig c = base;
  c.kind = AttentionKind::kRetro;
  size_t pos = 0;
  while (pos <= spec.size()) {
    const size_t end = std::min(spec.find(':', pos), spec.size());
    const std::string item(spec.substr(pos, end - pos));
    pos = end + 1;
    RETROINFER_CHECK(!item.empty(), "retro variant '", spec, "': empty item");
    if (item == "noest") {
      c.estimation = false;
      continue;
    }
    const std::string arg = item.substr(1);
    size_t used = 0;
    double x = 0.0;
    try {
      x = std::stod(arg, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    RETROINFER_CHECK(!arg.empty() && used == arg.size(), "retro variant '", spec, "': item '", item,
                     "' is not a letter and a number (c8, r0.036, e0.2, i9, g1, o0.001) or noest");
    const bool integral = x == std::floor(x) && x >= 0 && x < 1e9;
    switch (item[0]) {
      case 'c': case 'i': case 'g':
        RETROINFER_CHECK(integral, "retro variant '", spec, "': '", item, "' needs a whole number");
        (item[0] == 'c' ? c.tokens_per_cluster : item[0] == 'i' ? c.kmeans_segment_iters : c.kmeans_global_iters) =
            static_cast<int>(x);
        break;
      case 'r': c.retrieval_fraction = x; break;
      case 'e': c.estimation_fraction = x; break;
      case 'o': c.outlier_fraction = x; break;
      default: RETROINFER_FAIL("retro variant '", spec, "': unknown item '", item, "'");
    }
  }
  validate(c);
  return c;
}

namespace {

int32_t argmax(std::span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

double log_prob(std::span<const float> logits, int32_t id) {
  const float m = *std::max_element(logits.begin(), logits.end());
  double s = 0.0;
  for (float x : logits) s += std::exp(static_cast<double>(x - m));
  return static_cast<double>(logits[id] - m) - std::log(s);
}

// Teacher-forces answer through a fork of base with cfg: (steps whose argmax is the next answer token, NLL
// of answer[1..]). logits: scratch [vocab].
std::pair<int64_t, double> teacher_force(const Session& base, const AttentionConfig& cfg,
                                         const std::vector<int32_t>& answer, std::vector<float>& logits) {
  std::unique_ptr<Session> f = base.fork(cfg);
  int64_t agree = 0;
  double nll = 0.0;
  for (size_t i = 0; i + 1 < answer.size(); ++i) {
    f->decode(answer[i], logits);
    nll -= log_prob(logits, answer[i + 1]);
    agree += argmax(logits) == answer[i + 1];
  }
  return {agree, nll};
}

float default_scale(const AttentionConfig& c, int head_dim) {
  return c.scale > 0.0f ? c.scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

// Accumulators of one retro variant over samples, steps, layers and KV heads.
struct VariantAcc {
  std::string spec;
  AttentionConfig cfg;
  HeadCoverage total;
  std::vector<HeadCoverage> per_layer;  // [num_layers]
  // Needle tokens the oracle reads exactly and retro does not.
  int64_t missed = 0, missed_est = 0, missed_ret_by_max = 0;
  double missed_size = 0.0, missed_rank = 0.0, missed_rank_max = 0.0, missed_gap = 0.0;
  int64_t missed_clustered = 0;
  // Retrieval budget (clusters) and the mean size of the clusters retrieved.
  double n_retrieval = 0.0, retrieved_cluster_size = 0.0, clusters = 0.0;
  int64_t head_steps = 0;
  double max_out_diff = 0.0;  // the probe's own retro instance against the session's (must be ~0)
  nlohmann::json samples = nlohmann::json::array();
};

nlohmann::json coverage_json(const HeadCoverage& c, double head_steps) {
  const double hs = std::max(head_steps, 1.0);
  return {{"needle_tokens", c.needle},
          {"in_oracle", c.in_oracle},
          {"in_oracle_and_retro", c.in_oracle_retro},
          {"in_retro_exact", c.in_retro},
          {"in_retro_estimation", c.in_retro_est},
          {"recall_of_oracle_needle", c.in_oracle > 0 ? static_cast<double>(c.in_oracle_retro) / c.in_oracle : 0.0},
          {"needle_mass", c.needle_mass / hs},
          {"mass_oracle_exact", c.mass_oracle / hs},
          {"mass_retro_exact", c.mass_retro / hs},
          {"mass_retro_estimation", c.mass_retro_est / hs}};
}

// What one probed sample gives every variant: the prompt's KV (in `base`), the needle's tokens and full
// attention's greedy answer, which the variants are teacher-forced to predict.
struct ProbeSample {
  std::vector<int64_t> needle;    // token positions of the needle's value
  std::vector<int32_t> answer;    // full's greedy tokens (answer[0] from the prefill)
  double full_nll = 0.0;          // full's NLL of answer[1..]
};

// Full attention's greedy answer from base's prefill logits, stopped at an end token, max_steps, or once every
// reference is in the text; records the sample's summary into `samples`.
ProbeSample full_answer(const Session& base, const Tokenizer& tok, const TaskSample& s, const NeedleProbeOptions& opt,
                        std::vector<float>& logits, int64_t nb, int64_t ne, size_t prompt_tokens, int idx,
                        nlohmann::json& samples, const std::function<void(const std::string&)>& say) {
  ProbeSample ps;
  for (int64_t t = nb; t < ne; ++t) ps.needle.push_back(t);
  auto has_all = [&](const std::string& text) {
    return std::all_of(s.references.begin(), s.references.end(),
                       [&](const std::string& r) { return text.find(r) != std::string::npos; });
  };
  ps.answer = {argmax(logits)};
  AttentionConfig full_cfg = opt.attention;
  full_cfg.kind = AttentionKind::kFull;
  std::unique_ptr<Session> full = base.fork(full_cfg);
  std::string text;
  for (int i = 0; i + 1 < opt.max_steps && !tok.is_eog(ps.answer.back()); ++i) {
    text = tok.decode(ps.answer, true);
    if (has_all(text)) break;
    full->decode(ps.answer.back(), logits);
    ps.answer.push_back(argmax(logits));
    ps.full_nll -= log_prob(logits, ps.answer.back());
  }
  full.reset();
  text = tok.decode(ps.answer, true);
  const bool full_correct = has_all(text);
  say("eval needle: sample " + std::to_string(idx) + " (" + std::to_string(prompt_tokens) + " tokens, needle tokens [" +
      std::to_string(nb) + ", " + std::to_string(ne) + ")): full answers '" + text + "'" +
      (full_correct ? " (correct)" : " (wrong)"));
  // The oracle end to end (at retro's default-budget token count), teacher-forced the same way.
  AttentionConfig oracle_cfg = opt.attention;
  oracle_cfg.kind = AttentionKind::kOracle;
  const auto [oracle_agree, oracle_nll] = teacher_force(base, oracle_cfg, ps.answer, logits);
  samples.push_back({{"index", idx}, {"oracle_top1_agree", oracle_agree}, {"oracle_answer_nll", oracle_nll},
                     {"full_answer_nll", ps.full_nll}, {"prompt_tokens", prompt_tokens}, {"depth", s.depth},
                     {"needle_begin", nb}, {"needle_end", ne}, {"reference", s.references[0]}, {"full_output", text},
                     {"full_correct", full_correct}, {"answer_tokens", ps.answer.size()}});
  return ps;
}

// The model's shape as the probe reads it.
struct ProbeShape {
  AttentionShape shape;
  int num_layers = 0, group = 0, d = 0;
  float scale = 0.0f;
};

// Zones of one decode step of one layer: the needle's coverage by the probe's retro and oracle per KV head,
// and the rank of each needle token the oracle reads exactly and retro misses.
void observe_layer(VariantAcc& va, const ProbeShape& ps, attention::RetroAttention& retro, AttentionMethod& oracle,
                   int layer, const KvCache& kv, const float* q, const float* out, std::span<const int64_t> needle,
                   std::vector<float>& tmp) {
  std::vector<float> probs;
  std::vector<uint8_t> oz, rz;
  retro.decode(kv, q, tmp.data());
  for (size_t i = 0; i < tmp.size(); ++i)
    va.max_out_diff = std::max(va.max_out_diff, static_cast<double>(std::fabs(tmp[i] - out[i])));
  oracle.decode(kv, q, tmp.data());
  const index::WaveIndex& wi = retro.wave_index();
  for (int h = 0; h < ps.shape.num_heads_kv; ++h) {
    const float* qg = q + static_cast<size_t>(h) * ps.group * ps.d;
    retro.last_zones(h, rz);
    oracle.last_zones(h, oz);
    attention_probs(kv, h, qg, ps.group, ps.scale, probs);
    const HeadCoverage c = head_coverage(probs, ps.group, needle, oz, rz);
    va.total += c;
    va.per_layer[layer] += c;
    ++va.head_steps;
    const index::HeadIndex& hi = wi.heads[h];
    const ZoneCounts b = zone_counts(hi.num_clusters(), va.cfg);
    va.n_retrieval += b.n_retrieval;
    va.clusters += hi.num_clusters();
    std::vector<int64_t> missed;
    for (int64_t t : needle)
      if (oz[t] == AttentionMethod::kZoneExact && rz[t] != AttentionMethod::kZoneExact) missed.push_back(t);
    if (missed.empty()) continue;
    const std::vector<ClusterRank> ranks = cluster_ranks(hi, kv, h, qg, ps.group, ps.scale, missed);
    for (size_t i = 0; i < missed.size(); ++i) {
      ++va.missed;
      va.missed_est += rz[missed[i]] == AttentionMethod::kZoneEstimated;
      if (ranks[i].cluster < 0) continue;
      ++va.missed_clustered;
      va.missed_size += ranks[i].size;
      va.missed_rank += ranks[i].rank_sum;
      va.missed_rank_max += ranks[i].rank_max;
      va.missed_gap += ranks[i].centroid_gap;
      va.missed_ret_by_max += ranks[i].rank_max < b.n_retrieval;
    }
  }
}

// Mean size of the clusters retro retrieves at the last step, over layers and heads.
double retrieved_cluster_size(const std::vector<std::unique_ptr<attention::RetroAttention>>& retro, int num_heads_kv) {
  double rsize = 0.0, rcount = 0.0;
  std::vector<uint8_t> rz;
  for (const auto& r : retro)
    for (int h = 0; h < num_heads_kv; ++h) {
      r->last_zones(h, rz);
      const index::HeadIndex& hi = r->wave_index().heads[h];
      // Members are never steady or outliers, so a cluster with an exact member is a retrieved one.
      for (int j = 0; j < hi.num_clusters(); ++j)
        if (hi.sizes[j] > 0 && rz[hi.members[hi.offsets[j]]] == AttentionMethod::kZoneExact) {
          rsize += hi.sizes[j];
          rcount += 1.0;
        }
    }
  return rcount > 0 ? rsize / rcount : 0.0;
}

// One variant on one sample: a fork of base with the variant's config, teacher-forced through full's answer,
// with the probe's own retro and oracle per layer (built on the same prompt KV as the fork's, so the index is the
// same) decoding the fork's queries to read their zones.
void probe_variant(VariantAcc& va, const Session& base, const ProbeShape& ps, const ProbeSample& sample, int idx,
                   std::vector<float>& logits, const std::function<void(const std::string&)>& say) {
  AttentionConfig oc = va.cfg;
  oc.kind = AttentionKind::kOracle;
  std::unique_ptr<Session> f = base.fork(va.cfg);
  std::vector<std::unique_ptr<attention::RetroAttention>> retro;
  std::vector<std::unique_ptr<AttentionMethod>> oracle;
  for (int l = 0; l < ps.num_layers; ++l) {
    retro.push_back(std::make_unique<attention::RetroAttention>(va.cfg, ps.shape));
    retro.back()->on_prefill(base.kv(l));
    oracle.push_back(make_attention(oc, ps.shape));
  }
  std::vector<float> tmp(static_cast<size_t>(ps.shape.num_heads_q) * ps.d);
  f->set_attention_observer([&](int layer, const KvCache& kv, const float* q, const float* out) {
    observe_layer(va, ps, *retro[layer], *oracle[layer], layer, kv, q, out, sample.needle, tmp);
  });
  int64_t agree = 0;
  double nll = 0.0;
  const int64_t steps = static_cast<int64_t>(sample.answer.size()) - 1;
  for (int64_t i = 0; i < steps; ++i) {
    f->decode(sample.answer[i], logits);
    nll -= log_prob(logits, sample.answer[i + 1]);
    agree += argmax(logits) == sample.answer[i + 1];
  }
  va.retrieved_cluster_size += retrieved_cluster_size(retro, ps.shape.num_heads_kv);
  say("eval needle: sample " + std::to_string(idx) + " retro " + va.spec + ": top-1 agreement " +
      std::to_string(agree) + "/" + std::to_string(steps) + ", answer NLL " + std::to_string(nll) + " (full " +
      std::to_string(sample.full_nll) + ")");
  va.samples.push_back({{"index", idx}, {"steps", steps}, {"top1_agree", agree}, {"answer_nll", nll},
                        {"full_answer_nll", sample.full_nll}, {"all_agree", agree == steps}});
}

nlohmann::json variant_json(const VariantAcc& va, int num_layers) {
  const double hs = static_cast<double>(va.head_steps);
  const double hl = hs / std::max(1, num_layers);
  nlohmann::json layers = nlohmann::json::array();
  for (int l = 0; l < num_layers; ++l) layers.push_back(coverage_json(va.per_layer[l], hl));
  const double mc = std::max<double>(1.0, static_cast<double>(va.missed_clustered));
  return {{"variant", va.spec},
          {"tokens_per_cluster", va.cfg.tokens_per_cluster},
          {"retrieval_fraction", va.cfg.retrieval_fraction},
          {"estimation", va.cfg.estimation},
          {"coverage", coverage_json(va.total, hs)},
          {"per_layer", layers},
          {"missed", {{"tokens", va.missed},
                      {"in_estimation", va.missed_est},
                      {"clustered", va.missed_clustered},
                      {"mean_cluster_size", va.missed_size / mc},
                      {"mean_rank_sum", va.missed_rank / mc},
                      {"mean_rank_max", va.missed_rank_max / mc},
                      {"retrieved_if_max_over_group", va.missed_ret_by_max},
                      {"mean_centroid_gap_logit", va.missed_gap / mc}}},
          {"mean_clusters_per_head", va.clusters / std::max(hs, 1.0)},
          {"mean_n_retrieval", va.n_retrieval / std::max(hs, 1.0)},
          {"mean_retrieved_cluster_size",
           va.retrieved_cluster_size / std::max<double>(1.0, static_cast<double>(va.samples.size()))},
          {"max_abs_diff_vs_session", va.max_out_diff},
          {"samples", va.samples}};
}

}  // namespace

nlohmann::json run_needle_probe(const Model& model, const Tokenizer& tok, const TaskGenerator& gen,
                                const NeedleProbeOptions& opt) {
  RETROINFER_CHECK(!opt.variants.empty() && !opt.samples.empty() && opt.max_steps > 0,
                   "eval needle: give at least one sample, one --variants item and --max-steps > 0");
  const ModelConfig& mc = model.config();
  ProbeShape ps;
  ps.shape = AttentionShape{mc.num_heads_q, mc.num_heads_kv, mc.head_dim};
  ps.num_layers = mc.num_layers;
  ps.group = mc.num_heads_q / mc.num_heads_kv;
  ps.d = mc.head_dim;
  ps.scale = default_scale(opt.attention, ps.d);
  auto say = [&](const std::string& s) {
    if (opt.progress) opt.progress(s);
  };
  std::vector<VariantAcc> acc(opt.variants.size());
  for (size_t v = 0; v < acc.size(); ++v) {
    acc[v].spec = opt.variants[v];
    acc[v].cfg = retro_variant(opt.attention, opt.variants[v]);
    acc[v].per_layer.assign(mc.num_layers, HeadCoverage{});
  }
  nlohmann::json samples = nlohmann::json::array();
  for (int idx : opt.samples) {
    const TaskSample s = gen.make(opt.task, opt.context, idx);
    RETROINFER_CHECK(!s.references.empty() && !s.needle_offsets.empty(), "eval needle: task ", opt.task,
                     " has no needle to probe (use a niah task)");
    const std::vector<int32_t> ids = tok.encode(s.prompt, false, true);
    const std::string& value = s.references[0];
    const size_t vb = s.prompt.find(value, s.needle_offsets[0]);
    RETROINFER_CHECK(vb != std::string::npos, "eval needle: the reference '", value, "' is not in the prompt after ",
                     "the needle's offset (sample ", idx, ")");
    const auto [nb, ne] = token_span(tok, s.prompt, vb, vb + value.size());

    SessionOptions so;
    so.attention = opt.attention;
    so.attention.kind = AttentionKind::kFull;
    so.kv_dtype = opt.kv_dtype;
    so.prefill_chunk = opt.prefill_chunk;
    so.max_context = static_cast<int64_t>(ids.size()) + opt.max_steps + 1;
    Session base(model, so);
    std::vector<float> logits = base.prefill(ids);
    const ProbeSample sample = full_answer(base, tok, s, opt, logits, nb, ne, ids.size(), idx, samples, say);
    for (VariantAcc& va : acc) probe_variant(va, base, ps, sample, idx, logits, say);
  }
  nlohmann::json variants = nlohmann::json::array();
  for (const VariantAcc& va : acc) variants.push_back(variant_json(va, mc.num_layers));
  return {{"task", opt.task}, {"context", opt.context}, {"samples", samples}, {"variants", variants}};
}

}  // namespace retroinfer::eval
