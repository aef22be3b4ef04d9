// Attention fidelity: how close each decode-attention method comes to full attention on synthetic data
// (eval/synthetic.h) at an equal exact-token budget. Drives `retroinfer fidelity`.
//
// Per context length: generate the prompt into a KvCache, give each method on_prefill (timed: index build),
// then run decode steps. Each step appends that step's K/V token to the cache first (the interface's
// contract: decode sees the current token), so the cache grows by one token per step and incremental
// paths (quest pages, retro's steady zone) are exercised. Every method sees the same cache and queries.
// Per method: relative L2 error of the output against an independent full-attention reference
// (double accumulation), attention-mass recall (share of the reference's softmax mass on the tokens the
// method read exactly; and, for retro, on the tokens it estimated), exact tokens read, time per step.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "core/synthetic.h"
#include "retroinfer/attention.h"
#include "retroinfer/dtype.h"

namespace retroinfer::eval {

struct FidelityOptions {
  std::vector<int64_t> contexts = {8192, 32768, 131072};  // prompt lengths, one evaluation each
  // Methods: full, retro, quest, streaming, oracle, and retro-noest (retro with the estimation zone off).
  std::vector<std::string> methods = {"full", "retro", "quest", "streaming", "oracle"};
  bool estimation_variant = true;  // add retro-noest right after retro when retro is listed
  int steps = 16;                  // decode steps per context
  // Model shape. Only kv_heads_evaluated KV heads (with their query heads) are generated and evaluated:
  // KV heads are independent of each other, so this samples the layer at a fraction of the cost.
  int num_heads_q = 32;
  int num_heads_kv = 8;
  int head_dim = 128;
  int kv_heads_evaluated = 2;
  uint64_t seed = 1;
  DType dtype = DType::kBF16;   // KV storage
  AttentionConfig attention;    // budgets, sink, window, ... (kind is set per method)
  SyntheticConfig synthetic;    // generator knobs (shape, context, steps and seed are set from the above)
  std::function<void(std::string_view)> progress;  // progress lines (stderr in the CLI); may be empty
};
// Throws Error on bad options (unknown method, non-positive sizes, kv_heads_evaluated out of range, ...).
void validate(const FidelityOptions& o);

// Shares of the reference attention mass on parts of the data, averaged over query heads and steps.
struct DataProfile {
  double sink_mass = 0.0;    // the generator's sink tokens
  double needle_mass = 0.0;  // the needles
  double window_mass = 0.0;  // the last window_tokens tokens
};

constexpr double kNotMeasured = std::numeric_limits<double>::quiet_NaN();

struct MethodResult {
  int64_t context = 0;
  std::string method;
  std::string error;                        // non-empty: the method could not run (why); the rest unset
  double rel_err_mean = 0.0;                // mean over query heads and steps of ||o - o_ref|| / ||o_ref||
  double rel_err_max = 0.0;                 // worst (head, step)
  double recall_exact = kNotMeasured;       // reference mass on exactly-read tokens (NaN: not reported)
  double recall_estimated = kNotMeasured;   // reference mass on estimated tokens (retro; NaN otherwise)
  double recall_needles = kNotMeasured;     // share of the needles' reference mass read exactly
  double recall_needles_estimated = kNotMeasured;  // share of the needles' reference mass estimated (retro)
  double exact_tokens = 0.0;                // per KV head per step (steady + selected)
  double context_tokens = 0.0;              // per KV head per step
  double retrieved_clusters = 0.0;          // per KV head per step (retro)
  double estimated_clusters = 0.0;          // per KV head per step (retro)
  double ms_per_step = 0.0;                 // wall time of decode() for the evaluated heads
  double build_ms = 0.0;                    // wall time of on_prefill() for the evaluated heads
};

struct ContextResult {
  int64_t context = 0;
  double generate_ms = 0.0;
  DataProfile profile;
  std::vector<MethodResult> methods;
};

struct FidelityReport {
  FidelityOptions options;
  std::vector<ContextResult> contexts;
};

FidelityReport run_fidelity(const FidelityOptions& o);

// Human-readable description of the setup and one table row per (context, method).
std::string format_fidelity(const FidelityReport& r);
// One JSON object per (context, method) row, newline-terminated lines.
std::string fidelity_json_lines(const FidelityReport& r);

}  // namespace retroinfer::eval
