#include "eval/ppl_fidelity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>

#include "engine/kv_placement_json.h"
#include "eval/eval_runner.h"
#include "retroinfer/error.h"
#include "retroinfer/sampler.h"

namespace retroinfer::eval {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// log-softmax in double. logits: [vocab].
std::vector<double> log_softmax(std::span<const float> logits) {
  double mx = -INFINITY;
  for (float x : logits) mx = std::max(mx, static_cast<double>(x));
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<double>(logits[i]) - lse;
  return out;
}

// KL(p || q) from log-probabilities.
double kl(const std::vector<double>& lp, const std::vector<double>& lq) {
  double s = 0;
  for (size_t i = 0; i < lp.size(); ++i) s += std::exp(lp[i]) * (lp[i] - lq[i]);
  return std::max(0.0, s);  // rounding can leave a tiny negative for identical distributions
}

}  // namespace

void validate(const PplOptions& o) {
  RETROINFER_CHECK(o.prefix_tokens >= 1, "eval ppl: prefix tokens must be >= 1, got ", o.prefix_tokens);
  RETROINFER_CHECK(o.forced_tokens >= 1, "eval ppl: forced tokens must be >= 1, got ", o.forced_tokens);
  RETROINFER_CHECK(o.windows >= 1, "eval ppl: windows must be >= 1, got ", o.windows);
  RETROINFER_CHECK(!o.methods.empty(), "eval ppl: no methods");
  RETROINFER_CHECK(o.time_budget_s >= 0, "eval ppl: the time budget must be >= 0 seconds (0 = none), got ",
                   o.time_budget_s);
  for (const auto& m : o.methods) {
    validate(method_config(m, o.attention));
    method_kv_dtype(m, o.kv_dtype);
  }
  validate_baseline_budget(o.baseline_budget, o.methods, o.attention, "eval ppl");
}

