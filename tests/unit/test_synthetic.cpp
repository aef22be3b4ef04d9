// The synthetic attention-data generator: deterministic from its seed, the documented shapes, and the
// attention structure it promises (needles and sinks attract mass, queries drift slowly, topics matter).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/synthetic.h"
#include "retroinfer/error.h"

using namespace retroinfer;
using retroinfer::eval::SyntheticConfig;

namespace {

SyntheticConfig small(uint64_t seed = 5) {
  SyntheticConfig c;
  c.num_heads_q = 8;
  c.num_heads_kv = 2;
  c.head_dim = 128;  // the frequency-profile defaults are made for d = 128
  c.context_tokens = 3000;
  c.decode_steps = 6;
  c.seed = seed;
  c.topic_span = 200.0;  // ~15 segments in 3000 tokens, so that topics differ along the prompt
  return c;
}

bool same_cache(const KvCache& a, const KvCache& b) {
  if (a.size() != b.size() || a.dtype() != b.dtype()) return false;
  for (int h = 0; h < a.num_heads_kv(); ++h)
    for (int64_t t = 0; t < a.size(); ++t)
      if (std::memcmp(a.key_row(h, t), b.key_row(h, t), a.row_bytes()) != 0 ||
          std::memcmp(a.value_row(h, t), b.value_row(h, t), a.row_bytes()) != 0)
        return false;
  return true;
}

// Full-attention probabilities of query head hq of step s over the prompt plus the step tokens <= s.
std::vector<double> probs(const KvCache& kv, const eval::SyntheticData& d, const SyntheticConfig& c, int s, int hq) {
  const int dim = c.head_dim, group = c.num_heads_q / c.num_heads_kv, kvh = hq / group;
  const float* q = &d.queries[(static_cast<size_t>(s) * c.num_heads_q + hq) * dim];
  std::vector<double> p;
  std::vector<float> key(dim);
  auto push = [&](const float* k) {
    double x = 0.0;
    for (int i = 0; i < dim; ++i) x += double(q[i]) * k[i];
    p.push_back(x / std::sqrt(double(dim)));
  };
  for (int64_t t = 0; t < kv.size(); ++t) {
    kv.load_key(kvh, t, key.data());
    push(key.data());
  }
  for (int j = 0; j <= s; ++j) push(&d.k_step[(static_cast<size_t>(j) * c.num_heads_kv + kvh) * dim]);
  double m = -1e300, z = 0.0;
  for (double x : p) m = std::max(m, x);
  for (double& x : p) z += (x = std::exp(x - m));
  for (double& x : p) x /= z;
  return p;
}

}  // namespace

TEST(Synthetic, DeterministicFromSeed) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const SyntheticConfig c = small();
    KvCache a(2, 128, dt), b(2, 128, dt), other(2, 128, dt);
    const auto da = eval::generate_synthetic(c, a);
    const auto db = eval::generate_synthetic(c, b);
    EXPECT_TRUE(same_cache(a, b)) << dtype_name(dt);
    EXPECT_EQ(da.queries, db.queries);
    EXPECT_EQ(da.k_step, db.k_step);
    EXPECT_EQ(da.v_step, db.v_step);
    EXPECT_EQ(da.needle_positions, db.needle_positions);
    const auto dother = eval::generate_synthetic(small(6), other);
    EXPECT_FALSE(same_cache(a, other)) << "seed 6 gave the same cache as seed 5";
    EXPECT_NE(da.queries, dother.queries);
  }
}

TEST(Synthetic, Shapes) {
  const SyntheticConfig c = small();
  KvCache kv(2, 128, DType::kBF16);
  const auto d = eval::generate_synthetic(c, kv);
  EXPECT_EQ(kv.size(), 3000);
  EXPECT_EQ(d.context_tokens, 3000);
  EXPECT_EQ(d.decode_steps, 6);
  EXPECT_EQ(d.k_step.size(), size_t(6) * 2 * 128);
  EXPECT_EQ(d.v_step.size(), size_t(6) * 2 * 128);
  EXPECT_EQ(d.queries.size(), size_t(6) * 8 * 128);
  EXPECT_EQ(d.token_topic.size(), size_t(3006));
  EXPECT_EQ(d.recall_topic_ids.size(), size_t(c.recall_topics));
  ASSERT_EQ(d.needle_positions.size(), size_t(c.num_needles));
  for (size_t i = 0; i < d.needle_positions.size(); ++i) {
    EXPECT_GE(d.needle_positions[i], c.sink_tokens);
    EXPECT_LT(d.needle_positions[i], c.context_tokens - 256);
    if (i > 0) {
      EXPECT_LT(d.needle_positions[i - 1], d.needle_positions[i]);
    }
  }
  for (float x : d.queries) ASSERT_TRUE(std::isfinite(x));
}

