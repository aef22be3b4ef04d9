// Prefix reuse on the tiny model fixture: a session that loads a prefilled prefix (SequenceSession::
// load_prefix) and prefills the rest gives the logits and greedy tokens of a cold prefill, bit for bit, for every
// attention method; the prefix cache's hash chain, LRU, references and pins; generate() and the batch
// scheduler with a cache. Skips the model tests when the fixture is absent.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "retroinfer/batch_scheduler.h"
#include "retroinfer/error.h"
#include "retroinfer/generate.h"
#include "retroinfer/model.h"
#include "retroinfer/prefix_cache.h"
#include "retroinfer/sampler.h"
#include "retroinfer/text_generate.h"

#include "error_of.h"
#include "tiny_model_util.h"

namespace retroinfer {
namespace {

constexpr AttentionKind kEveryMethod[] = {AttentionKind::kFull, AttentionKind::kRetro, AttentionKind::kQuest,
                                          AttentionKind::kStreaming, AttentionKind::kOracle};

SessionOptions options(AttentionKind kind) {
  SessionOptions so;
  so.attention.kind = kind;
  so.attention.window_tokens = 16;  // a steady zone under the prompt: retro and the baselines select
  so.attention.tokens_per_cluster = 4;
  so.attention.budget_tokens = 24;
  so.prefill_chunk = 32;
  so.max_context = 400;
  return so;
}

// Greedy continuation of n tokens from the prefill's logits.
std::vector<int32_t> greedy(SequenceSession& s, std::vector<float> logits, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(argmax(logits));
    if (i + 1 < n) s.decode(out.back(), logits);
  }
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A warm prefill's rows against a cold one's: bit for bit where the BLAS computes each row of a product the same
// whatever the product's row count (OpenBLAS on the Intel machines CI ran on), within rounding where it does not
// (OpenBLAS's AMD Zen kernels block short products differently: a chunk cut at the prefix is shorter than the
// cold prefill's).
void expect_cold_logits(const std::vector<float>& got, const std::vector<float>& want) {
  if (same_bits(got, want)) return;
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-3f) << "logit " << i;
}

KvPrefix prefix_of(const Session& s, const std::vector<int32_t>& tokens, int64_t n) {
  KvPrefix p;
  p.tokens.assign(tokens.begin(), tokens.begin() + n);
  p.blocks.push_back(std::make_shared<const KvBlock>(s.export_kv(0, n)));
  return p;
}

TEST(PrefixReuse, LoadedPrefixGivesTheColdPrefillsTokensForEveryMethod) {
  const Model* m = test::tiny_llama3();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  std::vector<int32_t> doc = test::token_stream(180, 5);
  std::vector<int32_t> prompt = doc;
  for (int32_t t : test::token_stream(37, 9)) prompt.push_back(t);
  for (AttentionKind kind : kEveryMethod) {
    SCOPED_TRACE(testing::Message() << "method " << attention_kind_name(kind));
    Session cold(*m, options(kind));
    const std::vector<float> want_logits = cold.prefill(prompt);
    const std::vector<int32_t> want = greedy(cold, want_logits, 12);

    Session first(*m, options(kind));  // prefilled the document alone (another request)
    first.prefill(doc);
    for (int64_t reuse : {int64_t{64}, int64_t{100}, int64_t{180}}) {  // on and off a chunk boundary
      SCOPED_TRACE(testing::Message() << "reused " << reuse);
      Session warm(*m, options(kind));
      warm.load_prefix(prefix_of(first, doc, reuse));
      EXPECT_EQ(warm.position(), reuse);
      const std::vector<float> got_logits = warm.prefill(prompt);
      EXPECT_EQ(warm.position(), static_cast<int64_t>(prompt.size()));
      if (reuse % 32 == 0 || reuse < 160) {
        // Rows the document's prefill ran in whole chunks of 32: the cold prefill's own K/V.
        expect_cold_logits(got_logits, want_logits);
      } else {
        // Rows 160..179 were the document's last, partial chunk (180 keys, not 192): equal up to rounding.
        for (size_t i = 0; i < want_logits.size(); ++i) ASSERT_NEAR(got_logits[i], want_logits[i], 1e-3f) << i;
      }
      EXPECT_EQ(greedy(warm, got_logits, 12), want);
    }
  }
}

TEST(PrefixReuse, SteppedPrefillAfterAPrefixRunsTheRestOnly) {
  const Model* m = test::tiny_llama3();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  const std::vector<int32_t> prompt = test::token_stream(150, 3);
  Session cold(*m, options(AttentionKind::kRetro));
  const std::vector<float> want = cold.prefill(prompt);
  Session warm(*m, options(AttentionKind::kRetro));
  warm.load_prefix(prefix_of(cold, prompt, 70));
  std::vector<int64_t> progress;
  warm.begin_prefill(prompt, [&](int64_t done, int64_t) { progress.push_back(done); });
  while (!warm.prefill_step(32)) {
  }
  expect_cold_logits(warm.take_prefill_logits(), want);
  // The first chunk ends where a cold prefill's does (96), then whole chunks.
  EXPECT_EQ(progress, (std::vector<int64_t>{96, 128, 150}));
}

TEST(PrefixReuse, RetrievalBudgetsByLayerCalibrateAfterAHitAsAfterAColdPrefill) {
  const Model* m = test::tiny_llama3();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  const EngineModel engine(*m);
  SessionOptions so = options(AttentionKind::kRetro);
  so.attention.layer_budget_queries = 16;
  const std::vector<int32_t> doc = test::token_stream(200, 21);
  std::vector<int32_t> prompt = doc;
  for (int32_t t : test::token_stream(5, 4)) prompt.push_back(t);  // fewer new tokens than the 16 queries
  Session cold(*m, so);
  const std::vector<float> want_logits = cold.prefill(prompt);
  const std::vector<double> want_multipliers = cold.layer_budget_multipliers();
  ASSERT_EQ(want_multipliers.size(), static_cast<size_t>(m->config().num_layers));
  const std::vector<int32_t> want = greedy(cold, want_logits, 8);

  PrefixCache cache({.block_tokens = 32, .capacity_bytes = 64 << 20});
  Session first(*m, so);
  first.prefill(doc);
  remember_prefix(cache, first, doc, so.kv_dtype, so.prefill_chunk);  // 192 tokens in 6 blocks
  Session warm(*m, so);
  // 205 - 16 = 189 tokens may be loaded, 160 at the prefill's chunk boundary: the last 45 are prefilled.
  EXPECT_EQ(reuse_prefix(cache, warm, prompt, so.kv_dtype, so.prefill_chunk), 160);
  const std::vector<float> got_logits = warm.prefill(prompt);
  EXPECT_EQ(warm.layer_budget_multipliers(), want_multipliers);
  expect_cold_logits(got_logits, want_logits);
  EXPECT_EQ(greedy(warm, got_logits, 8), want);

  // Uniform budgets load the whole hit.
  SessionOptions uniform = options(AttentionKind::kRetro);
  Session plain(*m, uniform);
  EXPECT_EQ(reuse_prefix(cache, plain, prompt, uniform.kv_dtype, uniform.prefill_chunk), 192);

  // A snapshot's context (generate with a context): the same cut, the cold tokens.
  GenerateOptions g;
  g.max_new_tokens = 8;
  g.ignore_eos = true;
  SessionOptions gso = so;
  gso.max_context = 0;
  const KvPrefix context = prefix_of(first, doc, 200);
  const GenerateSummary hit = generate(engine, gso, prompt, g, {}, nullptr, &context);
  EXPECT_EQ(hit.reused_tokens, 160);
  EXPECT_EQ(hit.tokens, generate(engine, gso, prompt, g).tokens);

  // The cut itself: whole blocks, then a slice of the block it falls in; nothing when the prompt is shorter.
  const KvPrefix hit192 = cache.lookup(prompt, prefix_cache_salt(so.kv_dtype));
  ASSERT_EQ(hit192.size(), 192);
  const KvPrefix cut = calibration_safe_prefix(hit192, 205, so.attention, 0);
  EXPECT_EQ(cut.size(), 189);
  ASSERT_EQ(cut.blocks.size(), 6u);
  EXPECT_EQ(cut.blocks[4], hit192.blocks[4]);  // shared, not copied
  EXPECT_EQ(cut.blocks[5]->tokens, 29);
  EXPECT_EQ(std::memcmp(cut.blocks[5]->run(1, 1, 0), hit192.blocks[5]->run(1, 1, 0), 29 * cut.blocks[5]->row_bytes()),
            0);
  EXPECT_EQ(calibration_safe_prefix(hit192, 12, so.attention, 0).size(), 0);
  EXPECT_EQ(calibration_safe_prefix(hit192, 205, uniform.attention, 0).size(), 192);
}

TEST(PrefixReuse, RefusesWhatDoesNotFit) {
  const Model* m = test::tiny_llama3();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  const std::vector<int32_t> prompt = test::token_stream(80, 3);
  Session s(*m, options(AttentionKind::kFull));
  s.prefill(prompt);
  const KvPrefix p = prefix_of(s, prompt, 64);
  {
    Session t(*m, options(AttentionKind::kFull));
    t.load_prefix(p);
    std::vector<int32_t> other = prompt;
    other[3] ^= 1;
    EXPECT_NE(test::error_of([&] { t.prefill(other); }).find("does not continue the loaded prefix"), std::string::npos);
    const std::vector<int32_t> same(prompt.begin(), prompt.begin() + 64);
    EXPECT_NE(test::error_of([&] { t.prefill(same); }).find("add at least one"), std::string::npos);
    EXPECT_NE(test::error_of([&] { t.prefill(prompt, true); }).find("all_logits after load_prefix"), std::string::npos);
  }
  {
    SessionOptions o = options(AttentionKind::kFull);
    o.kv_dtype = DType::kBF16;
    Session t(*m, o);
    EXPECT_NE(test::error_of([&] { t.load_prefix(p); }).find("--kv-dtype f32"), std::string::npos);
  }
  EXPECT_NE(test::error_of([&] { s.load_prefix(p); }).find("needs a fresh session"), std::string::npos);
  EXPECT_NE(test::error_of([&] { s.export_kv(10, 81); }).find("outside the 80 tokens"), std::string::npos);
}

// A block of `tokens` tokens whose bytes say which range it is (for the cache tests without a model).
KvBlock fake_block(int64_t from, int64_t to) {
  KvBlock b;
  b.num_layers = 1;
  b.num_heads_kv = 1;
  b.head_dim = 4;
  b.dtype = DType::kF32;
  b.tokens = to - from;
  b.bytes.assign(2 * b.run_bytes(), static_cast<uint8_t>(from));
  return b;
}

TEST(PrefixCache, HashChainLongestPrefixAndTheLastTokenPrefilled) {
  PrefixCache c({.block_tokens = 4, .capacity_bytes = 1 << 20});
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  c.insert(a, 7, fake_block);
  EXPECT_EQ(c.stats().blocks, 2);  // two whole blocks; the tail of 2 is not cached
  EXPECT_EQ(c.lookup(a, 7).size(), 8);
  EXPECT_EQ(c.lookup(std::vector<int32_t>(a.begin(), a.begin() + 8), 7).size(), 4) << "the last token is prefilled";
  EXPECT_EQ(c.lookup(a, 8).size(), 0) << "another salt (KV dtype) is another chain";
  std::vector<int32_t> b = a;
  b[5] = 99;  // the second block differs: only the first is reused
  const KvPrefix p = c.lookup(b, 7);
  ASSERT_EQ(p.size(), 4);
  EXPECT_EQ(p.blocks[0]->bytes[0], 0);
  std::vector<int32_t> d = a;
  d[0] = 99;  // the first block differs: the same second block's tokens are not reused (chained)
  EXPECT_EQ(c.lookup(d, 7).size(), 0);
  const PrefixCacheStats s = c.stats();
  EXPECT_EQ(s.lookups, 5);
  EXPECT_EQ(s.hits, 3);
  EXPECT_EQ(s.hit_tokens, 16);
  EXPECT_EQ(s.lookup_tokens, 48);
  EXPECT_NEAR(s.hit_ratio(), 16.0 / 48.0, 1e-12);
}

TEST(PrefixCache, EvictsLeastRecentlyUsedDeepestFirstNeverReferencedOrPinned) {
  const int64_t block_bytes = fake_block(0, 4).bytes.size();
  PrefixCache c({.block_tokens = 4, .capacity_bytes = 3 * block_bytes});
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 0};
  const std::vector<int32_t> b = {11, 12, 13, 14, 15, 16, 17, 18, 0};
  c.insert(a, 0, fake_block);  // a0 a1
  KvPrefix held = c.lookup(a, 0);  // references a0 a1
  c.insert(b, 0, fake_block);  // b0 fits; b1 finds nothing evictable (a referenced, b0 its own parent)
  EXPECT_EQ(c.stats().blocks, 3);
  EXPECT_EQ(c.lookup(b, 0).size(), 4);
  EXPECT_EQ(c.lookup(a, 0).size(), 8) << "referenced blocks are not evicted";
  held = KvPrefix{};
  const std::vector<int32_t> e = {21, 22, 23, 24, 0};
  c.insert(e, 0, fake_block);  // evicts the least recent: b0 (a was looked up after it)
  EXPECT_EQ(c.lookup(b, 0).size(), 0);
  EXPECT_EQ(c.lookup(a, 0).size(), 8);
  c.insert(b, 0, fake_block, /*pinned=*/true);  // evicts e0, then a's deepest block a1 (before its parent)
  EXPECT_EQ(c.lookup(a, 0).size(), 4);
  EXPECT_EQ(c.lookup(b, 0).size(), 8);
  EXPECT_EQ(c.stats().pinned_blocks, 2);
  for (int i = 0; i < 5; ++i) c.insert(std::vector<int32_t>{30 + i, 31, 32, 33, 0}, 0, fake_block);
  EXPECT_EQ(c.lookup(b, 0).size(), 8) << "pinned blocks stay";
  EXPECT_EQ(c.lookup(a, 0).size(), 0);
  EXPECT_EQ(c.stats().evicted_blocks, 8);
  EXPECT_EQ(c.stats().bytes, 3 * block_bytes);
  EXPECT_NE(test::error_of([] { PrefixCache bad({.block_tokens = 0, .capacity_bytes = 1}); }).find("block_tokens"),
            std::string::npos);
}

