// Synthetic decode-attention data (see synthetic.h for the model and every knob).
#include "core/synthetic.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "core/splitmix.h"
#include "retroinfer/error.h"

namespace retroinfer::eval {

void validate(const SyntheticConfig& c) {
  RETROINFER_CHECK(c.num_heads_q > 0 && c.num_heads_kv > 0 && c.num_heads_q % c.num_heads_kv == 0,
                   "synthetic: need num_heads_q a positive multiple of num_heads_kv, got ", c.num_heads_q, " and ",
                   c.num_heads_kv);
  RETROINFER_CHECK(c.head_dim >= 8 && c.head_dim % 2 == 0, "synthetic: head_dim must be even and >= 8, got ",
                   c.head_dim);
  RETROINFER_CHECK(c.sink_tokens >= 1 && c.num_needles >= 0, "synthetic: need sink_tokens >= 1 and num_needles >= 0");
  RETROINFER_CHECK(c.needle_span >= 1, "synthetic: needle_span must be >= 1, got ", c.needle_span);
  RETROINFER_CHECK(c.context_tokens >= c.sink_tokens + 256 + 2 * int64_t{c.num_needles} * c.needle_span,
                   "synthetic: context_tokens must be >= sink_tokens + 256 + 2 * num_needles * needle_span (needles "
                   "are placed in [sink, context - 256)), got ",
                   c.context_tokens);
  RETROINFER_CHECK(c.decode_steps >= 1, "synthetic: decode_steps must be >= 1, got ", c.decode_steps);
  RETROINFER_CHECK(c.rope_theta > 1.0 && c.rope_llama3_factor >= 1.0,
                   "synthetic: need rope_theta > 1 and rope_llama3_factor >= 1");
  RETROINFER_CHECK(c.semantic_pairs > 0.0, "synthetic: semantic_pairs must be positive");
  RETROINFER_CHECK(c.num_words >= 1 && c.num_topics >= 1 && c.topic_span >= 1.0 && c.topic_drift_tokens >= 1.0,
                   "synthetic: num_words, num_topics >= 1 and topic_span, topic_drift_tokens >= 1 required");
  RETROINFER_CHECK(c.recall_topics >= 0, "synthetic: recall_topics must be >= 0");
  RETROINFER_CHECK(c.query_drift > 0.0 && c.query_drift <= 1.0, "synthetic: query_drift must be in (0, 1], got ",
                   c.query_drift);
  RETROINFER_CHECK(c.topic_key_norm > 0 && c.needle_key_norm > 0 && c.sink_key_norm > 0 && c.local_key_norm > 0,
                   "synthetic: the key norms that queries are scaled by must be positive");
  for (double x : {c.key_bias_norm, c.word_key_norm, c.key_noise, c.topic_drift, c.head_spread, c.value_topic_norm,
                   c.value_word_norm, c.value_noise, c.sink_value_norm, c.needle_value_norm, c.query_noise_logit})
    RETROINFER_CHECK(x >= 0.0 && std::isfinite(x), "synthetic: norms, noises and spreads must be finite and >= 0");
}

void set_synthetic_knob(SyntheticConfig& c, std::string_view name, double value) {
  struct Knob {
    std::string_view name;
    double* d;
    int* i;
  };
  const Knob knobs[] = {
      {"rope_theta", &c.rope_theta, nullptr},           {"rope_llama3_factor", &c.rope_llama3_factor, nullptr},
      {"semantic_pairs", &c.semantic_pairs, nullptr},   {"local_logit", &c.local_logit, nullptr},
      {"key_bias_norm", &c.key_bias_norm, nullptr},     {"topic_key_norm", &c.topic_key_norm, nullptr},
      {"word_key_norm", &c.word_key_norm, nullptr},     {"local_key_norm", &c.local_key_norm, nullptr},
      {"key_noise", &c.key_noise, nullptr},             {"num_words", nullptr, &c.num_words},
      {"word_zipf", &c.word_zipf, nullptr},             {"num_topics", nullptr, &c.num_topics},
      {"topic_span", &c.topic_span, nullptr},           {"topic_drift", &c.topic_drift, nullptr},
      {"topic_drift_tokens", &c.topic_drift_tokens, nullptr}, {"sink_tokens", nullptr, &c.sink_tokens},
      {"sink_logit", &c.sink_logit, nullptr},           {"sink_key_norm", &c.sink_key_norm, nullptr},
      {"sink_value_norm", &c.sink_value_norm, nullptr}, {"num_needles", nullptr, &c.num_needles},
      {"needle_span", nullptr, &c.needle_span},         {"needle_logit", &c.needle_logit, nullptr},
      {"needle_key_norm", &c.needle_key_norm, nullptr}, {"needle_value_norm", &c.needle_value_norm, nullptr},
      {"topic_logit", &c.topic_logit, nullptr},         {"recall_topics", nullptr, &c.recall_topics},
      {"recall_logit", &c.recall_logit, nullptr},       {"query_noise_logit", &c.query_noise_logit, nullptr},
      {"query_drift", &c.query_drift, nullptr},         {"head_spread", &c.head_spread, nullptr},
      {"value_topic_norm", &c.value_topic_norm, nullptr}, {"value_word_norm", &c.value_word_norm, nullptr},
      {"value_noise", &c.value_noise, nullptr},
  };
  std::string all;
  for (const Knob& k : knobs) {
    if (k.name == name) {
      if (k.d) {
        *k.d = value;
      } else {
        RETROINFER_CHECK(value == std::floor(value) && std::abs(value) < 1e9, "synthetic: knob '", name,
                         "' takes an integer, got ", value);
        *k.i = static_cast<int>(value);
      }
      return;
    }
    all += (all.empty() ? "" : ", ") + std::string(k.name);
  }
  RETROINFER_FAIL("synthetic: unknown knob '", name, "'; knobs: ", all);
}

namespace {

// splitmix64 stream: portable, so a seed gives the same data on every platform. normal() is the
// Irwin-Hall sum of four uniforms from one draw, scaled to unit variance: a bell curve bounded at
// ±2*sqrt(3) (enough for noise and random directions, ~10x cheaper than Box-Muller).
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() { return splitmix64_next(s_); }
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }  // (0,1)
  double normal() {
    const uint64_t u = next();
    const double sum = static_cast<double>((u & 0xffff) + ((u >> 16) & 0xffff) + ((u >> 32) & 0xffff) + (u >> 48));
    // Each 16-bit field is uniform on [0, 65535]: mean 32767.5, variance (65536^2 - 1) / 12.
    constexpr double kMean = 4 * 32767.5;
    constexpr double kStd = 37837.23;  // sqrt(4 * (65536^2 - 1) / 12)
    return (sum - kMean) / kStd;
  }

