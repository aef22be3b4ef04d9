// The baselines (streaming, quest, oracle) on tiny caches whose selections and outputs are worked out by
// hand, plus exactness properties: every method equals full attention when its budget covers everything.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "retroinfer/attention.h"
#include "retroinfer/error.h"

using namespace retroinfer;

namespace {

// One KV head; keys[t] and values[t] are rows of head_dim floats.
KvCache make_cache(const std::vector<std::vector<float>>& keys, const std::vector<std::vector<float>>& values,
                   DType dt = DType::kF32) {
  const int d = static_cast<int>(keys.at(0).size());
  KvCache kv(1, d, dt);
  for (size_t t = 0; t < keys.size(); ++t) kv.append(keys[t].data(), values[t].data(), 1);
  return kv;
}

AttentionConfig config(AttentionKind kind, int sink, int window, int64_t budget, int page = 2) {
  AttentionConfig c;
  c.quest_page_tokens = page;
  c.kind = kind;
  c.scale = 1.0f;  // logits are plain dot products in the hand-worked cases
  c.sink_tokens = sink;
  c.window_tokens = window;
  c.budget_tokens = budget;
  return c;
}

std::set<int64_t> exact_set(const AttentionMethod& m, int kvh = 0) {
  std::vector<uint8_t> z;
  EXPECT_TRUE(m.last_zones(kvh, z));
  std::set<int64_t> s;
  for (size_t t = 0; t < z.size(); ++t) {
    EXPECT_NE(z[t], AttentionMethod::kZoneEstimated) << "baselines never estimate (token " << t << ")";
    if (z[t] == AttentionMethod::kZoneExact) s.insert(static_cast<int64_t>(t));
  }
  return s;
}

// Softmax-weighted mean of values (t, 1) of the listed tokens with the listed logits.
std::vector<float> weighted(const std::vector<int64_t>& tokens, const std::vector<double>& logits) {
  double den = 0.0, num = 0.0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    den += std::exp(logits[i]);
    num += std::exp(logits[i]) * static_cast<double>(tokens[i]);
  }
  return {static_cast<float>(num / den), 1.0f};
}

std::vector<std::vector<float>> token_values(int n) {
  std::vector<std::vector<float>> v(n);
  for (int t = 0; t < n; ++t) v[t] = {static_cast<float>(t), 1.0f};
  return v;
}

}  // namespace

TEST(Streaming, ReadsSinksAndExtendedWindow) {
  // 10 tokens, zero keys (uniform attention), values (t, 1). sink 1, window 2, budget 2:
  // reads token 0 and the last 2 + 2 tokens {6, 7, 8, 9}; output = mean of {0, 6, 7, 8, 9} = 6.
  const auto kv = make_cache(std::vector<std::vector<float>>(10, {0.0f, 0.0f}), token_values(10));
  auto m = make_attention(config(AttentionKind::kStreaming, 1, 2, 2), {1, 1, 2});
  const float q[2] = {0.3f, -0.7f};
  float out[2] = {-1.0f, -1.0f};
  const AttentionStats st = m->decode(kv, q, out);
  EXPECT_EQ(st.exact_tokens, 5);
  EXPECT_EQ(st.context_tokens, 10);
  EXPECT_EQ(exact_set(*m), (std::set<int64_t>{0, 6, 7, 8, 9}));
  EXPECT_NEAR(out[0], 6.0f, 1e-5f);
  EXPECT_NEAR(out[1], 1.0f, 1e-6f);
}

TEST(Streaming, DerivesBudgetFromRetrievalFraction) {
  // 12 tokens, sink 1, window 3: indexed = 8, budget = round(0.25 * 8) = 2 -> {0} ∪ [7, 12).
  const auto kv = make_cache(std::vector<std::vector<float>>(12, {0.0f, 0.0f}), token_values(12));
  auto c = config(AttentionKind::kStreaming, 1, 3, -1);
  c.retrieval_fraction = 0.25;
  c.estimation_fraction = 0.0;
  auto m = make_attention(c, {1, 1, 2});
  const float q[2] = {1.0f, 1.0f};
  float out[2];
  EXPECT_EQ(m->decode(kv, q, out).exact_tokens, 6);
  EXPECT_EQ(exact_set(*m), (std::set<int64_t>{0, 7, 8, 9, 10, 11}));
  EXPECT_NEAR(out[0], (0 + 7 + 8 + 9 + 10 + 11) / 6.0f, 1e-5f);
}