TEST(PrefixCache, GenerateWithACacheHitGivesTheColdTokens) {
  const Model* m = test::tiny_llama3();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  const EngineModel engine(*m);
  const std::vector<int32_t> doc = test::token_stream(200, 21);
  GenerateOptions g;
  g.max_new_tokens = 10;
  g.ignore_eos = true;
  for (AttentionKind kind : kEveryMethod) {
    SCOPED_TRACE(testing::Message() << "method " << attention_kind_name(kind));
    PrefixCache cache({.block_tokens = 32, .capacity_bytes = 64 << 20});
    SessionOptions so = options(kind);
    so.max_context = 0;
    for (uint32_t question : {1u, 2u}) {
      std::vector<int32_t> prompt = doc;
      for (int32_t t : test::token_stream(20, question)) prompt.push_back(t);
      const GenerateSummary cold = generate(engine, so, prompt, g);
      const GenerateSummary hit = generate(engine, so, prompt, g, {}, &cache);
      EXPECT_EQ(hit.tokens, cold.tokens);
      // The first prompt's whole prefill chunks of 32 (the blocks of 32 tokens within them): 192 of 220.
      EXPECT_EQ(hit.reused_tokens, question == 1 ? 0 : 192);
    }
    EXPECT_EQ(cache.stats().hits, 1);
  }
}

