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
};

// {"cells": [{method, task, context, samples, score, exact_tokens_per_head, context_tokens_per_head}...],
//  "averages": [{method, context, score (mean of the task means), tasks, samples}...]}
nlohmann::json summarize(const std::vector<nlohmann::json>& lines);
// One table per context length: rows = methods (in order of first appearance), columns = tasks (in
// task_names() order), the
// task average, the mean exact tokens read per layer, KV head and step, and samples per cell.
std::string markdown_table(const nlohmann::json& summary);

}  // namespace retroinfer::eval
