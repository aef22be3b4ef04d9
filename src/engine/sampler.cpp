#include "retroinfer/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "retroinfer/error.h"

namespace retroinfer {

void validate(const SamplerConfig& c) {
  RETROINFER_CHECK(std::isfinite(c.temperature) && c.temperature >= 0.0f,
                   "sampler: temperature must be >= 0 (0 = greedy), got ", c.temperature);
  RETROINFER_CHECK(c.top_k >= 0, "sampler: top_k must be >= 0 (0 = all tokens), got ", c.top_k);
  RETROINFER_CHECK(std::isfinite(c.top_p) && c.top_p > 0.0f && c.top_p <= 1.0f,
                   "sampler: top_p must be in (0, 1], got ", c.top_p);
  RETROINFER_CHECK(std::isfinite(c.repetition_penalty) && c.repetition_penalty > 0.0f,
                   "sampler: repetition_penalty must be > 0 (1 = off), got ", c.repetition_penalty);
  RETROINFER_CHECK(std::isfinite(c.frequency_penalty), "sampler: frequency_penalty must be finite");
  RETROINFER_CHECK(std::isfinite(c.presence_penalty), "sampler: presence_penalty must be finite");
  for (const auto& [id, bias] : c.logit_bias) {
    RETROINFER_CHECK(id >= 0, "sampler: logit_bias names token id ", id, "; ids are >= 0");
    RETROINFER_CHECK(std::isfinite(bias), "sampler: logit_bias of token ", id, " must be finite");
  }
  RETROINFER_CHECK(c.logprobs >= -1 && c.logprobs <= kMaxTopLogprobs, "sampler: logprobs must be in [-1, ",
                   kMaxTopLogprobs, "] (-1 = none), got ", c.logprobs);
}

int32_t argmax(std::span<const float> logits) {
  RETROINFER_CHECK(!logits.empty(), "sampler: empty logits");
  int32_t best = -1;
  for (size_t i = 0; i < logits.size(); ++i)
    if (!std::isnan(logits[i]) && (best < 0 || logits[i] > logits[best])) best = static_cast<int32_t>(i);
  RETROINFER_CHECK(best >= 0, "sampler: every logit is NaN; the forward pass diverged");
  return best;
}

TokenLogprobs token_logprobs(std::span<const float> logits, int32_t sampled, int k) {
  const int32_t best = argmax(logits);
  const double m = logits[best];
  TokenLogprobs out;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  auto finite = [](float x) { return !std::isnan(x) && x != -std::numeric_limits<float>::infinity(); };
  if (!std::isfinite(m)) {  // every logit is -inf (a constraint banned all): nothing to report
    out.sampled = {sampled, neg_inf};
    return out;
  }
  double sum = 0.0;
  for (const float x : logits)
    if (finite(x)) sum += std::exp(x - m);
  const double lse = m + std::log(sum);
  auto lp = [&](int32_t id) {
    const float x = logits[id];
    return finite(x) ? static_cast<float>(std::min(0.0, x - lse)) : neg_inf;
  };
  out.sampled = {sampled, lp(sampled)};
  if (k > 0) {
    std::vector<int32_t> ids;
    ids.reserve(logits.size());
    for (size_t i = 0; i < logits.size(); ++i)
      if (finite(logits[i])) ids.push_back(static_cast<int32_t>(i));
    const size_t keep = std::min(ids.size(), static_cast<size_t>(k));
    std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
    });
    for (size_t i = 0; i < keep; ++i) out.top.push_back({ids[i], lp(ids[i])});
  }
  return out;
}

Sampler::Sampler(const SamplerConfig& cfg) : cfg_(cfg), rng_(cfg.seed) { validate(cfg); }

void Sampler::add_prompt(std::span<const int32_t> tokens) {
  if (cfg_.repetition_penalty != 1.0f) seen_.insert(tokens.begin(), tokens.end());
}

bool Sampler::changes_logits() const {
  return cfg_.repetition_penalty != 1.0f || cfg_.frequency_penalty != 0.0f || cfg_.presence_penalty != 0.0f ||
         !cfg_.logit_bias.empty() || cfg_.constraint;
}

