// The table of attention parameters (include/retroinfer/attention_params.h): every CLI flag and Python
// keyword the tools and bindings have always taken, defaults read from AttentionConfig, the text form the
// CLI parses, and validate(AttentionConfig) driven by the table's ranges.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <type_traits>
#include <variant>

#include "index/kmeans.h"
#include "retroinfer/attention_params.h"
#include "retroinfer/error.h"
#include "retroinfer/memory_planner.h"

namespace retroinfer {
namespace {

std::string error_of(const AttentionConfig& c) {
  try {
    validate(c);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(AttentionParams, NamesKeywordsAndFlagsAreUniqueAndKept) {
  std::set<std::string> names, keywords, flags;
  for (const AttentionParam& p : attention_params()) {
    EXPECT_TRUE(names.insert(std::string(p.name)).second) << p.name;
    EXPECT_TRUE(keywords.insert(std::string(p.keyword)).second) << p.keyword;
    EXPECT_TRUE(flags.insert(std::string(p.flag)).second) << p.flag;
    EXPECT_EQ(p.flag.substr(0, 2), "--") << p.name;
    EXPECT_FALSE(p.help.empty()) << p.name;
    EXPECT_EQ(find_attention_param(p.keyword), &p);
    EXPECT_EQ(find_attention_param(p.name), &p);
  }
  // Every AttentionConfig field but kind, under its own name.
  EXPECT_EQ(names, (std::set<std::string>{"scale", "sink_tokens", "window_tokens", "tokens_per_cluster",
                                          "segment_tokens", "kmeans_segment_iters", "kmeans_global_iters",
                                          "retrieval_fraction", "estimation_fraction", "estimation",
                                          "outlier_fraction", "layer_budget_queries", "update_tokens", "update_clusters", "int8_centroid_scoring",
                                          "quest_page_tokens", "budget_tokens", "seed"}));
  // The Python keywords: the field names, with the sampler's `seed` kept apart.
  EXPECT_TRUE(keywords.count("attention_seed"));
  EXPECT_FALSE(keywords.count("seed"));
  // The CLI flags the commands and scripts use.
  for (const char* f : {"--retrieval-fraction", "--estimation-fraction", "--outlier-fraction", "--kmeans-iters",
                        "--segment-tokens", "--sink", "--window", "--tokens-per-cluster", "--budget-tokens",
                        "--no-estimation"})
    EXPECT_TRUE(flags.count(f)) << f;
  EXPECT_EQ(find_attention_param("window"), nullptr);
}

TEST(AttentionParams, DefaultsComeFromAttentionConfig) {
  const AttentionConfig d;
  const AttentionParam& rf = *find_attention_param("retrieval_fraction");
  EXPECT_EQ(attention_param_text(d, rf), "0.018");
  EXPECT_EQ(attention_param_help(rf), std::string(rf.help) + " (default 0.018)");
  EXPECT_NE(attention_param_help(*find_attention_param("sink_tokens")).find("(default 4)"), std::string::npos);
  const std::string tpc = attention_param_help(*find_attention_param("tokens_per_cluster"));
  EXPECT_NE(tpc.find("default 16 from head_dim 128 on, 2 below"), std::string::npos) << tpc;
  EXPECT_EQ(attention_param_text(d, *find_attention_param("estimation")), "true");
  // The defaults other layers repeat are read from the one definition.
  const index::KMeansParams kp;
  EXPECT_EQ(kp.tokens_per_cluster, d.tokens_per_cluster);
  EXPECT_EQ(kp.segment_tokens, d.segment_tokens);
  EXPECT_EQ(kp.segment_iters, d.kmeans_segment_iters);
  EXPECT_EQ(kp.global_iters, d.kmeans_global_iters);
  const buffer::PlannerSettings ps;
  EXPECT_EQ(ps.attention.tokens_per_cluster, d.tokens_per_cluster);
  EXPECT_EQ(ps.attention.retrieval_fraction, d.retrieval_fraction);
  EXPECT_EQ(ps.page_tokens, WaveBufferConfig{}.page_tokens);
}

TEST(AttentionParams, TextRoundTripsAndBadTextNamesTheFlag) {
  const AttentionConfig d;
  for (const AttentionParam& p : attention_params()) {
    AttentionConfig c;
    set_attention_param(c, p, attention_param_text(d, p));
    EXPECT_EQ(attention_param_text(c, p), attention_param_text(d, p)) << p.name;
  }
  AttentionConfig c;
  set_attention_param(c, *find_attention_param("retrieval_fraction"), "0.05");
  EXPECT_DOUBLE_EQ(c.retrieval_fraction, 0.05);
  set_attention_param(c, *find_attention_param("budget_tokens"), "-1");
  EXPECT_EQ(c.budget_tokens, -1);
  set_attention_param(c, *find_attention_param("estimation"), "false");
  EXPECT_FALSE(c.estimation);
  set_attention_param(c, *find_attention_param("attention_seed"), "18446744073709551615");
  EXPECT_EQ(c.seed, 18446744073709551615ull);
  auto message = [&](const char* key, const char* text) {
    try {
      set_attention_param(c, *find_attention_param(key), text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message("retrieval_fraction", "abc").find("--retrieval-fraction: 'abc' is not a number"),
            std::string::npos);
  EXPECT_NE(message("sink_tokens", "1.5").find("--sink: '1.5' is not an integer"), std::string::npos);
  EXPECT_NE(message("sink_tokens", "99999999999").find("--sink"), std::string::npos);  // past int
  EXPECT_NE(message("sink_tokens", "").find("--sink"), std::string::npos);
  EXPECT_NE(message("estimation", "maybe").find("--no-estimation"), std::string::npos);
  EXPECT_NE(message("attention_seed", "-1").find("--attention-seed"), std::string::npos);
  // Out of range: the range check of validate, naming the flag.
  EXPECT_NE(message("segment_tokens", "0").find("--segment-tokens must be >= 1, got 0"), std::string::npos);
  EXPECT_NE(message("retrieval_fraction", "2").find("--retrieval-fraction must be in [0, 1], got 2"),
            std::string::npos);
  EXPECT_NE(message("scale", "inf").find("--scale must be >= 0"), std::string::npos);
}

TEST(AttentionParams, ValidateChecksEveryRangeOfTheTable) {
  EXPECT_EQ(error_of(AttentionConfig{}), "");
  for (const AttentionParam& p : attention_params()) {
    if (std::holds_alternative<bool AttentionConfig::*>(p.field) || p.name == "seed") continue;  // no value below
    AttentionConfig c;
    std::visit([&](auto f) { c.*f = static_cast<std::remove_reference_t<decltype(c.*f)>>(p.min - 1); }, p.field);
    const std::string below = error_of(c);
    EXPECT_NE(below.find("attention config: " + std::string(p.name) + " must be"), std::string::npos)
        << p.name << ": " << below;
    if (std::isfinite(p.max)) {
      c = AttentionConfig{};
      std::visit([&](auto f) { c.*f = static_cast<std::remove_reference_t<decltype(c.*f)>>(1.5); }, p.field);
      EXPECT_NE(error_of(c).find(std::string(p.name) + " must be in [0, 1]"), std::string::npos) << p.name;
    }
  }
  AttentionConfig c;
  c.scale = NAN;
  EXPECT_NE(error_of(c).find("scale must be >= 0"), std::string::npos);
  c = AttentionConfig{};
  c.retrieval_fraction = 0.6;
  c.estimation_fraction = 0.6;
  EXPECT_NE(error_of(c).find("retrieval_fraction + estimation_fraction must be <= 1"), std::string::npos);
  c.estimation = false;  // the estimation fraction is not used
  EXPECT_EQ(error_of(c), "");
  c = AttentionConfig{};
  c.retrieval_fraction = 0.5;
  c.estimation_fraction = 0.5 + 5e-10;  // within kFractionSlack of 1
  EXPECT_EQ(error_of(c), "");
  c = AttentionConfig{};
  c.segment_tokens = 8;
  EXPECT_NE(error_of(c).find("segment_tokens must be >= tokens_per_cluster (16), got 8"), std::string::npos);
  c = AttentionConfig{};
  c.update_clusters = 2048;
  EXPECT_NE(error_of(c).find("update_clusters must be <= update_tokens (1024), got 2048"), std::string::npos);
}

}  // namespace
}  // namespace retroinfer
