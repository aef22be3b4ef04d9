#include "model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "retroinfer/error.h"

namespace retroinfer::model {
namespace {

// 1 / theta^(2i/d), i < d/2, computed in double and rounded once to f32 (transformers computes the same
// expression in f32; the two differ by at most one f32 ulp, a relative 6e-8).
std::vector<double> base_inv_freq(double theta, int d) {
  std::vector<double> f(d / 2);
  for (int i = 0; i < d / 2; ++i) f[i] = 1.0 / std::pow(theta, static_cast<double>(2 * i) / d);
  return f;
}

std::vector<float> to_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }

double yarn_mscale(double factor) { return factor <= 1.0 ? 1.0 : 0.1 * std::log(factor) + 1.0; }

}  // namespace

RopeFrequencies rope_frequencies(const ModelConfig& cfg, int64_t seq_len) {
  const int d = cfg.head_dim;
  RETROINFER_CHECK(d > 0 && d % 2 == 0, "RoPE: head_dim must be positive and even, got ", d);
  RETROINFER_CHECK(cfg.rope_theta > 0.0f, "RoPE: rope_theta must be positive, got ", cfg.rope_theta);
  const RopeScaling& rs = cfg.rope_scaling;
  const double theta = cfg.rope_theta;
  RopeFrequencies out;
  const std::string& type = rs.type;
  if (type == "default" || type.empty()) {
    out.inv_freq = to_float(base_inv_freq(theta, d));
    return out;
  }
  RETROINFER_CHECK(rs.factor > 0.0f, "RoPE ", type, ": factor must be positive, got ", rs.factor);
  const double factor = rs.factor;
  if (type == "linear") {
    auto f = base_inv_freq(theta, d);
    for (auto& x : f) x /= factor;
    out.inv_freq = to_float(f);
    return out;
  }
  if (type == "dynamic") {
    // transformers: the original length is max_position_embeddings; below it the base is unchanged.
    const double orig = cfg.max_position_embeddings;
    RETROINFER_CHECK(orig > 0, "RoPE dynamic: max_position_embeddings must be positive");
    const double len = std::max<double>(static_cast<double>(seq_len), orig);
    const double base = theta * std::pow(factor * len / orig - (factor - 1.0), static_cast<double>(d) / (d - 2));
    out.inv_freq = to_float(base_inv_freq(base, d));
    return out;
  }
  if (type == "llama3") {
    const double old_len = rs.original_max_position;
    RETROINFER_CHECK(old_len > 0, "RoPE llama3: original_max_position_embeddings must be positive");
    RETROINFER_CHECK(rs.high_freq_factor > rs.low_freq_factor,
                     "RoPE llama3: high_freq_factor must exceed low_freq_factor");
    const double low_wavelen = old_len / rs.low_freq_factor;    // longer wavelengths: divided by factor
    const double high_wavelen = old_len / rs.high_freq_factor;  // shorter wavelengths: unchanged
    auto f = base_inv_freq(theta, d);
    for (auto& x : f) {
      const double wavelen = 2.0 * std::numbers::pi / x;
      if (wavelen > low_wavelen) {
        x /= factor;
      } else if (wavelen >= high_wavelen) {  // in between: interpolate
        const double smooth = (old_len / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        x = (1.0 - smooth) * x / factor + smooth * x;
      }
    }
    out.inv_freq = to_float(f);
    return out;
  }
  if (type == "yarn") {
    const double orig = rs.original_max_position > 0 ? rs.original_max_position : cfg.max_position_embeddings;
    RETROINFER_CHECK(orig > 0, "RoPE yarn: original_max_position_embeddings must be positive");
    // Dimension index at which a frequency makes `rot` full rotations over the original length.
    auto correction_dim = [&](double rot) {
      return d * std::log(orig / (rot * 2.0 * std::numbers::pi)) / (2.0 * std::log(theta));
    };
    double low = std::max(std::floor(correction_dim(rs.beta_fast)), 0.0);
    double high = std::min(std::ceil(correction_dim(rs.beta_slow)), static_cast<double>(d - 1));
    if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
    const auto f = base_inv_freq(theta, d);
    std::vector<double> g(f.size());
    for (size_t i = 0; i < f.size(); ++i) {
      // ramp 0 below `low` (pure extrapolation = original frequency), 1 above `high` (interpolation).
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      const double extrap = 1.0 - ramp;
      g[i] = (f[i] / factor) * (1.0 - extrap) + f[i] * extrap;
    }
    out.inv_freq = to_float(g);
    out.attention_factor = rs.attention_factor > 0.0f ? rs.attention_factor : static_cast<float>(yarn_mscale(factor));
    return out;
  }
  RETROINFER_FAIL("RoPE: unsupported rope_scaling type '", type,
                  "': expected default, linear, dynamic, llama3 or yarn");
}

void rope_table(const RopeFrequencies& f, int64_t pos0, int64_t n, float* cos, float* sin) {
  const size_t half = f.inv_freq.size();
  for (int64_t t = 0; t < n; ++t) {
    const float p = static_cast<float>(pos0 + t);
    for (size_t i = 0; i < half; ++i) {
      const float a = p * f.inv_freq[i];
      cos[t * half + i] = static_cast<float>(std::cos(static_cast<double>(a))) * f.attention_factor;
      sin[t * half + i] = static_cast<float>(std::sin(static_cast<double>(a))) * f.attention_factor;
    }
  }
}

void apply_rope(float* x, int64_t n, int heads, int head_dim, const float* cos, const float* sin) {
  const int half = head_dim / 2;
  for (int64_t t = 0; t < n; ++t) {
    const float* c = cos + t * half;
    const float* s = sin + t * half;
    for (int h = 0; h < heads; ++h) {
      float* v = x + (t * heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i] + a * s[i];
      }
    }
  }
}

}  // namespace retroinfer::model