 private:
  uint64_t s_;
};

uint64_t stream_seed(uint64_t seed, uint64_t stream) {
  Rng r(seed ^ (stream * 0xd1b54a32d192ed03ull));
  return r.next();
}

// Rotation speed of pair i (radians per token), with Llama-3.1 scaling when factor > 1.
std::vector<double> rope_freqs(const SyntheticConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<double> f(half);
  constexpr double kOriginal = 8192.0, kLowFreqFactor = 1.0, kHighFreqFactor = 4.0;
  for (int i = 0; i < half; ++i) {
    double x = std::pow(c.rope_theta, -2.0 * i / c.head_dim);
    if (c.rope_llama3_factor > 1.0) {
      const double wavelen = 2.0 * std::numbers::pi / x;
      const double low_wl = kOriginal / kLowFreqFactor, high_wl = kOriginal / kHighFreqFactor;
      if (wavelen > low_wl) {
        x /= c.rope_llama3_factor;
      } else if (wavelen > high_wl) {
        const double s = (kOriginal / wavelen - kLowFreqFactor) / (kHighFreqFactor - kLowFreqFactor);
        x = (1.0 - s) * x / c.rope_llama3_factor + s * x;
      }
    }
    f[i] = x;
  }
  return f;
}

// Rotate-half RoPE at position pos: (x_i, x_{i+d/2}) rotated by pos * f_i. x: [d].
void apply_rope(float* x, int64_t pos, const std::vector<double>& f) {
  const int half = static_cast<int>(f.size());
  for (int i = 0; i < half; ++i) {
    const double a = static_cast<double>(pos) * f[i];
    const float c = static_cast<float>(std::cos(a)), s = static_cast<float>(std::sin(a));
    const float u = x[i], v = x[i + half];
    x[i] = u * c - v * s;
    x[i + half] = u * s + v * c;
  }
}

void normalize(float* x, int d) {
  double n = 0.0;
  for (int i = 0; i < d; ++i) n += static_cast<double>(x[i]) * x[i];
  const float inv = n > 0.0 ? static_cast<float>(1.0 / std::sqrt(n)) : 0.0f;
  for (int i = 0; i < d; ++i) x[i] *= inv;
}