TEST(PrefixCache, BatchSchedulerReusesAcrossRequests) {
  const Model* m = test::tiny_llama3();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  const EngineModel engine(*m);
  // Uniform budgets reuse the document's whole blocks of 16 (144 tokens); budgets by layer calibrated on the last
  // 24 prompt tokens leave them to the prefill: at most 160 - 24, cut to the 32-token chunk (128).
  for (const auto& [queries, reused] : {std::pair{0, 144}, std::pair{24, 128}}) {
    SCOPED_TRACE(testing::Message() << "layer_budget_queries " << queries);
    BatchSchedulerOptions bo;
    bo.session = options(AttentionKind::kRetro);
    bo.session.attention.layer_budget_queries = queries;
    bo.session.max_context = 0;
    bo.prefill_step_tokens = 64;
    bo.prefix_cache =
        std::make_shared<PrefixCache>(PrefixCacheOptions{.block_tokens = 16, .capacity_bytes = 64 << 20});
    BatchScheduler sched(engine, bo);
    const std::vector<int32_t> doc = test::token_stream(150, 8);
    std::vector<GenerateSummary> got;
    for (uint32_t q : {1u, 2u}) {
      BatchRequest r;
      r.prompt = doc;
      for (int32_t t : test::token_stream(10, q)) r.prompt.push_back(t);
      r.options.max_new_tokens = 6;
      r.options.ignore_eos = true;
      const GenerateSummary cold = generate(engine, bo.session, r.prompt, r.options);
      got.push_back(sched.submit(r).result.get());
      EXPECT_EQ(got.back().tokens, cold.tokens);
    }
    EXPECT_EQ(got[0].reused_tokens, 0);
    EXPECT_EQ(got[1].reused_tokens, reused);
    EXPECT_EQ(bo.prefix_cache->stats().hits, 1);
  }
}

TEST(PrefixCache, ReservedCapacityComesOutOfTheModelsMemoryBudget) {
  const std::string path = std::string(RETROINFER_TEST_DATA) + "/models/tiny-llama3";
  if (!test::tiny_llama3()) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  LoadOptions lo;
  lo.tokenizer = "";
  lo.reserved_host_bytes = int64_t{64} << 20;
  const int64_t before = available_memory_bytes();
  const LoadedModel m = load_model(path, lo);
  EXPECT_LE(m.model->memory_limit_bytes(), before - lo.reserved_host_bytes + (int64_t{256} << 20));
  EXPECT_GE(m.model->memory_limit_bytes(), before - lo.reserved_host_bytes - (int64_t{256} << 20));
  lo.reserved_host_bytes = before * 4;
  EXPECT_NE(test::error_of([&] { load_model(path, lo); }).find("(the prefix cache: --prefix-cache-mb) but only"),
            std::string::npos);
}

}  // namespace
}  // namespace retroinfer