void Sampler::apply(std::span<const float> logits, std::vector<float>& out) const {
  out.assign(logits.begin(), logits.end());
  const auto vocab = static_cast<int64_t>(out.size());
  if (cfg_.repetition_penalty != 1.0f) {
    const float r = cfg_.repetition_penalty;
    for (const int32_t id : seen_) {
      if (id < 0 || id >= vocab) continue;
      float& l = out[id];
      l = l > 0.0f ? l / r : l * r;
    }
  }
  if (cfg_.frequency_penalty != 0.0f || cfg_.presence_penalty != 0.0f) {
    for (const auto& [id, c] : generated_counts_) {
      if (id < 0 || id >= vocab) continue;
      out[id] -= static_cast<float>(c) * cfg_.frequency_penalty + cfg_.presence_penalty;
    }
  }
  for (const auto& [id, bias] : cfg_.logit_bias) {
    RETROINFER_CHECK(id < vocab, "sampler: logit_bias names token id ", id, " but the vocabulary has ", vocab,
                     " tokens");
    out[id] += bias;
  }
  if (cfg_.constraint) {
    cfg_.constraint->mask(out);
    const bool any = std::any_of(out.begin(), out.end(), [](float x) {
      return !std::isnan(x) && x != -std::numeric_limits<float>::infinity();
    });
    RETROINFER_CHECK(any, "sampler: the constraint allows no token of the vocabulary at this step");
  }
}

namespace {

// The distribution of `logits` after temperature, top-k and top-p (see Sampler::distribution).
std::vector<std::pair<int32_t, float>> draw_distribution(const SamplerConfig& cfg, std::span<const float> logits) {
  const int32_t best = argmax(logits);
  if (cfg.temperature == 0.0f) return {{best, 1.0f}};
  const double inv_t = 1.0 / cfg.temperature;
  const double m = logits[best];
  std::vector<std::pair<int32_t, double>> p;
  p.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;
    const double e = std::exp((logits[i] - m) * inv_t);  // <= 1; the max contributes exactly 1
    if (e > 0.0) p.emplace_back(static_cast<int32_t>(i), e);
  }
  auto by_prob = [](const auto& a, const auto& b) { return a.second != b.second ? a.second > b.second : a.first < b.first; };
  size_t keep = p.size();
  if (cfg.top_k > 0 && static_cast<size_t>(cfg.top_k) < keep) {
    keep = cfg.top_k;
    std::partial_sort(p.begin(), p.begin() + keep, p.end(), by_prob);
    p.resize(keep);
  } else {
    std::sort(p.begin(), p.end(), by_prob);
  }
  double total = 0.0;
  for (const auto& x : p) total += x.second;
  if (cfg.top_p < 1.0f) {
    // Smallest prefix whose mass reaches top_p (at least one token).
    double acc = 0.0;
    size_t k = 0;
    while (k < p.size()) {
      acc += p[k].second / total;
      ++k;
      if (acc >= cfg.top_p) break;
    }
    p.resize(k);
    total = 0.0;
    for (const auto& x : p) total += x.second;
  }
  std::vector<std::pair<int32_t, float>> out;
  out.reserve(p.size());
  for (const auto& x : p) out.emplace_back(x.first, static_cast<float>(x.second / total));
  return out;
}

}  // namespace

std::vector<std::pair<int32_t, float>> Sampler::distribution(std::span<const float> logits) const {
  if (!changes_logits()) return draw_distribution(cfg_, logits);
  std::vector<float> changed;
  apply(logits, changed);
  return draw_distribution(cfg_, changed);
}

int32_t Sampler::sample(std::span<const float> logits) {
  std::span<const float> x = logits;
  if (changes_logits()) {
    apply(logits, work_);
    x = work_;
  }
  int32_t tok = -1;
  if (cfg_.temperature == 0.0f) {
    tok = argmax(x);
  } else {
    const auto dist = draw_distribution(cfg_, x);
    // Uniform in [0, 1) from the top 53 bits: identical on every platform for a given seed.
    const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
    double acc = 0.0;
    tok = dist.back().first;  // rounding: u above the float sum
    for (const auto& [id, prob] : dist) {
      acc += prob;
      if (u < acc) {
        tok = id;
        break;
      }
    }
  }
  if (cfg_.logprobs >= 0) last_logprobs_ = token_logprobs(x, tok, cfg_.logprobs);
  if (cfg_.frequency_penalty != 0.0f || cfg_.presence_penalty != 0.0f) ++generated_counts_[tok];
  if (cfg_.repetition_penalty != 1.0f) seen_.insert(tok);
  if (cfg_.constraint) cfg_.constraint->accept(tok);
  return tok;
}

}  // namespace retroinfer
