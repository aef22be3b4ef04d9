// `retroinfer trace replay`: replays a cluster trace (`generate --record-trace`) through the wave buffer's
// block cache at several cache sizes and reports the hit ratio overall, per layer and over time
// (docs/wave-buffer.md#cluster-traces).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "command.h"
#include "retroinfer/cache_replay.h"
#include "retroinfer/cluster_trace.h"
#include "retroinfer/error.h"

namespace retroinfer::cli {
namespace {

struct TraceReplayCliOptions {
  std::string trace, json_path;
  int page_tokens = 8;
  std::vector<double> cache_fractions{0.02, 0.05, 0.10};
  int window_steps = 32;
};

nlohmann::json counts_json(const CacheReplayCounts& c) {
  return {{"hit_ratio", c.hit_ratio()},         {"token_hit_ratio", c.token_hit_ratio()},
          {"hit_clusters", c.hit_clusters},     {"miss_clusters", c.miss_clusters},
          {"hit_tokens", c.hit_tokens},         {"miss_tokens", c.miss_tokens},
          {"first_misses", c.first_misses},     {"first_misses_near", c.first_misses_near},
          {"capacity_misses", c.capacity_misses()}};
}

// What the trace holds: its shape, steps and the mean selection, for the report's context.
nlohmann::json trace_json(const ClusterTrace& t, const std::string& path) {
  std::set<std::tuple<int, int, int>> heads;
  int32_t last_step = -1;
  double selected = 0, tokens = 0, clusters = 0, context = 0;
  for (const ClusterTraceRecord& r : t.records) {
    heads.insert({r.layer, r.seq, r.head});
    last_step = std::max(last_step, r.step);
    selected += double(r.ids.size());
    for (int32_t s : r.sizes) tokens += s;
    clusters += r.num_clusters;
    context += double(r.context_tokens);
  }
  const double n = std::max<double>(double(t.records.size()), 1.0);
  return {{"file", path},
          {"source", t.header.source},
          {"num_layers", t.header.num_layers},
          {"num_heads_kv", t.header.num_heads_kv},
          {"head_dim", t.header.head_dim},
          {"records", t.records.size()},
          {"flat_heads", heads.size()},
          {"steps", last_step + 1},
          {"mean_context_tokens", context / n},
          {"mean_num_clusters", clusters / n},
          {"mean_selected_clusters", selected / n},
          {"mean_selected_tokens", tokens / n}};
}

void run_replay(const TraceReplayCliOptions& o) {
  const ClusterTrace t = read_cluster_trace(o.trace);
  RETROINFER_CHECK(!t.records.empty(), "trace replay: '", o.trace, "' holds no records (no decode step was recorded)");
  CacheReplayOptions ro;
  ro.page_tokens = o.page_tokens;
  ro.cache_fractions = o.cache_fractions;
  ro.window_steps = o.window_steps;
  const std::vector<CacheReplayResult> results = replay_cluster_trace(t, ro);

  nlohmann::json j;
  j["trace"] = trace_json(t, o.trace);
  j["page_tokens"] = o.page_tokens;
  j["window_steps"] = o.window_steps;
  j["admission"] = "misses admitted after each step (the manager keeps up), LRU over whole clusters";
  for (const CacheReplayResult& r : results) {
    nlohmann::json e = counts_json(r.total);
    e["cache_fraction"] = r.cache_fraction;
    e["capacity_pages_min"] = r.capacity_pages_min;
    e["capacity_pages_max"] = r.capacity_pages_max;
    for (const CacheReplayCounts& c : r.per_layer) e["per_layer"].push_back(counts_json(c));
    for (size_t w = 0; w < r.per_window.size(); ++w) {
      nlohmann::json c = counts_json(r.per_window[w]);
      c["first_step"] = w * size_t(o.window_steps);
      e["over_time"].push_back(c);
    }
    j["results"].push_back(e);
  }

  // Text: one row per layer, one column per cache fraction (cluster hit ratio; token hit ratio overall).
  std::printf("trace %s: %d layers x %d KV heads, %zu records, %d steps\n", o.trace.c_str(), t.header.num_layers,
              t.header.num_heads_kv, t.records.size(), j["trace"]["steps"].get<int>());
  std::printf("%-8s", "layer");
  for (const CacheReplayResult& r : results) std::printf("  %6.1f%%", 100.0 * r.cache_fraction);
  std::printf("\n");
  for (int l = 0; l < t.header.num_layers; ++l) {
    std::printf("%-8d", l);
    for (const CacheReplayResult& r : results) std::printf("  %7.3f", r.per_layer[size_t(l)].hit_ratio());
    std::printf("\n");
  }
  std::printf("%-8s", "all");
  for (const CacheReplayResult& r : results) std::printf("  %7.3f", r.total.hit_ratio());
  std::printf("\n%-8s", "tokens");
  for (const CacheReplayResult& r : results) std::printf("  %7.3f", r.total.token_hit_ratio());
  // Where the misses come from (share of all selections): first references, and of those the ones next to a
  // recent selection (what a neighbour prefetch could serve), then capacity misses (what more cache serves).
  std::printf("\n%-8s", "first");
  for (const CacheReplayResult& r : results) std::printf("  %7.3f", r.total.share(r.total.first_misses));
  std::printf("\n%-8s", "  near");
  for (const CacheReplayResult& r : results) std::printf("  %7.3f", r.total.share(r.total.first_misses_near));
  std::printf("\n%-8s", "capacity");
  for (const CacheReplayResult& r : results) std::printf("  %7.3f", r.total.share(r.total.capacity_misses()));
  std::printf("\n");
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    RETROINFER_CHECK(f.good(), "trace replay: cannot write --json '", o.json_path, "'");
    f << j.dump(2) << "\n";
  }
}

void setup_trace(CLI::App& app) {
  auto* trace = app.add_subcommand("trace", "Cluster traces of retro's selections (record with generate --record-trace)");
  trace->require_subcommand(1);
  auto o = std::make_shared<TraceReplayCliOptions>();
  auto* replay = trace->add_subcommand("replay", "Replay a cluster trace through the wave buffer's block cache (LRU)");
  replay->add_option("--trace", o->trace, "Cluster trace file")->required();
  replay->add_option("--page-tokens", o->page_tokens, "Tokens per cache page")->capture_default_str()
      ->check(CLI::PositiveNumber);
  replay->add_option("--cache-fraction", o->cache_fractions,
                     "Cache sizes as fractions of the prompt's tokens per flat head (comma-separated)")
      ->delimiter(',')->capture_default_str()->check(CLI::Range(1e-9, 1.0));
  replay->add_option("--window-steps", o->window_steps, "Decode steps per entry of the hit ratio over time")
      ->capture_default_str()->check(CLI::PositiveNumber);
  replay->add_option("--json", o->json_path, "Write the results as JSON to this file");
  replay->callback([o] { run_replay(*o); });
}
RETROINFER_COMMAND(setup_trace);

}  // namespace
}  // namespace retroinfer::cli
