// Prefix reuse on the CUDA runner (docs/prefix-cache.md): a session that loads a prefilled prefix
// (CudaSession::load_prefix) and prefills the rest gives the greedy tokens of a cold prefill for every attention
// method (its logits within bf16 rounding: the continuation's first chunk runs fewer rows through the products,
// so cuBLAS may sum in another order; tokens are compared up to the first step whose top two logits of the cold
// run are closer than that rounding); export_kv returns what load_prefix took; the engine's prefix cache and a
// snapshot's context in generate() reuse it; sessions it does not serve (host-tier layers) and K/V of another
// shape or dtype are refused with an Error that says what to do. A synthetic head_dim-64 model (the CUDA retro
// kernels take head_dim 64 or 128).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <cmath>
#include <cstring>
#include <memory>

#include "cuda_model_test_util.h"
#include "gpu_test_util.h"
#include "retroinfer/engine_model.h"
#include "retroinfer/error.h"
#include "retroinfer/generate.h"
#include "retroinfer/prefix_cache.h"
#include "retroinfer/sampler.h"
#include "retroinfer/cuda_model.h"

namespace retroinfer {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

constexpr AttentionKind kEveryMethod[] = {AttentionKind::kFull, AttentionKind::kRetro, AttentionKind::kQuest,
                                          AttentionKind::kStreaming, AttentionKind::kOracle};

SessionOptions options(AttentionKind kind) {
  SessionOptions so;
  so.attention.kind = kind;
  so.attention.window_tokens = 16;  // a steady zone under the prompt: retro and the baselines select
  so.attention.tokens_per_cluster = 4;
  so.attention.budget_tokens = 24;
  so.kv_dtype = DType::kBF16;
  so.prefill_chunk = 64;
  so.max_context = 400;
  so.kv_placement.placement = KvPlacement::kGpu;
  return so;
}

// Greedy continuation of n tokens from the prefill's logits, with each step's top-two margin relative to the
// logits' range.
struct Greedy {
  std::vector<int32_t> tokens;
  std::vector<float> margin;
};
Greedy greedy(SequenceSession& s, std::vector<float> logits, int n) {
  Greedy g;
  for (int i = 0; i < n; ++i) {
    std::vector<float> sorted = logits;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    const auto [lo, hi] = std::minmax_element(logits.begin(), logits.end());
    g.margin.push_back((sorted[0] - sorted[1]) / std::max(1e-6f, *hi - *lo));
    g.tokens.push_back(argmax(logits));
    if (i + 1 < n) s.decode(g.tokens.back(), logits);
  }
  return g;
}

// warm's tokens equal cold's up to the first step where cold's top two are within `tie` of the range (past a
// near tie, rounding may pick the other token and the continuations part).
void expect_same_tokens(const Greedy& warm, const Greedy& cold, float tie) {
  ASSERT_EQ(warm.tokens.size(), cold.tokens.size());
  for (size_t i = 0; i < cold.tokens.size(); ++i) {
    if (cold.margin[i] < tie) break;
    EXPECT_EQ(warm.tokens[i], cold.tokens[i]) << "step " << i;
    if (warm.tokens[i] != cold.tokens[i]) break;
  }
}

// A synthetic head_dim-64 model on the CUDA runner (with a prefix GPU tier of gpu_tier_bytes) and 300 random
// tokens.
struct SyntheticEngine {
  explicit SyntheticEngine(int64_t gpu_tier_bytes = 0)
      : engine(*m, EngineOptions{Device::kCuda, DeviceWeights::kBf16, gpu_tier_bytes}) {}
  ModelConfig c = gputest::synthetic_config(64);
  gputest::MemoryModelFile f{c, 11};
  std::unique_ptr<Model> m = Model::load(f);
  EngineModel engine;
  std::vector<int32_t> tokens = gputest::random_tokens(300, c.vocab_size, 5);
  PrefixGpuTierStats tier() const { return engine.prefix_gpu_tier_stats().value(); }
};

KvPrefix prefix_of(const SequenceSession& s, const std::vector<int32_t>& tokens, int64_t n) {
  KvPrefix p;
  p.tokens.assign(tokens.begin(), tokens.begin() + n);
  p.blocks.push_back(std::make_shared<const KvBlock>(s.export_kv(0, n)));
  return p;
}

TEST(CudaPrefix, LoadedPrefixGivesTheColdPrefillsTokensForEveryMethod) {
  RETROINFER_REQUIRE_GPU();
  const SyntheticEngine se;
  const EngineModel& engine = se.engine;
  const std::vector<int32_t>& tokens = se.tokens;
  // A first request over the document (200 tokens), then a second with another question after it.
  const std::vector<int32_t> first(tokens.begin(), tokens.begin() + 230);
  std::vector<int32_t> second(tokens.begin(), tokens.begin() + 200);
  second.insert(second.end(), tokens.begin() + 250, tokens.begin() + 290);
  for (AttentionKind kind : kEveryMethod) {
    SCOPED_TRACE(attention_kind_name(kind));
    const SessionOptions so = options(kind);
    auto cold = make_session(engine, so);
    const std::vector<float> cold_logits = cold->prefill(second);
    const Greedy want = greedy(*cold, cold_logits, 12);

    auto a = make_session(engine, so);
    ASSERT_TRUE(a->supports_prefix());
    a->prefill(first);
    for (int64_t reuse : {int64_t{200}, int64_t{128}, int64_t{64}, int64_t{37}}) {  // on and off chunk boundaries
      SCOPED_TRACE(reuse);
      const KvPrefix p = prefix_of(*a, first, reuse);
      auto warm = make_session(engine, so);
      warm->load_prefix(p);
      EXPECT_EQ(warm->position(), reuse);
      // What went in comes out.
      const KvBlock back = warm->export_kv(0, reuse);
      ASSERT_EQ(back.bytes.size(), p.blocks[0]->bytes.size());
      EXPECT_EQ(std::memcmp(back.bytes.data(), p.blocks[0]->bytes.data(), back.bytes.size()), 0);
      const std::vector<float> warm_logits = warm->prefill(second);
      EXPECT_EQ(warm->position(), static_cast<int64_t>(second.size()));
      float worst = 0.0f, range = 0.0f;
      for (size_t i = 0; i < cold_logits.size(); ++i) {
        worst = std::max(worst, std::fabs(warm_logits[i] - cold_logits[i]));
        range = std::max(range, std::fabs(cold_logits[i]));
      }
      EXPECT_LE(worst, 0.02f * range) << "the last position's logits after the prefix";
      expect_same_tokens(greedy(*warm, warm_logits, 12), want, 0.04f);
    }
  }
}

TEST(CudaPrefix, EngineCacheAndSnapshotContextGiveTheColdTokens) {
  RETROINFER_REQUIRE_GPU();
  const SyntheticEngine se;
  const EngineModel& engine = se.engine;
  const std::vector<int32_t>& tokens = se.tokens;
  const SessionOptions so = options(AttentionKind::kRetro);
  GenerateOptions g;
  g.max_new_tokens = 10;
  g.ignore_eos = true;
  const std::vector<int32_t> doc(tokens.begin(), tokens.begin() + 192);
  std::vector<int32_t> q1 = doc, q2 = doc;
  q1.insert(q1.end(), tokens.begin() + 200, tokens.begin() + 220);
  q2.insert(q2.end(), tokens.begin() + 230, tokens.begin() + 260);
  const GenerateSummary cold = generate(engine, so, q2, g);

  PrefixCache cache({.block_tokens = 32, .capacity_bytes = 64 << 20});
  generate(engine, so, q1, g, {}, &cache);  // fills the cache with q1's blocks
  const GenerateSummary hit = generate(engine, so, q2, g, {}, &cache);
  EXPECT_EQ(hit.tokens, cold.tokens);
  EXPECT_GE(cache.stats().hit_tokens, 192);

  // A snapshot's context: the document's K/V from a CUDA session.
  auto s = make_session(engine, so);
  s->prefill(doc);
  const KvPrefix ctx = prefix_of(*s, doc, static_cast<int64_t>(doc.size()));
  const GenerateSummary snap = generate(engine, so, q2, g, {}, nullptr, &ctx);
  EXPECT_EQ(snap.tokens, cold.tokens);
}

TEST(CudaPrefix, RefusesWhatItDoesNotServeWithAClearError) {
  RETROINFER_REQUIRE_GPU();
  const SyntheticEngine se;
  const EngineModel& engine = se.engine;
  const std::vector<int32_t>& tokens = se.tokens;
  const std::vector<int32_t> doc(tokens.begin(), tokens.begin() + 100);
  auto a = make_session(engine, options(AttentionKind::kFull));
  a->prefill(doc);
  const KvPrefix p = prefix_of(*a, doc, 64);

  // Host-tier layers (retro's wave buffer) are not copied.
  SessionOptions host = options(AttentionKind::kRetro);
  host.kv_placement.placement = KvPlacement::kHost;
  auto h = make_session(engine, host);
  EXPECT_FALSE(h->supports_prefix());
  EXPECT_NE(error_of([&] { h->load_prefix(p); }).find("--kv-placement gpu"), std::string::npos);

  // K/V of another dtype (a CPU f32 session's) or shape.
  KvPrefix f32 = p;
  auto b = std::make_shared<KvBlock>(*p.blocks[0]);
  b->dtype = DType::kF32;
  b->bytes.resize(b->bytes.size() * 2);
  f32.blocks = {b};
  auto s1 = make_session(engine, options(AttentionKind::kFull));
  EXPECT_NE(error_of([&] { s1->load_prefix(f32); }).find("bf16"), std::string::npos);
  KvPrefix other = p;
  auto o = std::make_shared<KvBlock>(*p.blocks[0]);
  o->num_layers += 1;
  other.blocks = {o};
  EXPECT_NE(error_of([&] { s1->load_prefix(other); }).find("another model"), std::string::npos);
  // A prompt that does not continue the prefix, and a second load.
  s1->load_prefix(p);
  EXPECT_NE(error_of([&] { s1->load_prefix(p); }).find("fresh session"), std::string::npos);
  std::vector<int32_t> wrong(doc.begin(), doc.begin() + 80);
  wrong[3] ^= 1;
  EXPECT_NE(error_of([&] { s1->prefill(wrong); }).find("does not continue the loaded prefix"), std::string::npos);
  EXPECT_NE(error_of([&] { s1->export_kv(0, 65); }).find("outside"), std::string::npos);
}


// The prefix cache's GPU tier: blocks exported by a session get device copies, a hit loads them inside the GPU
// (no block relayed) and generates the cold prefill's tokens; a tier too small for every block drops the least
// recently used copies, and those blocks load from host memory with the same result.
TEST(CudaPrefix, GpuTierLoadsCopiesInsideTheGpuWithTheColdTokens) {
  RETROINFER_REQUIRE_GPU();
  const SessionOptions so = options(AttentionKind::kRetro);
  GenerateOptions g;
  g.max_new_tokens = 10;
  g.ignore_eos = true;
  const ModelConfig c = gputest::synthetic_config(64);
  const int64_t block_bytes = 2LL * c.num_layers * c.num_heads_kv * 32 * c.head_dim * 2;  // 32-token blocks, bf16
  for (const int64_t tier_blocks : {int64_t{64}, int64_t{3}}) {
    SCOPED_TRACE(tier_blocks);
    const SyntheticEngine se(tier_blocks * block_bytes);
    const std::vector<int32_t> doc(se.tokens.begin(), se.tokens.begin() + 192);  // 6 blocks
    std::vector<int32_t> q1 = doc, q2 = doc;
    q1.insert(q1.end(), se.tokens.begin() + 200, se.tokens.begin() + 220);
    q2.insert(q2.end(), se.tokens.begin() + 230, se.tokens.begin() + 260);
    const GenerateSummary cold = generate(se.engine, so, q2, g);
    PrefixCache cache({.block_tokens = 32, .capacity_bytes = 64 << 20});
    generate(se.engine, so, q1, g, {}, &cache);
    const PrefixGpuTierStats filled = se.tier();
    EXPECT_EQ(filled.made, 6);
    EXPECT_EQ(filled.copies, std::min<int64_t>(6, tier_blocks));
    EXPECT_EQ(filled.held_bytes, filled.copies * block_bytes);
        const GenerateSummary hit = generate(se.engine, so, q2, g, {}, &cache);
    EXPECT_EQ(hit.tokens, cold.tokens);
    const PrefixGpuTierStats after = se.tier();
    EXPECT_EQ(after.loaded, std::min<int64_t>(6, tier_blocks));
    EXPECT_EQ(after.relayed, 6 - after.loaded);
  }
}

// Sessions plan with the tier's unused capacity held back, and a block's copy goes with the block.
TEST(CudaPrefix, GpuTierCapacityIsHeldBackFromSessionsAndFreedWithItsBlocks) {
  RETROINFER_REQUIRE_GPU();
  const SessionOptions so = options(AttentionKind::kFull);
  const int64_t tier_bytes = int64_t{1} << 30;
  const SyntheticEngine plain, tiered(tier_bytes);
  const auto free_of = [&](const EngineModel& e) {
    auto s = make_session(e, so);
    return dynamic_cast<cuda::CudaSequenceSession&>(*s).session().memory_plan().gpu_free_bytes;
  };
  const int64_t without = free_of(plain.engine), with = free_of(tiered.engine);
  EXPECT_NEAR(static_cast<double>(without - with), static_cast<double>(tier_bytes), 64.0 * (1 << 20));
  auto s = make_session(tiered.engine, so);
  s->prefill(std::vector<int32_t>(tiered.tokens.begin(), tiered.tokens.begin() + 100));
  {
    const KvBlock b = s->export_kv(0, 64);
    EXPECT_NE(b.device_copy, nullptr);
    EXPECT_EQ(tiered.tier().copies, 1);
    EXPECT_EQ(slice_kv(b, 0, 32).device_copy, nullptr) << "a slice is not the copy's block";
  }
  EXPECT_EQ(tiered.tier().copies, 0);
  EXPECT_EQ(tiered.tier().held_bytes, 0);
  // Not on the cpu.
  EXPECT_NE(error_of([&] { EngineModel(*plain.m, EngineOptions{Device::kCpu, DeviceWeights::kBf16, 1 << 20}); })
                .find("--prefix-cache-gpu-mb"),
            std::string::npos);
}

// copy_device_pieces: many small 2-D copies in one launch, 16-byte and byte-wise.
TEST(CudaPrefix, CopyDevicePiecesCopiesEveryPiece) {
  RETROINFER_REQUIRE_GPU();
  std::vector<uint8_t> host(1 << 16);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(i * 131 + 7);
  cuda::DeviceBuffer src(host.size()), dst(host.size());
  src.upload(host.data(), host.size());
  dst.fill_bytes(0);
  auto* s = src.as<const uint8_t>();
  auto* d = dst.as<uint8_t>();
  // 3 rows of 64 bytes (pitches 128 / 80), then 5 rows of 13 bytes at odd offsets (pitches 17 / 29).
  const std::vector<cuda::DeviceCopyPiece> pieces{{s, d, 64, 3, 128, 80}, {s + 1001, d + 4001, 13, 5, 17, 29}};
  cuda::copy_device_pieces(pieces, nullptr);
  std::vector<uint8_t> out(host.size());
  dst.download(out.data(), out.size());
  std::vector<uint8_t> want(host.size(), 0);
  for (const auto& p : pieces)
    for (uint64_t r = 0; r < p.rows; ++r)
      std::memcpy(want.data() + (p.dst - d) + r * p.dst_pitch, host.data() + (p.src - s) + r * p.src_pitch, p.width);
  EXPECT_EQ(out, want);
}

}  // namespace
}  // namespace retroinfer