PplReport run_ppl_fidelity(const EngineModel& model, std::span<const int32_t> text, const PplOptions& opt) {
  validate(opt);
  const ModelConfig& c = model.config();
  const int64_t P = opt.prefix_tokens, T = opt.forced_tokens, span_len = P + T + 1;
  RETROINFER_CHECK(static_cast<int64_t>(text.size()) >= opt.windows * span_len, "eval ppl: the text has ",
                   text.size(), " tokens; ", opt.windows, " windows of ", P, " + ", T, " + 1 need ",
                   opt.windows * span_len, "; use more text or fewer/shorter windows");
  std::vector<std::string> methods{"full"};
  const bool matched = opt.baseline_budget == BaselineBudget::kMatched;
  for (const auto& m : matched ? matched_order(opt.methods) : opt.methods)
    if (std::find(methods.begin(), methods.end(), m) == methods.end()) methods.push_back(m);

  PplReport rep;
  rep.options = opt;
  rep.device = std::string(device_name(model.device()));
  rep.attention_error_measured = model.device() == Device::kCpu;
  rep.text_tokens = static_cast<int64_t>(text.size());
  std::vector<PplMethodResult> res(methods.size());
  std::vector<double> nll_diff_sq(methods.size(), 0.0);  // per method: sum of squared per-token NLL differences vs full
  std::vector<int> budget_windows(methods.size(), 0);  // per method: windows whose session calibrated its budgets
  for (size_t i = 0; i < methods.size(); ++i) {
    res[i].method = methods[i];
    res[i].kv_dtype = method_kv_dtype(methods[i], opt.kv_dtype);
    if (rep.attention_error_measured) res[i].layer_rel_err.assign(c.num_layers, 0.0);
  }
  const AttentionShape shape{c.num_heads_q, c.num_heads_kv, c.head_dim};
  AttentionConfig full_cfg = method_config("full", opt.attention);
  const int64_t vocab = c.vocab_size, width = static_cast<int64_t>(c.num_heads_q) * c.head_dim;

  const auto t_run = std::chrono::steady_clock::now();
  double slowest_window_s = 0;
  for (int w = 0; w < opt.windows; ++w) {
    if (opt.time_budget_s > 0 && w > 0 && seconds_since(t_run) + slowest_window_s > opt.time_budget_s) {
      if (opt.progress) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "time budget of %.0f s spent: %d of %d windows run", opt.time_budget_s, w,
                      opt.windows);
        opt.progress(buf);
      }
      break;
    }
    const auto t_window = std::chrono::steady_clock::now();
    const std::span<const int32_t> win = text.subspan(w * span_len, span_len);
    SessionOptions so;
    so.attention = full_cfg;
    so.kv_dtype = opt.kv_dtype;
    so.prefill_chunk = opt.prefill_chunk;
    so.max_context = P + T;
    so.exact_attention_stats = true;  // exact-token column and matched budgets (forks inherit it)
    so.kv_placement = method_kv_placement(opt.kv_placement, AttentionKind::kFull);
    const std::unique_ptr<SequenceSession> base = make_session(model, so);
    const auto t0 = std::chrono::steady_clock::now();
    base->prefill(win.first(P));
    rep.prefill_seconds += seconds_since(t0);
    std::vector<std::vector<double>> ref_lp(T);  // full's log-probabilities per step
    std::vector<double> ref_nll(T);                // full's NLL of the forced token per step
    double retro_exact = -1.0;                   // retro's exact tokens per head and step in this window
    for (size_t mi = 0; mi < methods.size(); ++mi) {
      PplMethodResult& r = res[mi];
      const auto t1 = std::chrono::steady_clock::now();
      AttentionConfig cfg = method_config(methods[mi], opt.attention);
      if (matched && budgeted_baseline(methods[mi])) {
        cfg.budget_tokens = matched_budget_tokens(retro_exact, cfg);  // retro ran before (matched_order)
        r.budget_tokens = (r.budget_tokens < 0 ? 0.0 : r.budget_tokens) + static_cast<double>(cfg.budget_tokens);
      }
      const double exact_before = r.exact_tokens_per_head;
      std::unique_ptr<SequenceSession> s;
      if (prefills_alone(opt.kv_placement, cfg.kind) || r.kv_dtype != opt.kv_dtype) {
        // A host-tier session cannot be forked from the GPU prefill, nor a KV cache of another dtype from the
        // reference's: it prefills the prefix itself.
        SessionOptions own = so;
        own.attention = cfg;
        own.kv_dtype = r.kv_dtype;
        own.kv_placement = method_kv_placement(opt.kv_placement, cfg.kind);
        s = make_session(model, own);
        s->prefill(win.first(P));
      } else {
        s = base->fork_session(cfg);
      }
      // Exact attention on the method's own inputs, per layer (full keeps no state between calls); the
      // observer exists on the CPU runner only.
      std::vector<std::unique_ptr<AttentionMethod>> exact;
      std::vector<float> ref(width);
      if (auto* cpu = dynamic_cast<Session*>(s.get()); cpu && rep.attention_error_measured) {
        for (int l = 0; l < c.num_layers; ++l) exact.push_back(make_attention(full_cfg, shape));
        cpu->set_attention_observer([&](int layer, const KvCache& kv, const float* q, const float* out) {
          exact[layer]->decode(kv, q, ref.data());
          double num = 0, den = 0;
          for (int64_t i = 0; i < width; ++i) {
            const double d = static_cast<double>(out[i]) - ref[i];
            num += d * d;
            den += static_cast<double>(ref[i]) * ref[i];
          }
          r.layer_rel_err[layer] += den > 0 ? std::sqrt(num / den) : 0.0;
        });
      }
      if (const std::vector<double> lm = s->layer_budget_multipliers(); !lm.empty()) {
        if (r.layer_budget_multipliers.empty()) r.layer_budget_multipliers.assign(lm.size(), 0.0);
        for (size_t l = 0; l < lm.size() && l < r.layer_budget_multipliers.size(); ++l)
          r.layer_budget_multipliers[l] += lm[l];
        ++budget_windows[mi];
      }
      std::vector<float> logits(vocab);
      for (int64_t t = 0; t < T; ++t) {
        s->decode(win[P + t], logits);
        const std::vector<double> lp = log_softmax(logits);
        const double nll = -lp[win[P + t + 1]];
        r.nll += nll;
        if (mi == 0) ref_nll[t] = nll;
        nll_diff_sq[mi] += (nll - ref_nll[t]) * (nll - ref_nll[t]);
        r.exact_tokens_per_head += static_cast<double>(s->last_stats().exact_tokens);
        r.context_tokens_per_head += static_cast<double>(s->last_stats().context_tokens);
        if (mi == 0) {
          ref_lp[t] = lp;
          r.top1_agreement += 1.0;
        } else {
          const double k = kl(ref_lp[t], lp);
          r.kl_mean += k;
          r.kl_max = std::max(r.kl_max, k);
          const auto am = [](const std::vector<double>& v) { return std::max_element(v.begin(), v.end()) - v.begin(); };
          r.top1_agreement += am(lp) == am(ref_lp[t]) ? 1.0 : 0.0;
        }
        ++r.steps;
      }
      r.seconds += seconds_since(t1);
      if (const std::optional<KvPlacementReport> kv = s->kv_placement_report()) {
        r.kv_placement = std::string(buffer::kv_placement_name(kv->placement));
        r.host_layers = kv->host_layers;
        r.host_store = std::string(store_dtype_name(kv->host_store));
        r.cache_hits += kv->cache_hits;
        r.cache_misses += kv->cache_misses;
        r.pcie_bytes += kv->pcie_bytes;
      }
      if (methods[mi] == "retro")
        retro_exact = (r.exact_tokens_per_head - exact_before) / (static_cast<double>(T) * c.num_layers * c.num_heads_kv);
      if (opt.progress) {
        char buf[192];
        std::snprintf(buf, sizeof buf, "window %d/%d: %s done (%.1f s)", w + 1, opt.windows, methods[mi].c_str(),
                      seconds_since(t1));
        opt.progress(buf);
      }
    }
    ++rep.windows_run;
    slowest_window_s = std::max(slowest_window_s, seconds_since(t_window));
  }
  for (auto& r : res) {
    const double n = static_cast<double>(r.steps);
    r.nll /= n;
    r.ppl = std::exp(r.nll);
    r.kl_mean /= n;
    r.top1_agreement /= n;
    for (double& e : r.layer_rel_err) e /= n;  // empty when not measured
    const int bw = budget_windows[&r - res.data()];
    for (double& m : r.layer_budget_multipliers) m /= std::max(bw, 1);
    const double heads = n * c.num_layers * c.num_heads_kv;
    r.exact_tokens_per_head /= heads;
    if (r.budget_tokens >= 0 && rep.windows_run > 0) r.budget_tokens /= rep.windows_run;
    r.context_tokens_per_head /= heads;
  }
  for (size_t mi = 0; mi < res.size(); ++mi) {
    PplMethodResult& r = res[mi];
    r.ppl_rel_diff = r.ppl / res[0].ppl - 1.0;
    const double n = static_cast<double>(r.steps), mean_diff = r.nll - res[0].nll;
    const double var = n > 1 ? std::max(0.0, (nll_diff_sq[mi] - n * mean_diff * mean_diff) / (n - 1)) : 0.0;
    r.ppl_rel_diff_se = (1.0 + r.ppl_rel_diff) * std::sqrt(var / std::max(n, 1.0));
  }
  rep.methods = std::move(res);
  return rep;
}