// Random unit vector whose pair i (dims i, i + d/2) carries expected energy ∝ pair_w[i]. out: [d].
void random_direction(Rng& r, const std::vector<double>& pair_w, float* out) {
  const int half = static_cast<int>(pair_w.size());
  for (int i = 0; i < half; ++i) {
    const double s = std::sqrt(pair_w[i]);
    out[i] = static_cast<float>(s * r.normal());
    out[i + half] = static_cast<float>(s * r.normal());
  }
  normalize(out, 2 * half);
}

// The directions of one KV head (all unit vectors; [rows, d] row-major).
struct HeadDirections {
  std::vector<float> bias, sink, local, v_sink;         // [d]
  std::vector<float> topic, v_topic;                    // [num_topics, d]
  std::vector<float> word, v_word;                      // [num_words, d]
  std::vector<float> needle, v_needle;                  // [num_needles, d]
};

// Removes from x its components along the unit rows of basis ([n, d]) and renormalises. x: [d].
void orthogonalize(float* x, const std::vector<float>& basis, int d) {
  const size_t n = basis.size() / d;
  for (size_t j = 0; j < n; ++j) {
    const float* b = &basis[j * d];
    double dot = 0.0;
    for (int i = 0; i < d; ++i) dot += static_cast<double>(x[i]) * b[i];
    for (int i = 0; i < d; ++i) x[i] -= static_cast<float>(dot) * b[i];
  }
  normalize(x, d);
}

// Directions of one KV head. The sink owns the slowest RoPE pair (no other key or query direction has
// energy there), so the sink score is not disturbed by content and barely rotates (0.04 rad over 128K
// with llama3 scaling at d = 128). The needle directions are orthonormal, and the topic, word, bias and
// recency directions have the needle span projected out, so ordinary tokens do not match the needle part
// of the queries by accident (before RoPE; rotation re-mixes a little at long distances).
HeadDirections make_directions(const SyntheticConfig& c, Rng& r) {
  const int d = c.head_dim, half = d / 2;
  std::vector<double> semantic(half), flat(half, 1.0), local(half, 0.0);
  for (int i = 0; i < half; ++i) semantic[i] = std::exp(-(half - 1 - i) / c.semantic_pairs);
  for (int i = half / 8; i < half / 2; ++i) local[i] = 1.0;  // pairs [d/16, d/4)
  semantic[half - 1] = flat[half - 1] = local[half - 1] = 0.0;  // the sink pair
  HeadDirections h;
  auto rows = [&](std::vector<float>& m, int n, const std::vector<double>& w, const std::vector<float>* avoid) {
    m.resize(static_cast<size_t>(n) * d);
    for (int j = 0; j < n; ++j) {
      random_direction(r, w, &m[static_cast<size_t>(j) * d]);
      if (avoid) orthogonalize(&m[static_cast<size_t>(j) * d], *avoid, d);
    }
  };
  h.sink.assign(d, 0.0f);
  h.sink[half - 1] = h.sink[d - 1] = static_cast<float>(1.0 / std::sqrt(2.0));
  h.needle.clear();
  for (int j = 0; j < c.num_needles; ++j) {  // Gram-Schmidt: each needle orthogonal to the previous ones
    std::vector<float> x(d);
    random_direction(r, semantic, x.data());
    orthogonalize(x.data(), h.needle, d);
    h.needle.insert(h.needle.end(), x.begin(), x.end());
  }
  rows(h.bias, 1, flat, &h.needle);
  rows(h.local, 1, local, &h.needle);
  rows(h.topic, c.num_topics, semantic, &h.needle);
  rows(h.word, c.num_words, semantic, &h.needle);
  rows(h.v_sink, 1, flat, nullptr);
  rows(h.v_topic, c.num_topics, flat, nullptr);
  rows(h.v_word, c.num_words, flat, nullptr);
  rows(h.v_needle, c.num_needles, flat, nullptr);
  return h;
}

// The text shared by every head: topic, word and relevance of every token, needle positions.
struct Text {
  std::vector<int> topic;         // [total]
  std::vector<int> word;          // [total]
  std::vector<float> relevance;   // [total], in [0.5, 1.5]
  std::vector<int> needle_of;     // [total]: needle index or -1
  std::vector<int64_t> needles;   // ascending positions
  std::vector<int64_t> recall_pos;  // [recall_topics]: positions whose topic centre the queries recall
};

