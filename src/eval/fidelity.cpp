// The fidelity evaluation loop (see fidelity.h).
#include "eval/fidelity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "retroinfer/error.h"

namespace retroinfer::eval {

namespace {

constexpr std::string_view kMethodNames[] = {"full", "retro", "retro-noest", "quest", "streaming", "oracle"};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Reference attention of one decode step for every evaluated query head, in double.
struct Reference {
  std::vector<double> prob;  // [num_heads_q, size]: softmax probabilities
  std::vector<double> out;   // [num_heads_q, head_dim]
};

void reference_step(const KvCache& kv, const float* q, int num_heads_q, int group, float scale, Reference& r) {
  const int64_t n = kv.size();
  const int d = kv.head_dim();
  r.prob.assign(static_cast<size_t>(num_heads_q) * n, 0.0);
  r.out.assign(static_cast<size_t>(num_heads_q) * d, 0.0);
#pragma omp parallel for schedule(dynamic, 1)
  for (int h = 0; h < num_heads_q; ++h) {
    const int kvh = h / group;
    const float* qh = q + static_cast<size_t>(h) * d;
    double* p = &r.prob[static_cast<size_t>(h) * n];
    std::vector<float> key(d), val(d);
    double m = -INFINITY;
    for (int64_t t = 0; t < n; ++t) {
      kv.load_key(kvh, t, key.data());
      double s = 0.0;
      for (int i = 0; i < d; ++i) s += static_cast<double>(qh[i]) * key[i];
      p[t] = s * scale;
      m = std::max(m, p[t]);
    }
    double z = 0.0;
    for (int64_t t = 0; t < n; ++t) z += (p[t] = std::exp(p[t] - m));
    double* o = &r.out[static_cast<size_t>(h) * d];
    for (int64_t t = 0; t < n; ++t) {
      p[t] /= z;
      kv.load_value(kvh, t, val.data());
      for (int i = 0; i < d; ++i) o[i] += p[t] * val[i];
    }
  }
}

struct Runner {
  MethodResult res;
  std::unique_ptr<AttentionMethod> method;
  int recall_samples = 0;  // (head, step) pairs with zones reported
  double needle_exact = 0.0, needle_estimated = 0.0, needle_total = 0.0;  // reference mass on needles
  int err_samples = 0;
};

AttentionConfig config_for(const FidelityOptions& o, const std::string& name) {
  AttentionConfig c = o.attention;
  if (name == "retro-noest") {
    c.kind = AttentionKind::kRetro;
    c.estimation = false;
  } else {
    c.kind = parse_attention_kind(name);
  }
  return c;
}

std::vector<std::string> method_list(const FidelityOptions& o) {
  std::vector<std::string> out;
  for (const auto& m : o.methods) {
    out.push_back(m);
    if (m == "retro" && o.estimation_variant &&
        std::find(o.methods.begin(), o.methods.end(), "retro-noest") == o.methods.end())
      out.push_back("retro-noest");
  }
  return out;
}

std::string fmt(double x, const char* f) {
  if (std::isnan(x)) return "n/a";
  char b[64];
  std::snprintf(b, sizeof b, f, x);
  return b;
}

}  // namespace

void validate(const FidelityOptions& o) {
  RETROINFER_CHECK(!o.contexts.empty(), "fidelity: no context lengths given");
  for (int64_t c : o.contexts) RETROINFER_CHECK(c > 0, "fidelity: context lengths must be positive, got ", c);
  RETROINFER_CHECK(!o.methods.empty(), "fidelity: no methods given");
  for (const auto& m : o.methods)
    RETROINFER_CHECK(std::find(std::begin(kMethodNames), std::end(kMethodNames), m) != std::end(kMethodNames),
                     "fidelity: unknown method '", m,
                     "': expected full, retro, retro-noest, quest, streaming or oracle");
  RETROINFER_CHECK(o.steps >= 1, "fidelity: --steps must be >= 1, got ", o.steps);
  validate(AttentionShape{o.num_heads_q, o.num_heads_kv, o.head_dim});
  RETROINFER_CHECK(o.kv_heads_evaluated >= 1 && o.kv_heads_evaluated <= o.num_heads_kv,
                   "fidelity: --kv-heads-evaluated must be in [1, ", o.num_heads_kv, "], got ", o.kv_heads_evaluated);
  RETROINFER_CHECK(o.dtype == DType::kF32 || o.dtype == DType::kBF16, "fidelity: --dtype must be f32 or bf16");
}

FidelityReport run_fidelity(const FidelityOptions& o) {
  validate(o);
  auto say = [&](const std::string& s) {
    if (o.progress) o.progress(s);
  };
  FidelityReport report;
  report.options = o;
  const int group = o.num_heads_q / o.num_heads_kv;
  const int hkv = o.kv_heads_evaluated, hq = hkv * group, d = o.head_dim;
  const AttentionShape shape{hq, hkv, d};
  const float scale = o.attention.scale != 0.0f ? o.attention.scale : 1.0f / std::sqrt(static_cast<float>(d));
  const std::vector<std::string> names = method_list(o);

  for (int64_t ctx : o.contexts) {
    ContextResult cr;
    cr.context = ctx;
    SyntheticConfig sc = o.synthetic;
    sc.num_heads_q = hq;
    sc.num_heads_kv = hkv;
    sc.head_dim = d;
    sc.context_tokens = ctx;
    sc.decode_steps = o.steps;
    sc.seed = o.seed;
    KvCache kv(hkv, d, o.dtype);
    say("context " + std::to_string(ctx) + ": generating data");
    auto t0 = std::chrono::steady_clock::now();
    const SyntheticData data = generate_synthetic(sc, kv);
    cr.generate_ms = ms_since(t0);

    std::vector<Runner> runners(names.size());
    for (size_t i = 0; i < names.size(); ++i) {
      Runner& r = runners[i];
      r.res.context = ctx;
      r.res.method = names[i];
      try {
        r.method = make_attention(config_for(o, names[i]), shape);
        say("context " + std::to_string(ctx) + ": " + names[i] + ": building index");
        t0 = std::chrono::steady_clock::now();
        r.method->on_prefill(kv);
        r.res.build_ms = ms_since(t0);
      } catch (const Error& e) {
        r.res.error = e.what();
        r.method.reset();
        say("context " + std::to_string(ctx) + ": " + names[i] + ": skipped: " + e.what());
      }
    }

    Reference ref;
    std::vector<float> out(static_cast<size_t>(hq) * d);
    std::vector<uint8_t> zones;
    for (int s = 0; s < o.steps; ++s) {
      kv.append(&data.k_step[static_cast<size_t>(s) * hkv * d], &data.v_step[static_cast<size_t>(s) * hkv * d], 1);
      const float* q = &data.queries[static_cast<size_t>(s) * hq * d];
      say("context " + std::to_string(ctx) + ": step " + std::to_string(s + 1) + "/" + std::to_string(o.steps));
      reference_step(kv, q, hq, group, scale, ref);
      const int64_t n = kv.size();
      for (int h = 0; h < hq; ++h) {
        const double* p = &ref.prob[static_cast<size_t>(h) * n];
        for (int64_t t = 0; t < std::min<int64_t>(sc.sink_tokens, n); ++t) cr.profile.sink_mass += p[t];
        for (int64_t t : data.needle_positions) cr.profile.needle_mass += p[t];
        for (int64_t t = std::max<int64_t>(0, n - o.attention.window_tokens); t < n; ++t)
          cr.profile.window_mass += p[t];
      }
      for (Runner& r : runners) {
        if (!r.method) continue;
        std::fill(out.begin(), out.end(), NAN);
        t0 = std::chrono::steady_clock::now();
        const AttentionStats st = r.method->decode(kv, q, out.data());
        r.res.ms_per_step += ms_since(t0);
        r.res.exact_tokens += static_cast<double>(st.exact_tokens) / hkv;
        r.res.context_tokens += static_cast<double>(st.context_tokens) / hkv;
        r.res.retrieved_clusters += static_cast<double>(st.retrieved_clusters) / hkv;
        r.res.estimated_clusters += static_cast<double>(st.estimated_clusters) / hkv;
        for (int h = 0; h < hq; ++h) {
          double num = 0.0, den = 0.0;
          for (int i = 0; i < d; ++i) {
            const double ref_i = ref.out[static_cast<size_t>(h) * d + i];
            const double diff = out[static_cast<size_t>(h) * d + i] - ref_i;
            num += diff * diff;
            den += ref_i * ref_i;
          }
          // A NaN (unwritten or broken output) must show up, not vanish into max().
          const double e = std::sqrt(num / std::max(den, 1e-300));
          r.res.rel_err_mean += e;
          r.res.rel_err_max = std::isnan(e) || std::isnan(r.res.rel_err_max) ? NAN : std::max(r.res.rel_err_max, e);
          ++r.err_samples;
        }
        for (int kvh = 0; kvh < hkv; ++kvh) {
          if (!r.method->last_zones(kvh, zones) || static_cast<int64_t>(zones.size()) != n) continue;
          for (int j = 0; j < group; ++j) {
            const double* p = &ref.prob[static_cast<size_t>(kvh * group + j) * n];
            double ex = 0.0, es = 0.0;
            for (int64_t t = 0; t < n; ++t) {
              if (zones[t] == AttentionMethod::kZoneExact) ex += p[t];
              else if (zones[t] == AttentionMethod::kZoneEstimated) es += p[t];
            }
            for (int64_t t : data.needle_positions) {
              r.needle_total += p[t];
              if (zones[t] == AttentionMethod::kZoneExact) r.needle_exact += p[t];
              if (zones[t] == AttentionMethod::kZoneEstimated) r.needle_estimated += p[t];
            }
            if (r.recall_samples == 0) r.res.recall_exact = r.res.recall_estimated = 0.0;
            r.res.recall_exact += ex;
            r.res.recall_estimated += es;
            ++r.recall_samples;
          }
        }
      }
    }
    const double samples = static_cast<double>(o.steps) * hq;
    cr.profile.sink_mass /= samples;
    cr.profile.needle_mass /= samples;
    cr.profile.window_mass /= samples;
    for (Runner& r : runners) {
      if (r.method) {
        r.res.rel_err_mean /= std::max(1, r.err_samples);
        r.res.exact_tokens /= o.steps;
        r.res.context_tokens /= o.steps;
        r.res.retrieved_clusters /= o.steps;
        r.res.estimated_clusters /= o.steps;
        r.res.ms_per_step /= o.steps;
        if (r.recall_samples > 0) {
          r.res.recall_exact /= r.recall_samples;
          r.res.recall_estimated /= r.recall_samples;
          if (r.needle_total > 0.0) {
            r.res.recall_needles = r.needle_exact / r.needle_total;
            if (r.method->kind() == AttentionKind::kRetro)
              r.res.recall_needles_estimated = r.needle_estimated / r.needle_total;
          }
          if (r.method->kind() != AttentionKind::kRetro) r.res.recall_estimated = kNotMeasured;
        } else if (r.method->kind() == AttentionKind::kFull) {
          r.res.recall_exact = r.res.recall_needles = 1.0;  // full reads every token by definition
        }
      }
      cr.methods.push_back(r.res);
    }
    report.contexts.push_back(std::move(cr));
  }
  return report;
}

std::string format_fidelity(const FidelityReport& r) {
  const FidelityOptions& o = r.options;
  const int group = o.num_heads_q / o.num_heads_kv;
  std::ostringstream os;
  os << "attention fidelity on synthetic data (seed " << o.seed << ", KV " << dtype_name(o.dtype) << ", "
     << o.steps << " decode steps per context, one K/V token appended per step)\n"
     << "shape " << o.num_heads_q << " q / " << o.num_heads_kv << " kv heads, head_dim " << o.head_dim
     << "; evaluated " << o.kv_heads_evaluated << " of " << o.num_heads_kv << " KV heads ("
     << o.kv_heads_evaluated * group << " query heads); timings cover the evaluated heads only\n"
     << "budget: sink " << o.attention.sink_tokens << " + window " << o.attention.window_tokens
     << " exact; retro retrieval " << o.attention.retrieval_fraction * 100 << "% / estimation "
     << o.attention.estimation_fraction * 100 << "% of clusters, outliers " << o.attention.outlier_fraction * 100
     << "% of indexed tokens exact; baselines read "
     << (o.attention.budget_tokens >= 0 ? std::to_string(o.attention.budget_tokens) + " tokens"
                                        : "round(" + fmt(o.attention.retrieval_fraction * 100, "%.1f") +
                                              "% of the indexed tokens)")
     << " beyond the steady zone\n"
     << "err = relative L2 error of the output vs full attention (mean / max over heads and steps); recall = share "
        "of full attention's mass on tokens read exactly (est: on estimated tokens); needles / ndl est: share of "
        "the needles' mass read exactly / estimated\n";
  for (const auto& c : r.contexts) {
    os << "\ncontext " << c.context << " (data: sink mass " << fmt(c.profile.sink_mass, "%.3f") << ", needle mass "
       << fmt(c.profile.needle_mass, "%.3f") << ", last-" << o.attention.window_tokens << " mass "
       << fmt(c.profile.window_mass, "%.3f") << "; generated in " << fmt(c.generate_ms / 1000, "%.1f") << " s)\n";
    char line[256];
    std::snprintf(line, sizeof line, "%-12s %9s %8s %7s %7s %7s %7s %9s %7s %8s %9s\n", "method", "err mean",
                  "err max", "recall", "est", "needles", "ndl est", "exact tok", "share", "ms/step", "build ms");
    os << line;
    for (const auto& m : c.methods) {
      if (!m.error.empty()) {
        os << "  " << m.method << ": not run: " << m.error << "\n";
        continue;
      }
      std::snprintf(line, sizeof line, "%-12s %9s %8s %7s %7s %7s %7s %9.0f %6.2f%% %8.1f %9.0f\n", m.method.c_str(),
                    fmt(m.rel_err_mean, "%.4f").c_str(), fmt(m.rel_err_max, "%.3f").c_str(),
                    fmt(m.recall_exact, "%.3f").c_str(), fmt(m.recall_estimated, "%.3f").c_str(),
                    fmt(m.recall_needles, "%.3f").c_str(), fmt(m.recall_needles_estimated, "%.3f").c_str(), m.exact_tokens,
                    m.context_tokens > 0 ? 100.0 * m.exact_tokens / m.context_tokens : 0.0, m.ms_per_step,
                    m.build_ms);
      os << line;
    }
  }
  return os.str();
}

std::string fidelity_json_lines(const FidelityReport& r) {
  const FidelityOptions& o = r.options;
  auto num = [](double x) { return std::isnan(x) ? nlohmann::json(nullptr) : nlohmann::json(x); };
  std::string s;
  for (const auto& c : r.contexts) {
    for (const auto& m : c.methods) {
      nlohmann::json j;
      j["context"] = c.context;
      j["method"] = m.method;
      j["seed"] = o.seed;
      j["steps"] = o.steps;
      j["dtype"] = std::string(dtype_name(o.dtype));
      j["num_heads_q"] = o.num_heads_q;
      j["num_heads_kv"] = o.num_heads_kv;
      j["head_dim"] = o.head_dim;
      j["kv_heads_evaluated"] = o.kv_heads_evaluated;
      j["retrieval_fraction"] = o.attention.retrieval_fraction;
      j["estimation_fraction"] = o.attention.estimation_fraction;
      j["outlier_fraction"] = o.attention.outlier_fraction;
      j["data_sink_mass"] = c.profile.sink_mass;
      j["data_needle_mass"] = c.profile.needle_mass;
      j["data_window_mass"] = c.profile.window_mass;
      if (!m.error.empty()) {
        j["error"] = m.error;
      } else {
        j["rel_err_mean"] = num(m.rel_err_mean);
        j["rel_err_max"] = num(m.rel_err_max);
        j["recall_exact"] = num(m.recall_exact);
        j["recall_estimated"] = num(m.recall_estimated);
        j["recall_needles"] = num(m.recall_needles);
        j["recall_needles_estimated"] = num(m.recall_needles_estimated);
        j["exact_tokens_per_step"] = m.exact_tokens;
        j["context_tokens_per_step"] = m.context_tokens;
        j["retrieved_clusters_per_step"] = m.retrieved_clusters;
        j["estimated_clusters_per_step"] = m.estimated_clusters;
        j["ms_per_step"] = m.ms_per_step;
        j["build_ms"] = m.build_ms;
      }
      s += j.dump() + "\n";
    }
  }
  return s;
}

}  // namespace retroinfer::eval