nlohmann::json to_json(const PplReport& r) {
  nlohmann::json j;
  j["prefix_tokens"] = r.options.prefix_tokens;
  j["forced_tokens"] = r.options.forced_tokens;
  j["windows"] = r.options.windows;
  j["windows_run"] = r.windows_run;
  j["text_tokens"] = r.text_tokens;
  j["prefill_s"] = r.prefill_seconds;
  j["device"] = r.device;
  j["kv_dtype"] = std::string(dtype_name(r.options.kv_dtype));
  j["attention_error_measured"] = r.attention_error_measured;
  if (!r.attention_error_measured)
    j["attention_error_note"] = "per-layer attention error (layer_rel_err) needs the CPU runner's attention "
                                "observer; not measured on " + r.device;
  j["methods"] = nlohmann::json::array();
  for (const auto& m : r.methods)
    j["methods"].push_back({{"method", m.method}, {"steps", m.steps}, {"nll", m.nll}, {"ppl", m.ppl},
                            {"ppl_rel_diff", m.ppl_rel_diff}, {"ppl_rel_diff_se", m.ppl_rel_diff_se},
                            {"kl_mean", m.kl_mean}, {"kl_max", m.kl_max},
                            {"top1_agreement", m.top1_agreement}, {"layer_rel_err", m.layer_rel_err},
                            {"exact_tokens_per_head", m.exact_tokens_per_head},
                            {"layer_budget_multipliers", m.layer_budget_multipliers},
                            {"context_tokens_per_head", m.context_tokens_per_head}, {"seconds", m.seconds}});
  for (size_t i = 0; i < r.methods.size(); ++i) {
    const PplMethodResult& m = r.methods[i];
    nlohmann::json& mj = j["methods"][i];
    mj["kv_dtype"] = std::string(dtype_name(m.kv_dtype));
    if (m.budget_tokens >= 0) mj["budget_tokens"] = m.budget_tokens;
    if (!m.kv_placement.empty()) mj["kv_placement"] = m.kv_placement;
    if (m.host_layers > 0) {
      mj["host_layers"] = m.host_layers;
      mj["host_store"] = m.host_store;
      mj["cache_hits"] = m.cache_hits;
      mj["cache_misses"] = m.cache_misses;
      mj["cache_hit_ratio"] = hit_ratio_json(m.cache_hits, m.cache_misses);
      mj["pcie_bytes"] = m.pcie_bytes;
    }
  }
  j["baseline_budget"] = std::string(baseline_budget_name(r.options.baseline_budget));
  return j;
}