Text make_text(const SyntheticConfig& c, int64_t total, Rng& r) {
  Text t;
  t.topic.resize(total);
  t.word.resize(total);
  t.relevance.resize(total);
  t.needle_of.assign(total, -1);
  std::vector<double> cdf(c.num_words);
  double acc = 0.0;
  for (int w = 0; w < c.num_words; ++w) cdf[w] = (acc += std::pow(w + 1.0, -c.word_zipf));
  int topic = static_cast<int>(r.next() % c.num_topics);
  const double p_switch = 1.0 / c.topic_span;
  for (int64_t i = 0; i < total; ++i) {
    if (i > 0 && r.uniform() < p_switch) topic = static_cast<int>(r.next() % c.num_topics);
    t.topic[i] = topic;
    const double u = r.uniform() * acc;
    t.word[i] = static_cast<int>(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
    t.word[i] = std::min(t.word[i], c.num_words - 1);
    t.relevance[i] = static_cast<float>(0.5 + r.uniform());
  }
  // Needle j covers [start_j, start_j + needle_span); spans do not overlap and lie in [sink, context - 256).
  const int64_t lo = c.sink_tokens, hi = c.context_tokens - 256 - c.needle_span + 1;
  for (int j = 0; j < c.num_needles;) {
    const int64_t p = lo + static_cast<int64_t>(r.next() % static_cast<uint64_t>(hi - lo));
    bool free = true;
    for (int64_t x = p; x < p + c.needle_span; ++x) free &= t.needle_of[x] < 0;
    if (!free) continue;
    for (int64_t x = p; x < p + c.needle_span; ++x) t.needle_of[x] = j;
    ++j;
  }
  for (int64_t x = 0; x < total; ++x)
    if (t.needle_of[x] >= 0) t.needles.push_back(x);
  const int64_t recall_hi = std::max<int64_t>(lo + 1, static_cast<int64_t>(0.9 * c.context_tokens));
  for (int j = 0; j < c.recall_topics; ++j)
    t.recall_pos.push_back(lo + static_cast<int64_t>(r.next() % static_cast<uint64_t>(recall_hi - lo)));
  return t;
}

void axpy(float a, const float* x, float* y, int d) {
  for (int i = 0; i < d; ++i) y[i] += a * x[i];
}

// The decode queries of every step (out.queries), from the heads' directions and the topic centres the keys
// pass at decode positions and recall positions.
void write_queries(const SyntheticConfig& c, const std::vector<HeadDirections>& dirs,
                   const std::vector<std::vector<float>>& centre_at_step,
                   const std::vector<std::vector<float>>& centre_recall, const std::vector<double>& freqs,
                   SyntheticData& out) {
  const int d = c.head_dim, hkv = c.num_heads_kv, group = c.num_heads_q / c.num_heads_kv, half = d / 2;
  const int64_t ctx = c.context_tokens;
  const double sqrt_d = std::sqrt(static_cast<double>(d));
  // Queries. Amplitudes turn logit targets into norms: a component a_q * u in the query against
  // a_k * u in a key adds a_q * a_k / sqrt(d) to the scaled logit.
  const double key_rms = std::sqrt(c.key_bias_norm * c.key_bias_norm + c.topic_key_norm * c.topic_key_norm +
                                   c.word_key_norm * c.word_key_norm + c.local_key_norm * c.local_key_norm +
                                   d * c.key_noise * c.key_noise);
  const double a_topic = c.topic_logit * sqrt_d / c.topic_key_norm;
  const double a_recall = c.recall_logit * sqrt_d / c.topic_key_norm;
  const double a_needle = c.needle_logit * sqrt_d / c.needle_key_norm;
  const double a_local = c.local_logit * sqrt_d / c.local_key_norm;
  const double a_sink = c.sink_logit * sqrt_d / c.sink_key_norm;
  const double q_noise = c.query_noise_logit * sqrt_d / key_rms;  // logit std = q_noise * |k| / sqrt(d)
  const double rho = 1.0 - c.query_drift, innov = std::sqrt(1.0 - rho * rho);
  for (int h = 0; h < hkv; ++h) {
    Rng r(stream_seed(c.seed, 3000 + h));
    const HeadDirections& hd = dirs[h];
    for (int j = 0; j < group; ++j) {
      // Per-head gains, log-normal with mean 1.
      auto gain = [&] { return std::exp(c.head_spread * r.normal() - 0.5 * c.head_spread * c.head_spread); };
      const double g_sink = gain(), g_topic = gain(), g_recall = gain(), g_needle = gain();
      std::vector<double> n(d), w(c.num_needles);
      for (auto& x : n) x = r.normal();
      for (auto& x : w) x = r.normal();
      for (int s = 0; s < c.decode_steps; ++s) {
        if (s > 0) {
          for (auto& x : n) x = rho * x + innov * r.normal();
          for (auto& x : w) x = rho * x + innov * r.normal();
        }
        float* q = &out.queries[(static_cast<size_t>(s) * c.num_heads_q + static_cast<size_t>(h) * group + j) * d];
        for (int x = 0; x < d; ++x) q[x] = static_cast<float>(q_noise * n[x]);
        q[half - 1] = q[d - 1] = 0.0f;  // the sink pair carries only the sink part
        axpy(static_cast<float>(g_topic * a_topic), &centre_at_step[h][static_cast<size_t>(s) * d], q, d);
        for (int k = 0; k < c.recall_topics; ++k)
          axpy(static_cast<float>(g_recall * a_recall), &centre_recall[h][static_cast<size_t>(k) * d], q, d);
        for (int k = 0; k < c.num_needles; ++k)  // needle weight 1 +- 0.3, drifting with the steps
          axpy(static_cast<float>(g_needle * a_needle * std::max(0.0, 1.0 + 0.3 * w[k])),
               &hd.needle[static_cast<size_t>(k) * d], q, d);
        axpy(static_cast<float>(a_local), hd.local.data(), q, d);
        axpy(static_cast<float>(g_sink * a_sink), hd.sink.data(), q, d);
        apply_rope(q, ctx + s, freqs);
      }
    }
  }
}

}  // namespace