TEST(Synthetic, NeedlesAndSinksAttractMassTopicsMatter) {
  const SyntheticConfig c = small(11);
  KvCache kv(2, 128, DType::kF32);
  const auto d = eval::generate_synthetic(c, kv);
  double needle = 0.0, sink = 0.0, topic_ratio = 0.0, sink0_vs_uniform = 0.0;
  std::vector<double> per_needle(d.needle_positions.size(), 0.0);
  int samples = 0, topic_samples = 0;
  for (int s = 0; s < c.decode_steps; ++s) {
    for (int h = 0; h < c.num_heads_q; ++h) {
      const auto p = probs(kv, d, c, s, h);
      for (size_t j = 0; j < d.needle_positions.size(); ++j) {
        needle += p[d.needle_positions[j]];
        per_needle[j] += p[d.needle_positions[j]] * p.size();  // in units of the uniform probability
      }
      for (int t = 0; t < c.sink_tokens; ++t) sink += p[t];
      sink0_vs_uniform += p[0] * p.size();
      // Mean probability of prompt tokens of the query's current topic vs tokens of topics the query does
      // not refer to (neither current nor recalled), needles and the recent window left out.
      const int cur = d.token_topic[c.context_tokens + s];
      double in = 0.0, out = 0.0;
      int n_in = 0, n_out = 0;
      for (int64_t t = c.sink_tokens; t < c.context_tokens - 64; ++t) {
        bool skip = false;
        for (int64_t x : d.needle_positions) skip |= x == t;
        for (int r : d.recall_topic_ids) skip |= d.token_topic[t] == r && r != cur;
        if (skip) continue;
        if (d.token_topic[t] == cur) in += p[t], ++n_in;
        else out += p[t], ++n_out;
      }
      if (n_in > 0 && n_out > 0) topic_ratio += (in / n_in) / (out / n_out), ++topic_samples;
      ++samples;
    }
  }
  needle /= samples;
  sink /= samples;
  ASSERT_GT(topic_samples, 0);
  topic_ratio /= topic_samples;
  // 4 needles of 3006 tokens are 0.13% of the context; the queries target them, so they must hold a large
  // share of the mass (the defaults give ~0.3-0.5) and each must be far above uniform on average over heads
  // (single heads may ignore a needle: the gains and weights vary per head and step).
  EXPECT_GT(needle, 0.2) << "seed 11";
  for (size_t j = 0; j < per_needle.size(); ++j) EXPECT_GT(per_needle[j] / samples, 20.0) << "needle " << j;
  // Token 0 scores sink_logit (10) times the head's gain: on average far above a uniform token, whatever
  // the heads' other targets (the sinks' total share varies a lot between heads: printed for the record).
  EXPECT_GT(sink0_vs_uniform / samples, 100.0) << "seed 11; sink mass " << sink;
  // Tokens of the current topic score up to topic_logit (3) higher: several times the mass of others.
  EXPECT_GT(topic_ratio, 3.0) << "seed 11";
}

TEST(Synthetic, QueriesDriftSlowly) {
  const SyntheticConfig c = small(3);
  KvCache kv(2, 128, DType::kF32);
  const auto d = eval::generate_synthetic(c, kv);
  auto cosine = [&](int s0, int s1, int h) {
    const float* a = &d.queries[(size_t(s0) * c.num_heads_q + h) * c.head_dim];
    const float* b = &d.queries[(size_t(s1) * c.num_heads_q + h) * c.head_dim];
    double ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < c.head_dim; ++i) ab += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
    return ab / std::sqrt(aa * bb);
  };
  double adjacent = 0.0;
  for (int h = 0; h < c.num_heads_q; ++h)
    for (int s = 0; s + 1 < c.decode_steps; ++s) adjacent += cosine(s, s + 1, h);
  adjacent /= c.num_heads_q * (c.decode_steps - 1);
  EXPECT_GT(adjacent, 0.9);
  // Different heads of one group are different queries (per-head gains and noise).
  const float* a = &d.queries[0];
  const float* b = &d.queries[c.head_dim];
  double ab = 0, aa = 0, bb = 0;
  for (int i = 0; i < c.head_dim; ++i) ab += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
  EXPECT_LT(ab / std::sqrt(aa * bb), 0.99);
}

TEST(Synthetic, RejectsBadConfig) {
  KvCache kv(2, 128, DType::kF32);
  auto expect = [&](SyntheticConfig c, const char* needle) {
    try {
      eval::generate_synthetic(c, kv);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  SyntheticConfig c = small();
  c.head_dim = 63;
  expect(c, "head_dim must be even");
  c = small();
  c.context_tokens = 100;
  expect(c, "context_tokens must be >=");
  c = small();
  c.num_heads_q = 7;
  expect(c, "multiple of num_heads_kv");
  c = small();
  c.num_heads_kv = 4;
  c.num_heads_q = 8;
  expect(c, "KV cache must be empty with 4 heads");
  c = small();
  c.query_drift = 0.0;
  expect(c, "query_drift");
}