namespace {
// Quest case: sink 1, window 2, page 2, 10 tokens: pages p0 = {1,2}, p1 = {3,4}, p2 = {5,6}; token 7 is a
// partial page (exact); {8, 9} the window. q = (1, -1), so a page's bound = max key[0] - min key[1].
//   p0: (0,0) (0,0)   -> bound 0; true logits 0, 0
//   p1: (3,5) (-1,0)  -> bound 3 - 0 = 3; true logits -2, -1 (Quest's bound overestimates this page)
//   p2: (1,-1) (1,-1) -> bound 1 + 1 = 2; true logits 2, 2
std::vector<std::vector<float>> quest_keys() {
  return {{0, 0}, {0, 0}, {0, 0}, {3, 5}, {-1, 0}, {1, -1}, {1, -1}, {0, 0}, {0, 0}, {0, 0}};
}
}  // namespace

TEST(Quest, PicksPagesByMinMaxBound) {
  const auto kv = make_cache(quest_keys(), token_values(10));
  const float q[2] = {1.0f, -1.0f};
  float out[2];
  {  // budget 2 tokens = 1 page: p1 (bound 3) wins although its true logits are the lowest.
    auto m = make_attention(config(AttentionKind::kQuest, 1, 2, 2), {1, 1, 2});
    m->on_prefill(kv);
    EXPECT_EQ(m->decode(kv, q, out).exact_tokens, 6);
    EXPECT_EQ(exact_set(*m), (std::set<int64_t>{0, 3, 4, 7, 8, 9}));
    const auto want = weighted({0, 3, 4, 7, 8, 9}, {0, -2, -1, 0, 0, 0});
    EXPECT_NEAR(out[0], want[0], 1e-5f);
    EXPECT_NEAR(out[1], want[1], 1e-6f);
  }
  {  // budget 4 = 2 pages: p1 and p2.
    auto m = make_attention(config(AttentionKind::kQuest, 1, 2, 4), {1, 1, 2});
    m->on_prefill(kv);
    EXPECT_EQ(m->decode(kv, q, out).exact_tokens, 8);
    EXPECT_EQ(exact_set(*m), (std::set<int64_t>{0, 3, 4, 5, 6, 7, 8, 9}));
    const auto want = weighted({0, 3, 4, 5, 6, 7, 8, 9}, {0, -2, -1, 2, 2, 0, 0, 0});
    EXPECT_NEAR(out[0], want[0], 1e-5f);
  }
  {  // budget 1 token < 1 page still reads one page; budget 0 reads none.
    auto m = make_attention(config(AttentionKind::kQuest, 1, 2, 1), {1, 1, 2});
    EXPECT_EQ(m->decode(kv, q, out).exact_tokens, 6);  // also works without on_prefill
    EXPECT_EQ(exact_set(*m), (std::set<int64_t>{0, 3, 4, 7, 8, 9}));
    auto m0 = make_attention(config(AttentionKind::kQuest, 1, 2, 0), {1, 1, 2});
    EXPECT_EQ(m0->decode(kv, q, out).exact_tokens, 4);
    EXPECT_EQ(exact_set(*m0), (std::set<int64_t>{0, 7, 8, 9}));
  }
}

TEST(Quest, BuildsNewPagesDuringDecode) {
  // Token 8 gets key (9, -9) but sits in the window at 10 tokens, so p1 still wins then. After 2 more
  // tokens (size 12) the region is [1, 10): page p3 = {7, 8} is built (bound 9 + 9 = 18, the best) and
  // token 9 is a partial page.
  auto keys = quest_keys();
  keys[8] = {9, -9};
  auto kv = make_cache(keys, token_values(10));
  auto m = make_attention(config(AttentionKind::kQuest, 1, 2, 2), {1, 1, 2});
  m->on_prefill(kv);
  const float q[2] = {1.0f, -1.0f};
  float out[2];
  EXPECT_EQ(m->decode(kv, q, out).exact_tokens, 6);
  EXPECT_EQ(exact_set(*m), (std::set<int64_t>{0, 3, 4, 7, 8, 9}));
  const float k_new[2] = {0, 0}, v10[2] = {10, 1}, v11[2] = {11, 1};
  kv.append(k_new, v10, 1);
  kv.append(k_new, v11, 1);
  EXPECT_EQ(m->decode(kv, q, out).exact_tokens, 6);
  EXPECT_EQ(exact_set(*m), (std::set<int64_t>{0, 7, 8, 9, 10, 11}));
  const auto want = weighted({0, 7, 8, 9, 10, 11}, {0, 0, 18, 0, 0, 0});
  EXPECT_NEAR(out[0], want[0], 1e-4f);
}