SyntheticData generate_synthetic(const SyntheticConfig& c, KvCache& kv) {
  validate(c);
  RETROINFER_CHECK(kv.size() == 0 && kv.num_heads_kv() == c.num_heads_kv && kv.head_dim() == c.head_dim,
                   "synthetic: the KV cache must be empty with ", c.num_heads_kv, " heads of dim ", c.head_dim,
                   ", got ", kv.size(), " tokens of ", kv.num_heads_kv(), " heads of dim ", kv.head_dim());
  const int d = c.head_dim, hkv = c.num_heads_kv;
  const int64_t ctx = c.context_tokens, total = ctx + c.decode_steps;
  const std::vector<double> freqs = rope_freqs(c);

  Rng text_rng(stream_seed(c.seed, 1));
  const Text text = make_text(c, total, text_rng);

  SyntheticData out;
  out.context_tokens = ctx;
  out.decode_steps = c.decode_steps;
  out.needle_positions = text.needles;
  out.token_topic = text.topic;
  for (int64_t p : text.recall_pos) out.recall_topic_ids.push_back(text.topic[p]);
  out.k_step.resize(static_cast<size_t>(c.decode_steps) * hkv * d);
  out.v_step.resize(out.k_step.size());
  out.queries.resize(static_cast<size_t>(c.decode_steps) * c.num_heads_q * d);

  // Drift: an Ornstein-Uhlenbeck walk per KV head in the semantic profile; per-dimension stationary std
  // makes E|drift|^2 = topic_drift^2; step correlation a = exp(-1 / topic_drift_tokens).
  const int half = d / 2;
  std::vector<double> drift_std(d);
  {
    double wsum = 0.0;
    for (int i = 0; i < half; ++i) wsum += 2.0 * std::exp(-(half - 1 - i) / c.semantic_pairs);
    for (int i = 0; i < half; ++i)
      drift_std[i] = drift_std[i + half] = c.topic_drift * std::sqrt(std::exp(-(half - 1 - i) / c.semantic_pairs) / wsum);
  }
  const double drift_a = std::exp(-1.0 / c.topic_drift_tokens), drift_b = std::sqrt(1.0 - drift_a * drift_a);

  std::vector<HeadDirections> dirs;
  std::vector<std::vector<float>> centre_at_step(hkv);    // [hkv][steps, d]: topic centre at decode positions
  std::vector<std::vector<float>> centre_recall(hkv);     // [hkv][recall_topics, d]
  for (int h = 0; h < hkv; ++h) {
    Rng dr(stream_seed(c.seed, 1000 + h));
    dirs.push_back(make_directions(c, dr));
    centre_at_step[h].resize(static_cast<size_t>(c.decode_steps) * d);
    centre_recall[h].resize(static_cast<size_t>(c.recall_topics) * d);
  }

  // Keys and values, in chunks appended to the cache; per-head state carries over between chunks.
  constexpr int64_t kChunk = 4096;
  std::vector<float> kbuf(static_cast<size_t>(kChunk) * hkv * d), vbuf(kbuf.size());
  std::vector<Rng> noise;
  std::vector<std::vector<float>> drift(hkv, std::vector<float>(d));
  for (int h = 0; h < hkv; ++h) {
    noise.emplace_back(stream_seed(c.seed, 2000 + h));
    for (int i = 0; i < d; ++i) drift[h][i] = static_cast<float>(drift_std[i] * noise[h].normal());
  }
  kv.reserve(ctx);
  std::vector<float> centre(d);
  for (int64_t c0 = 0; c0 < total; c0 += kChunk) {
    const int64_t n = std::min(kChunk, total - c0);
    for (int h = 0; h < hkv; ++h) {
      const HeadDirections& hd = dirs[h];
      Rng& r = noise[h];
      std::vector<float>& dr = drift[h];
      for (int64_t i = 0; i < n; ++i) {
        const int64_t t = c0 + i;
        for (int x = 0; x < d; ++x) dr[x] = static_cast<float>(drift_a * dr[x] + drift_b * drift_std[x] * r.normal());
        const int z = text.topic[t];
        std::copy_n(&hd.topic[static_cast<size_t>(z) * d], d, centre.begin());
        axpy(1.0f, dr.data(), centre.data(), d);
        normalize(centre.data(), d);
        if (t >= ctx) std::copy_n(centre.begin(), d, &centre_at_step[h][static_cast<size_t>(t - ctx) * d]);
        for (size_t j = 0; j < text.recall_pos.size(); ++j)
          if (text.recall_pos[j] == t) std::copy_n(centre.begin(), d, &centre_recall[h][j * d]);

        float* k = &kbuf[(static_cast<size_t>(i) * hkv + h) * d];
        float* v = &vbuf[(static_cast<size_t>(i) * hkv + h) * d];
        for (int x = 0; x < d; ++x) {
          k[x] = static_cast<float>(c.key_noise * r.normal());
          v[x] = static_cast<float>(c.value_noise * r.normal());
        }
        if (t < c.sink_tokens) {
          axpy(static_cast<float>((t == 0 ? 1.0 : 0.5) * c.sink_key_norm), hd.sink.data(), k, d);
          std::fill(v, v + d, 0.0f);
          axpy(static_cast<float>(c.sink_value_norm), hd.v_sink.data(), v, d);
        } else if (t < ctx && text.needle_of[t] >= 0) {
          const size_t j = static_cast<size_t>(text.needle_of[t]);
          const size_t w = static_cast<size_t>(text.word[t]);
          axpy(static_cast<float>(c.key_bias_norm), hd.bias.data(), k, d);
          axpy(static_cast<float>(c.needle_key_norm), &hd.needle[j * d], k, d);
          axpy(static_cast<float>(c.word_key_norm), &hd.word[w * d], k, d);
          axpy(static_cast<float>(c.needle_value_norm), &hd.v_needle[j * d], v, d);
          axpy(static_cast<float>(c.value_word_norm), &hd.v_word[w * d], v, d);
        } else {
          const size_t w = static_cast<size_t>(text.word[t]);
          axpy(static_cast<float>(c.key_bias_norm), hd.bias.data(), k, d);
          axpy(static_cast<float>(c.topic_key_norm * text.relevance[t]), centre.data(), k, d);
          axpy(static_cast<float>(c.word_key_norm), &hd.word[w * d], k, d);
          axpy(static_cast<float>(c.local_key_norm), hd.local.data(), k, d);
          axpy(static_cast<float>(c.value_topic_norm), &hd.v_topic[static_cast<size_t>(z) * d], v, d);
          axpy(static_cast<float>(c.value_word_norm), &hd.v_word[w * d], v, d);
        }
        apply_rope(k, t, freqs);
        if (t >= ctx) {
          std::copy_n(k, d, &out.k_step[(static_cast<size_t>(t - ctx) * hkv + h) * d]);
          std::copy_n(v, d, &out.v_step[(static_cast<size_t>(t - ctx) * hkv + h) * d]);
        }
      }
    }
    const int64_t n_ctx = std::clamp<int64_t>(ctx - c0, 0, n);
    if (n_ctx > 0) kv.append(kbuf.data(), vbuf.data(), n_ctx);
  }

  write_queries(c, dirs, centre_at_step, centre_recall, freqs, out);
  return out;
}

}  // namespace retroinfer::eval
