// The KV placement options of every face (SessionOptions::kv_placement, engine_model.h): range checks, the
// CPU runner refusing an explicit gpu / split / host placement by name, the per-method placement of the
// multi-method commands (eval, bench generate), the JSON fields of the report, and the eval report's
// aggregation of host-tier lines. No GPU needed.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "engine/kv_placement_json.h"
#include "eval/eval_report.h"
#include "retroinfer/engine_model.h"
#include "retroinfer/error.h"
#include "retroinfer/model.h"

#include "error_of.h"
#include "tiny_model_util.h"

namespace retroinfer {
namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(KvPlacementOptions, DefaultsAreAutoAndTheWaveBufferDefaults) {
  const KvPlacementOptions kv;
  EXPECT_EQ(kv.placement, KvPlacement::kAuto);
  EXPECT_EQ(kv.gpu_layers, -1);
  EXPECT_EQ(kv.cache_fraction, WaveBufferConfig{}.cache_fraction);
  EXPECT_EQ(kv.page_tokens, 0);  // the cluster size, at most WaveBufferConfig{}.page_tokens
  EXPECT_EQ(SessionOptions{}.kv_placement.placement, KvPlacement::kAuto);
  // auto is what the CPU runner takes, and any placement passes on the CUDA side of the check.
  EXPECT_NO_THROW(validate_kv_placement(kv, Device::kCpu));
  for (KvPlacement p : {KvPlacement::kAuto, KvPlacement::kGpu, KvPlacement::kSplit, KvPlacement::kHost}) {
    KvPlacementOptions k;
    k.placement = p;
    EXPECT_NO_THROW(validate_kv_placement(k, Device::kCuda)) << buffer::kv_placement_name(p);
  }
}

TEST(KvPlacementOptions, CpuRefusesAnExplicitPlacementNamingTheFlag) {
  for (KvPlacement p : {KvPlacement::kGpu, KvPlacement::kSplit, KvPlacement::kHost}) {
    KvPlacementOptions kv;
    kv.placement = p;
    const std::string name(buffer::kv_placement_name(p));
    const std::string e = test::error_of([&] { validate_kv_placement(kv, Device::kCpu); });
    EXPECT_TRUE(has(e, "--kv-placement " + name)) << e;
    EXPECT_TRUE(has(e, "kv_placement='" + name + "'")) << e;
    EXPECT_TRUE(has(e, "CPU runner keeps its whole KV cache in host memory")) << e;
    EXPECT_TRUE(has(e, "--device cuda")) << e;
  }
}

TEST(KvPlacementOptions, OutOfRangeValuesAreRefused) {
  const auto err = [](auto&& change) {
    KvPlacementOptions kv;
    kv.placement = KvPlacement::kSplit;
    change(kv);
    return test::error_of([&] { validate_kv_placement(kv, Device::kCuda); });
  };
  EXPECT_TRUE(has(err([](KvPlacementOptions& k) { k.gpu_layers = -2; }), "--gpu-layers"));
  EXPECT_EQ(err([](KvPlacementOptions& k) { k.gpu_layers = 3; }), "<no error>");
  EXPECT_TRUE(has(err([](KvPlacementOptions& k) {
                    k.placement = KvPlacement::kHost;
                    k.gpu_layers = 3;
                  }),
                  "applies to --kv-placement split only"));
  EXPECT_TRUE(has(err([](KvPlacementOptions& k) { k.cache_fraction = 0.0; }), "--cache-fraction"));
  EXPECT_TRUE(has(err([](KvPlacementOptions& k) { k.cache_fraction = 1.5; }), "--cache-fraction"));
  EXPECT_EQ(err([](KvPlacementOptions& k) { k.cache_fraction = 1.0; }), "<no error>");
  EXPECT_TRUE(has(err([](KvPlacementOptions& k) { k.page_tokens = -1; }), "--cache-page-tokens"));
  EXPECT_EQ(err([](KvPlacementOptions& k) { k.page_tokens = 0; }), "<no error>");
  EXPECT_TRUE(has(err([](KvPlacementOptions& k) { k.host_memory_limit = -1; }), "--host-memory-limit"));
}

TEST(KvPlacementOptions, MultiMethodRunsKeepTheHostTierForRetro) {
  for (KvPlacement p : {KvPlacement::kAuto, KvPlacement::kGpu, KvPlacement::kSplit, KvPlacement::kHost}) {
    KvPlacementOptions kv;
    kv.placement = p;
    if (p == KvPlacement::kSplit) kv.gpu_layers = 5;
    const bool host_tier = p == KvPlacement::kSplit || p == KvPlacement::kHost;
    const std::string name(buffer::kv_placement_name(p));
    // retro keeps the placement as given and prefills alone with a host tier
    EXPECT_EQ(method_kv_placement(kv, AttentionKind::kRetro).placement, p) << name;
    EXPECT_EQ(method_kv_placement(kv, AttentionKind::kRetro).gpu_layers, kv.gpu_layers) << name;
    EXPECT_EQ(prefills_alone(kv, AttentionKind::kRetro), host_tier) << name;
    // the other methods go to the GPU when a host tier is asked for, and always fork the shared prefill
    for (AttentionKind k : {AttentionKind::kFull, AttentionKind::kQuest, AttentionKind::kStreaming,
                            AttentionKind::kOracle}) {
      const KvPlacementOptions m = method_kv_placement(kv, k);
      EXPECT_EQ(m.placement, host_tier ? KvPlacement::kGpu : p) << name;
      EXPECT_EQ(m.gpu_layers, host_tier ? -1 : kv.gpu_layers) << name;
      EXPECT_NO_THROW(validate_kv_placement(m, Device::kCuda)) << name;
      EXPECT_FALSE(prefills_alone(kv, k)) << name;
    }
  }
}

TEST(KvPlacementOptions, CpuMakeSessionRefusesHostPlacement) {
  const Model* m = test::tiny_llama3();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  const EngineModel em(*m);
  SessionOptions so;
  so.attention.kind = AttentionKind::kRetro;
  so.max_context = 64;
  so.kv_placement.placement = KvPlacement::kHost;
  EXPECT_TRUE(has(test::error_of([&] { make_session(em, so); }), "--kv-placement host"));
  so.kv_placement.placement = KvPlacement::kAuto;
  const std::unique_ptr<SequenceSession> s = make_session(em, so);
  EXPECT_FALSE(s->kv_placement_report().has_value());  // the CPU runner reports no tiers
}

TEST(KvPlacementJson, FieldsOnlyWhereTheyApply) {
  nlohmann::json j = nlohmann::json::object();
  add_kv_placement_json(j, std::nullopt);
  EXPECT_TRUE(j.empty());
  KvPlacementReport r;
  r.placement = KvPlacement::kGpu;
  r.gpu_layers = 30;
  add_kv_placement_json(j, r);
  EXPECT_EQ(j.at("kv_placement"), "gpu");
  EXPECT_EQ(j.at("gpu_layers"), 30);
  EXPECT_EQ(j.at("host_layers"), 0);
  EXPECT_FALSE(j.contains("cache_hit_ratio"));
  r.placement = KvPlacement::kSplit;
  r.gpu_layers = 20;
  r.host_layers = 10;
  add_kv_placement_json(j, r);
  EXPECT_TRUE(j.at("cache_hit_ratio").is_null());  // no retrieval yet
  r.cache_hits = 3;
  r.cache_misses = 1;
  r.step_pcie_bytes = 512;
  r.pcie_bytes = 4096;
  r.decode_steps = 8;
  add_kv_placement_json(j, r);
  EXPECT_EQ(j.at("kv_placement"), "split");
  EXPECT_DOUBLE_EQ(j.at("cache_hit_ratio").get<double>(), 0.75);
  EXPECT_EQ(j.at("cache_hits"), 3);
  EXPECT_EQ(j.at("cache_misses"), 1);
  EXPECT_EQ(j.at("step_pcie_bytes"), 512);
  EXPECT_EQ(j.at("pcie_bytes"), 4096);
  EXPECT_EQ(j.at("pcie_decode_steps"), 8);
}

TEST(KvPlacementJson, EvalReportAggregatesTheHitRatioOverSamples) {
  const auto line = [](const std::string& method, const std::string& task, int index, int hits, int misses) {
    nlohmann::json j = {{"task", task}, {"context", 4096}, {"index", index}, {"method", method},
                        {"score_all", 1.0}, {"exact_tokens_per_head", 10.0}, {"context_tokens_per_head", 100.0}};
    j["kv_placement"] = method == "retro" ? "host" : "gpu";
    if (method == "retro") {
      j["cache_hits"] = hits;
      j["cache_misses"] = misses;
      j["pcie_bytes"] = 1024 * misses;
      j["host_store"] = "int4";
    }
    return j;
  };
  const std::vector<nlohmann::json> lines = {line("full", "niah_single_1", 0, 0, 0), line("retro", "niah_single_1", 0, 6, 2),
                                             line("retro", "niah_single_1", 1, 2, 6), line("retro", "vt", 0, 0, 4),
                                             line("full", "vt", 0, 0, 0)};
  const nlohmann::json s = eval::summarize(lines);
  bool saw_retro = false;
  for (const auto& a : s.at("averages")) {
    if (a.at("method") == "full") {
      EXPECT_FALSE(a.contains("cache_hit_ratio"));
      EXPECT_FALSE(a.contains("host_store"));
      EXPECT_EQ(a.at("kv_placement"), "gpu");
      continue;
    }
    saw_retro = true;
    EXPECT_EQ(a.at("kv_placement"), "host");
    EXPECT_EQ(a.at("host_store"), "int4");
    EXPECT_EQ(a.at("host_tier_samples"), 3);
    EXPECT_EQ(a.at("cache_hits"), 8);
    EXPECT_EQ(a.at("cache_misses"), 12);
    EXPECT_DOUBLE_EQ(a.at("cache_hit_ratio").get<double>(), 8.0 / 20.0);  // pooled over samples, not a mean of ratios
    EXPECT_DOUBLE_EQ(a.at("pcie_bytes_per_sample").get<double>(), 1024.0 * 12 / 3);
  }
  EXPECT_TRUE(saw_retro);
  const std::string md = eval::markdown_table(s);
  EXPECT_TRUE(has(md, "retro: KV placement host (int4 host store), GPU block-cache hit ratio 0.400")) << md;
}

}  // namespace
}  // namespace retroinfer
