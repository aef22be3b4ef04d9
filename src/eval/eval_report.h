// Aggregates `retroinfer eval tasks` result lines into a summary (JSON) and a markdown table:
// method x task x context, with the task average and the exact-token budget each method read.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace retroinfer::eval {

struct CellStats {
  int64_t samples = 0;
  double score = 0.0;                  // mean string_match_all, in percent
  double exact_tokens_per_head = 0.0;  // mean over samples
  double context_tokens_per_head = 0.0;
  // Lines from sessions with host-tier layers (cuda, kv placement host or split): the block cache's
  // retrieval hits and misses and the PCIe bytes of the misses, summed over those lines.
  int64_t host_tier_samples = 0;
  uint64_t cache_hits = 0, cache_misses = 0;
  double pcie_bytes = 0.0;
};

// {"cells": [{method, task, context, samples, score, exact_tokens_per_head, context_tokens_per_head}...],
//  "averages": [{method, context, score (mean of the task means), tasks, samples}...]}
// Cells and averages of a method whose lines ran with host-tier layers also hold kv_placement (the lines'
// placements, comma-joined), host_tier_samples, cache_hits, cache_misses, cache_hit_ratio (hits / (hits +
// misses) over those samples) and pcie_bytes_per_sample; averages also host_store (the host-tier lines' store
// types, comma-joined).
nlohmann::json summarize(const std::vector<nlohmann::json>& lines);
// One table per context length: rows = methods (in order of first appearance), columns = tasks (in
// task_names() order), the
// task average, the mean exact tokens read per layer, KV head and step, and samples per cell.
std::string markdown_table(const nlohmann::json& summary);

}  // namespace retroinfer::eval
