// The server with a prefix cache (`serve --prefix-cache-mb`): a second request about the same document reuses the
// first one's blocks, answers what a server without the cache answers, and /metrics shows the hit ratio.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "server/server_handler.h"
#include "test_server_util.h"

namespace retroinfer {
namespace {

using nlohmann::json;
using namespace test;

TEST(ServerPrefixCache, SecondQuestionReusesTheDocumentAndMetricsShowIt) {
  const Model* m = server_tiny_model();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  std::string doc;
  for (int i = 0; i < 12; ++i) doc += "The ark was three hundred cubits long. ";  // ~470 byte tokens
  server::ServerOptions with = tiny_server_options(AttentionKind::kRetro);
  with.prefix_cache = std::make_shared<PrefixCache>(PrefixCacheOptions{.block_tokens = 64, .capacity_bytes = 64 << 20});
  server::ServerHandler cached(server_tiny_engine(), server_tokenizer(), with);
  server::ServerHandler plain(server_tiny_engine(), server_tokenizer(), tiny_server_options(AttentionKind::kRetro));
  int64_t cached_tokens = -1;
  auto ask = [&](server::ServerHandler& h, const std::string& question) {
    const server::HttpReply r = h.handle(
        "POST", "/v1/completions",
        json{{"prompt", doc + question}, {"max_tokens", 6}, {"temperature", 0}, {"ignore_eos", true}}.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    const json j = json::parse(r.body);
    if (&h == &cached) cached_tokens = j["usage"].value("/prompt_tokens_details/cached_tokens"_json_pointer, int64_t{0});
    return j["choices"][0]["text"].get<std::string>();
  };
  EXPECT_EQ(ask(cached, "How long?"), ask(plain, "How long?"));
  EXPECT_EQ(cached_tokens, 0) << "the first question reuses nothing (no prompt_tokens_details)";
  EXPECT_EQ(ask(cached, "How wide?"), ask(plain, "How wide?"));
  EXPECT_EQ(cached_tokens, with.prefix_cache->stats().hit_tokens) << "usage.prompt_tokens_details.cached_tokens";
  const PrefixCacheStats s = with.prefix_cache->stats();
  EXPECT_EQ(s.lookups, 2);
  EXPECT_EQ(s.hits, 1);
  EXPECT_GE(s.hit_tokens, 384);  // the document's whole chunks of 128, in blocks of 64
  const std::string metrics = cached.metrics().render(true);
  EXPECT_NE(metrics.find("retroinfer_prefix_cache_hits_total 1\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("retroinfer_prefix_cache_hit_ratio 0."), std::string::npos) << metrics;
  EXPECT_EQ(plain.metrics().render(true).find("retroinfer_prefix_cache"), std::string::npos);
}


// The prefix GPU tier's lines: absent on the CPU runner (no tier), rendered from the handler's last copy.
TEST(ServerPrefixCache, GpuTierMetricsRenderTheLastCopy) {
  server::ServerMetrics m;
  EXPECT_EQ(m.render(true).find("retroinfer_prefix_gpu_tier"), std::string::npos);
  PrefixGpuTierStats g;
  g.capacity_bytes = 1 << 30;
  g.held_bytes = 3 << 20;
  g.loaded = 12;
  g.relayed = 2;
  g.dropped = 1;
  m.set_prefix_gpu_tier(g);
  const std::string out = m.render(true);
  EXPECT_NE(out.find("retroinfer_prefix_gpu_tier_bytes 3145728\n"), std::string::npos) << out;
  EXPECT_NE(out.find("retroinfer_prefix_gpu_tier_loaded_blocks_total 12\n"), std::string::npos) << out;
  EXPECT_NE(out.find("retroinfer_prefix_gpu_tier_relayed_blocks_total 2\n"), std::string::npos) << out;
  m.set_prefix_gpu_tier(std::nullopt);
  EXPECT_EQ(m.render(true).find("retroinfer_prefix_gpu_tier"), std::string::npos);
}

}  // namespace
}  // namespace retroinfer
