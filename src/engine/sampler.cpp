#include "retroinfer/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "retroinfer/error.h"

namespace retroinfer {

void validate(const SamplerConfig& c) {
  RETROINFER_CHECK(std::isfinite(c.temperature) && c.temperature >= 0.0f,
                   "sampler: temperature must be >= 0 (0 = greedy), got ", c.temperature);
  RETROINFER_CHECK(c.top_k >= 0, "sampler: top_k must be >= 0 (0 = all tokens), got ", c.top_k);
  RETROINFER_CHECK(std::isfinite(c.top_p) && c.top_p > 0.0f && c.top_p <= 1.0f,
                   "sampler: top_p must be in (0, 1], got ", c.top_p);
}

int32_t argmax(std::span<const float> logits) {
  RETROINFER_CHECK(!logits.empty(), "sampler: empty logits");
  int32_t best = -1;
  for (size_t i = 0; i < logits.size(); ++i)
    if (!std::isnan(logits[i]) && (best < 0 || logits[i] > logits[best])) best = static_cast<int32_t>(i);
  RETROINFER_CHECK(best >= 0, "sampler: every logit is NaN; the forward pass diverged");
  return best;
}

Sampler::Sampler(const SamplerConfig& cfg) : cfg_(cfg), rng_(cfg.seed) { validate(cfg); }

std::vector<std::pair<int32_t, float>> Sampler::distribution(std::span<const float> logits) const {
  const int32_t best = argmax(logits);
  if (cfg_.temperature == 0.0f) return {{best, 1.0f}};
  const double inv_t = 1.0 / cfg_.temperature;
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
  if (cfg_.top_k > 0 && static_cast<size_t>(cfg_.top_k) < keep) {
    keep = cfg_.top_k;
    std::partial_sort(p.begin(), p.begin() + keep, p.end(), by_prob);
    p.resize(keep);
  } else {
    std::sort(p.begin(), p.end(), by_prob);
  }
  double total = 0.0;
  for (const auto& x : p) total += x.second;
  if (cfg_.top_p < 1.0f) {
    // Smallest prefix whose mass reaches top_p (at least one token).
    double acc = 0.0;
    size_t k = 0;
    while (k < p.size()) {
      acc += p[k].second / total;
      ++k;
      if (acc >= cfg_.top_p) break;
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

int32_t Sampler::sample(std::span<const float> logits) {
  if (cfg_.temperature == 0.0f) return argmax(logits);
  const auto dist = distribution(logits);
  // Uniform in [0, 1) from the top 53 bits: identical on every platform for a given seed.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
  double acc = 0.0;
  for (const auto& [id, prob] : dist) {
    acc += prob;
    if (u < acc) return id;
  }
  return dist.back().first;  // rounding: u above the float sum
}

}  // namespace retroinfer