TEST(Quest, GroupScoreIsMaxOverHeads) {
  // Two query heads share one KV head. Pages (sink 0, window 0, page 1): p0 key (1, 0), p1 key (0, 1).
  // Head A q = (5, 1): bounds p0 5, p1 1. Head B q = (-3, 4): bounds p0 -3, p1 4.
  // max over heads: p0 5 > p1 4 -> p0; a sum (2 vs 5) would pick p1.
  const auto kv = make_cache({{1, 0}, {0, 1}}, {{0, 1}, {1, 1}});
  auto m = make_attention(config(AttentionKind::kQuest, 0, 0, 1, 1), {2, 1, 2});
  const float q[4] = {5, 1, -3, 4};
  float out[4];
  m->decode(kv, q, out);
  EXPECT_EQ(exact_set(*m), (std::set<int64_t>{0}));
  EXPECT_NEAR(out[0], 0.0f, 1e-6f);  // one token read: the output is its value (0, 1)
  EXPECT_NEAR(out[3], 1.0f, 1e-6f);
}

TEST(Oracle, PicksTopTokensByTrueScore) {
  // q = (1, 0), keys (s_t, 0): logits s = [0, 5, -1, 3, 4, -2, 0, 0]; sink 1, window 1, budget 2:
  // region [1, 7) -> top 2 are tokens 1 (5) and 4 (4); reads {0, 1, 4, 7}.
  const std::vector<float> s = {0, 5, -1, 3, 4, -2, 0, 0};
  std::vector<std::vector<float>> keys;
  for (float x : s) keys.push_back({x, 0.0f});
  const auto kv = make_cache(keys, token_values(8));
  auto m = make_attention(config(AttentionKind::kOracle, 1, 1, 2), {1, 1, 2});
  const float q[2] = {1.0f, 0.0f};
  float out[2];
  EXPECT_EQ(m->decode(kv, q, out).exact_tokens, 4);
  EXPECT_EQ(exact_set(*m), (std::set<int64_t>{0, 1, 4, 7}));
  const auto want = weighted({0, 1, 4, 7}, {0, 5, 4, 0});
  EXPECT_NEAR(out[0], want[0], 1e-5f);
}

TEST(Oracle, GqaSelectionMatchesBruteForceSummedProbability) {
  // 2 KV heads x group 3, random keys; the chosen set must be the top-k of Σ_h softmax_h (computed here in
  // double over the whole cache).
  const int hq = 6, hkv = 2, d = 8, n = 300;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> k(static_cast<size_t>(n) * hkv * d), v(k.size()), q(static_cast<size_t>(hq) * d);
  for (auto& x : k) x = 2.0f * nd(rng);
  for (auto& x : v) x = nd(rng);
  for (auto& x : q) x = nd(rng);
  KvCache kv(hkv, d, DType::kF32);
  kv.append(k.data(), v.data(), n);
  auto c = config(AttentionKind::kOracle, 4, 16, 20);
  c.scale = 0.0f;  // default 1/sqrt(d)
  auto m = make_attention(c, {hq, hkv, d});
  std::vector<float> out(q.size());
  m->decode(kv, q.data(), out.data());
  for (int h = 0; h < hkv; ++h) {
    std::vector<double> score(n, 0.0);
    for (int j = 0; j < 3; ++j) {
      std::vector<double> l(n);
      double mx = -1e300, z = 0.0;
      for (int t = 0; t < n; ++t) {
        double dot = 0.0;
        for (int i = 0; i < d; ++i)
          dot += double(q[(h * 3 + j) * d + i]) * k[(static_cast<size_t>(t) * hkv + h) * d + i];
        l[t] = dot / std::sqrt(double(d));
        mx = std::max(mx, l[t]);
      }
      for (int t = 0; t < n; ++t) z += std::exp(l[t] - mx);
      for (int t = 0; t < n; ++t) score[t] += std::exp(l[t] - mx) / z;
    }
    std::vector<int> idx;
    for (int t = 4; t < n - 16; ++t) idx.push_back(t);
    std::sort(idx.begin(), idx.end(), [&](int a, int b) { return score[a] > score[b]; });
    std::set<int64_t> want;
    for (int t = 0; t < 4; ++t) want.insert(t);
    for (int t = n - 16; t < n; ++t) want.insert(t);
    for (int i = 0; i < 20; ++i) want.insert(idx[i]);
    EXPECT_EQ(exact_set(*m, h), want) << "kv head " << h;
  }
}

