// The attention parameters as plain data (attention_config.h) and their table (attention_params.h): names,
// validation, the head-dimension default of the cluster size, and the text form the CLI reads and prints.
#include <charconv>
#include <cmath>
#include <limits>
#include <sstream>
#include <type_traits>

#include "retroinfer/attention_config.h"
#include "retroinfer/attention_params.h"
#include "retroinfer/error.h"
#include "retroinfer/wave_counts.h"  // kFractionSlack

namespace retroinfer {

std::string_view attention_kind_name(AttentionKind k) {
  switch (k) {
    case AttentionKind::kFull: return "full";
    case AttentionKind::kRetro: return "retro";
    case AttentionKind::kQuest: return "quest";
    case AttentionKind::kStreaming: return "streaming";
    case AttentionKind::kOracle: return "oracle";
  }
  return "?";
}

AttentionKind parse_attention_kind(std::string_view s) {
  for (auto k : {AttentionKind::kFull, AttentionKind::kRetro, AttentionKind::kQuest, AttentionKind::kStreaming,
                 AttentionKind::kOracle})
    if (attention_kind_name(k) == s) return k;
  RETROINFER_FAIL("unknown attention method '", s, "': expected full, retro, quest, streaming or oracle");
}

void validate(const AttentionShape& s) {
  RETROINFER_CHECK(s.num_heads_q > 0, "attention shape: num_heads_q must be positive, got ", s.num_heads_q);
  RETROINFER_CHECK(s.num_heads_kv > 0, "attention shape: num_heads_kv must be positive, got ", s.num_heads_kv);
  RETROINFER_CHECK(s.head_dim > 0, "attention shape: head_dim must be positive, got ", s.head_dim);
  RETROINFER_CHECK(s.num_heads_q % s.num_heads_kv == 0, "attention shape: num_heads_q (", s.num_heads_q,
                   ") must be a multiple of num_heads_kv (", s.num_heads_kv, ")");
}

namespace {

// The head dimension the paper's 16 tokens per cluster was set for (Llama-3-8B).
constexpr int kPaperHeadDim = 128;

constexpr double kNoMax = std::numeric_limits<double>::infinity();

const AttentionParam kParams[] = {
    {"scale", "scale", "--scale", &AttentionConfig::scale, 0.0, kNoMax, "Logit scale; 0 = 1/sqrt(head_dim)"},
    {"sink_tokens", "sink_tokens", "--sink", &AttentionConfig::sink_tokens, 0.0, kNoMax,
     "Steady zone: first tokens always attended"},
    {"window_tokens", "window_tokens", "--window", &AttentionConfig::window_tokens, 0.0, kNoMax,
     "Steady zone: last prompt tokens always attended"},
    {"tokens_per_cluster", "tokens_per_cluster", "--tokens-per-cluster", &AttentionConfig::tokens_per_cluster, 1.0,
     kNoMax, "retro: average cluster size", true},
    {"segment_tokens", "segment_tokens", "--segment-tokens", &AttentionConfig::segment_tokens, 1.0, kNoMax,
     "retro: k-means segment length in tokens (>= tokens_per_cluster)"},
    {"kmeans_segment_iters", "kmeans_segment_iters", "--kmeans-iters", &AttentionConfig::kmeans_segment_iters, 0.0,
     kNoMax, "retro: spherical k-means iterations per segment"},
    {"kmeans_global_iters", "kmeans_global_iters", "--kmeans-global-iters", &AttentionConfig::kmeans_global_iters,
     0.0, kNoMax, "retro: final k-means iterations over all clusters (plain means)"},
    {"retrieval_fraction", "retrieval_fraction", "--retrieval-fraction", &AttentionConfig::retrieval_fraction, 0.0,
     1.0, "retro: share of clusters attended exactly (and the baselines' budget when budget_tokens is -1)"},
    {"estimation_fraction", "estimation_fraction", "--estimation-fraction", &AttentionConfig::estimation_fraction,
     0.0, 1.0, "retro: share of clusters estimated from centroid and value sum (retrieval + estimation <= 1)"},
    {"estimation", "estimation", "--no-estimation", &AttentionConfig::estimation, 0.0, 0.0,
     "retro: ignore the estimation zone"},
    {"outlier_fraction", "outlier_fraction", "--outlier-fraction", &AttentionConfig::outlier_fraction, 0.0, 1.0,
     "retro: share of the indexed tokens kept out of the clusters and read exactly"},
    {"layer_budget_queries", "layer_budget_queries", "--layer-budget-queries", &AttentionConfig::layer_budget_queries,
     0.0, kNoMax,
     "retro: the prompt's last queries that share the retrieval budget out among the layers (0: the same share "
     "in every layer)"},
    {"update_tokens", "update_tokens", "--update-tokens", &AttentionConfig::update_tokens, 1.0, kNoMax,
     "retro: generated tokens per index update"},
    {"update_clusters", "update_clusters", "--update-clusters", &AttentionConfig::update_clusters, 1.0, kNoMax,
     "retro: clusters made per index update (<= update_tokens)"},
    {"int8_centroid_scoring", "int8_centroid_scoring", "--bf16-centroid-scoring",
     &AttentionConfig::int8_centroid_scoring, 0.0, 0.0,
     "retro on the GPU: score clusters against the bf16 centroids instead of their int8 copies"},
    {"quest_page_tokens", "quest_page_tokens", "--quest-page-tokens", &AttentionConfig::quest_page_tokens, 1.0,
     kNoMax, "quest: page size in tokens"},
    {"budget_tokens", "budget_tokens", "--budget-tokens", &AttentionConfig::budget_tokens, -1.0, kNoMax,
     "quest/streaming/oracle: exact tokens beyond the steady zone; -1 = round(retrieval_fraction x indexable "
     "tokens), the expected size of retro's retrieval zone"},
    {"seed", "attention_seed", "--attention-seed", &AttentionConfig::seed, 0.0, kNoMax,
     "Seed of the attention methods' randomised choices (they make none)"},
};

template <typename T>
constexpr bool kIsBool = std::is_same_v<T, bool>;

std::string number_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// "must be >= 0" / "must be in [0, 1]".
std::string range_text(const AttentionParam& p) {
  return p.max == kNoMax ? ">= " + number_text(p.min) : "in [" + number_text(p.min) + ", " + number_text(p.max) + "]";
}

// Throws "<who> must be <range>, got <value>" unless p's value in c is in p's range (and finite).
void check_range(const AttentionConfig& c, const AttentionParam& p, std::string_view who) {
  std::visit(
      [&](auto f) {
        const auto v = c.*f;
        using T = std::remove_cv_t<decltype(v)>;
        if constexpr (!kIsBool<T>) {
          const double x = static_cast<double>(v);
          const bool finite = !std::is_floating_point_v<T> || std::isfinite(x);
          RETROINFER_CHECK(finite && x >= p.min && x <= p.max, who, " must be ", range_text(p), ", got ", v);
        }
      },
      p.field);
}

}  // namespace

std::span<const AttentionParam> attention_params() { return kParams; }

const AttentionParam* find_attention_param(std::string_view keyword) {
  for (const AttentionParam& p : kParams)
    if (p.keyword == keyword || p.name == keyword) return &p;
  return nullptr;
}

std::string attention_param_text(const AttentionConfig& c, const AttentionParam& p) {
  return std::visit(
      [&](auto f) -> std::string {
        const auto v = c.*f;
        using T = std::remove_cv_t<decltype(v)>;
        if constexpr (kIsBool<T>) return v ? "true" : "false";
        else if constexpr (std::is_floating_point_v<T>) return number_text(v);
        else return std::to_string(v);
      },
      p.field);
}

std::string attention_param_help(const AttentionParam& p) {
  const AttentionConfig d;
  std::string h(p.help);
  if (std::holds_alternative<bool AttentionConfig::*>(p.field)) return h;  // the flag says what it sets
  if (p.head_dim_default)
    return h + " (default " + std::to_string(default_tokens_per_cluster(kPaperHeadDim)) + " from head_dim " +
           std::to_string(kPaperHeadDim) + " on, " + std::to_string(default_tokens_per_cluster(kPaperHeadDim - 1)) +
           " below)";
  return h + " (default " + attention_param_text(d, p) + ")";
}

void set_attention_param(AttentionConfig& c, const AttentionParam& p, std::string_view text) {
  std::visit(
      [&](auto f) {
        auto& dst = c.*f;
        using T = std::remove_reference_t<decltype(dst)>;
        if constexpr (kIsBool<T>) {
          if (text == "true" || text == "1") dst = true;
          else if (text == "false" || text == "0") dst = false;
          else RETROINFER_FAIL(p.flag, ": '", text, "' is not true or false");
        } else {
          T v{};
          const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
          RETROINFER_CHECK(ec == std::errc() && end == text.data() + text.size() && !text.empty(), p.flag, ": '",
                           text, "' is not ", std::is_floating_point_v<T> ? "a number" : "an integer",
                           ec == std::errc::result_out_of_range ? " of its type's range" : "");
          dst = v;
        }
      },
      p.field);
  check_range(c, p, p.flag);
}

int default_tokens_per_cluster(int head_dim) {
  RETROINFER_CHECK(head_dim >= 1, "default_tokens_per_cluster: head_dim must be >= 1, got ", head_dim);
  // The paper's 16 is measured below it only at 64 (SmolLM2 on the H200, docs/accuracy.md: teacher-forced
  // perplexity against full over 128 / 64 windows at 4K / 8K: 2 tokens per cluster +0.82% / +0.13%, 4 tokens
  // +1.3% / +1.2%, 8 tokens +2.9% / +1.9%; on the tasks 4 tokens 35.3 / 21.4 average vs full's 36.0 / 22.0,
  // 8 tokens 32.0 / 19.1). The price of 2: an index of n / 2 centroids per head, whose scoring pass reads a
  // quarter of the K/V bytes (bf16) each step, and the CPU's decode roughly halves in speed against 4.
  return head_dim >= kPaperHeadDim ? 16 : 2;
}

void validate(const AttentionConfig& c) {
  for (const AttentionParam& p : kParams) check_range(c, p, "attention config: " + std::string(p.name));
  RETROINFER_CHECK(c.segment_tokens >= c.tokens_per_cluster, "attention config: segment_tokens must be >= "
                   "tokens_per_cluster (", c.tokens_per_cluster, "), got ", c.segment_tokens);
  // With the estimation zone off its fraction is not used.
  RETROINFER_CHECK(!c.estimation || c.retrieval_fraction + c.estimation_fraction <= 1.0 + kFractionSlack,
                   "attention config: retrieval_fraction + estimation_fraction must be <= 1, got ",
                   c.retrieval_fraction + c.estimation_fraction);
  RETROINFER_CHECK(c.update_clusters <= c.update_tokens, "attention config: update_clusters must be <= "
                   "update_tokens (", c.update_tokens, "), got ", c.update_clusters);
}

}  // namespace retroinfer