std::string markdown_table(const PplReport& r) {
  std::string md =
      "| method | perplexity | vs full (± SE) | KL mean (nats) | KL max | top-1 agreement | attention rel. L2 error, mean "
      "over layers | worst layer | exact tokens read / context | steps |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  char buf[512];
  for (const auto& m : r.methods) {
    double mean = 0;
    size_t worst = 0;
    for (size_t l = 0; l < m.layer_rel_err.size(); ++l) {
      mean += m.layer_rel_err[l];
      if (m.layer_rel_err[l] > m.layer_rel_err[worst]) worst = l;
    }
    mean /= std::max<size_t>(1, m.layer_rel_err.size());
    char err[96] = "n/a (cpu only) | n/a";
    if (!m.layer_rel_err.empty())
      std::snprintf(err, sizeof err, "%.2e | %.2e (layer %zu)", mean, m.layer_rel_err[worst], worst);
    char vs_full[48];
    if (&m == &r.methods.front()) std::snprintf(vs_full, sizeof vs_full, "%+.2f%%", 100.0 * m.ppl_rel_diff);
    else std::snprintf(vs_full, sizeof vs_full, "%+.2f%% ± %.2f", 100.0 * m.ppl_rel_diff, 100.0 * m.ppl_rel_diff_se);
    std::snprintf(buf, sizeof buf, "| %s | %.4f | %s | %.2e | %.2e | %.1f%% | %s | %.0f / %.0f | %lld |\n",
                  m.method.c_str(), m.ppl, vs_full, m.kl_mean, m.kl_max, 100.0 * m.top1_agreement,
                  err, m.exact_tokens_per_head, m.context_tokens_per_head, static_cast<long long>(m.steps));
    md += buf;
  }
  return md;
}

PplReport run_ppl_fidelity(const Model& model, std::span<const int32_t> text, const PplOptions& opt) {
  const EngineModel cpu(model);
  return run_ppl_fidelity(cpu, text, opt);
}

}  // namespace retroinfer::eval