// Every baseline equals full attention once its budget covers the whole non-steady region; the oracle
// also when only k covers it. Random GQA data in both storage dtypes; tolerance: the same f32 online
// softmax over the same tokens in a different order differs by a few ulps of O(1) outputs -> 1e-5.
TEST(Baselines, EqualFullWhenBudgetCoversEverything) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int n : {1, 3, 17, 100, 131}) {
      const int hq = 8, hkv = 2, d = 16;
      std::mt19937 rng(1000 + n);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> k(static_cast<size_t>(n) * hkv * d), v(k.size()), q(static_cast<size_t>(hq) * d);
      for (auto& x : k) x = 1.5f * nd(rng);
      for (auto& x : v) x = nd(rng);
      for (auto& x : q) x = nd(rng);
      KvCache kv(hkv, d, dt);
      kv.append(k.data(), v.data(), n);
      AttentionConfig cf;
      cf.kind = AttentionKind::kFull;
      std::vector<float> ref(q.size());
      make_attention(cf, {hq, hkv, d})->decode(kv, q.data(), ref.data());
      for (AttentionKind kind : {AttentionKind::kStreaming, AttentionKind::kQuest, AttentionKind::kOracle}) {
        for (bool by_fraction : {false, true}) {
          AttentionConfig c;
          c.kind = kind;
          c.quest_page_tokens = 5;  // region sizes are not multiples of it: partial pages are exact too
          if (by_fraction) {
            c.retrieval_fraction = 1.0;
            c.estimation_fraction = 0.0;
          } else {
            c.budget_tokens = n;
          }
          auto m = make_attention(c, {hq, hkv, d});
          m->on_prefill(kv);
          std::vector<float> out(q.size(), NAN);
          const AttentionStats st = m->decode(kv, q.data(), out.data());
          EXPECT_EQ(st.exact_tokens, static_cast<int64_t>(n) * hkv) << attention_kind_name(kind) << " n=" << n;
          EXPECT_EQ(st.context_tokens, static_cast<int64_t>(n) * hkv);
          for (size_t i = 0; i < out.size(); ++i)
            ASSERT_NEAR(out[i], ref[i], 1e-5f) << attention_kind_name(kind) << " n=" << n << " dtype "
                                               << dtype_name(dt) << " i=" << i;
        }
      }
    }
  }
}

TEST(Baselines, ExactTokensMatchZonesAndBudget) {
  // A 1000-token cache, sink 4, window 64, budget derived from 1.8%: indexed 932, budget round(16.776) = 17.
  const int hq = 4, hkv = 1, d = 8, n = 1000;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> k(static_cast<size_t>(n) * d), v(k.size()), q(static_cast<size_t>(hq) * d);
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  for (auto& x : q) x = nd(rng);
  KvCache kv(hkv, d, DType::kBF16);
  kv.append(k.data(), v.data(), n);
  // streaming / oracle: 4 + 64 + 17; quest: 17 / 16 = 1 page, plus 932 % 16 = 4 partial-page tokens.
  const std::pair<AttentionKind, int64_t> want[] = {
      {AttentionKind::kStreaming, 85}, {AttentionKind::kOracle, 85}, {AttentionKind::kQuest, 4 + 64 + 16 + 4}};
  for (const auto& [kind, exact] : want) {
    AttentionConfig c;
    c.kind = kind;
    auto m = make_attention(c, {hq, hkv, d});
    m->on_prefill(kv);
    std::vector<float> out(q.size());
    EXPECT_EQ(m->decode(kv, q.data(), out.data()).exact_tokens, exact) << attention_kind_name(kind);
    EXPECT_EQ(static_cast<int64_t>(exact_set(*m).size()), exact) << attention_kind_name(kind);
  }
}
