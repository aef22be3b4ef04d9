// Teacher-forced fidelity on real text (`retroinfer eval ppl`): each window of the text is a prefix of P
// tokens, prefilled once with dense attention, then the next T ground-truth tokens are fed one by one
// through decode with each attention method (the KV of the forced tokens is appended as usual). Every
// step's logits are compared with full attention's:
//   - perplexity of the forced tokens: exp(mean NLL of token P + t + 1 given the logits after token P + t);
//   - KL(full || method) of the next-token distributions (nats), mean and max over steps;
//   - top-1 agreement: share of steps whose argmax equals full's;
//   - attention-output error per layer: ||o - o_full|| / ||o_full|| of each layer's attention output
//     against exact attention on the same inputs (the method's own query and KV cache at that layer, i.e.
//     the error this layer adds, not the error accumulated from earlier layers), mean over steps.
//     CPU runner only (it reads the layer's KV cache through Session::set_attention_observer): on cuda it
//     is not measured (layer_rel_err empty, "attention_error_measured": false in the JSON, "n/a" in the
//     table).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "eval/eval_runner.h"
#include "retroinfer/engine_model.h"
#include "retroinfer/model.h"

namespace retroinfer::eval {

struct PplOptions {
  int64_t prefix_tokens = 2048;  // P
  int forced_tokens = 64;        // T
  int windows = 1;               // consecutive, non-overlapping windows of P + T + 1 tokens of the text
  // "full" is always run first (the reference) whether listed or not; retro-noest = retro without estimation.
  std::vector<std::string> methods = {"full", "retro", "quest", "streaming", "oracle"};
  AttentionConfig attention;     // budgets (kind set per method)
  // kMatched: per window, quest / streaming / oracle read as many exact tokens as retro did in that
  // window (eval_runner.h); needs retro among the methods.
  BaselineBudget baseline_budget = BaselineBudget::kMatched;
  DType kv_dtype = DType::kF32;  // cuda: must be bf16 (default_kv_dtype)
  int prefill_chunk = 512;
  // cuda: as EvalOptions::kv_placement (eval_runner.h): host / split apply to retro, which prefills each
  // window's prefix in its own session; the other methods fork the full-attention prefill on the GPU.
  KvPlacementOptions kv_placement;
  // Wall-clock budget in seconds (0 = none): a window after the first is not started when, at the pace of
  // the slowest window so far, it would end past the budget (PplReport::windows_run says how many ran).
  double time_budget_s = 0.0;
  std::function<void(std::string_view)> progress;  // may be empty
};
void validate(const PplOptions& o);

struct PplMethodResult {
  std::string method;
  DType kv_dtype = DType::kF32;        // its KV storage: the run's kv_dtype, or the method's :kv_dtype= override
  int64_t steps = 0;                   // forced tokens scored (windows x T)
  double nll = 0.0;                    // mean negative log-likelihood (nats)
  double ppl = 0.0;                    // exp(nll)
  double ppl_rel_diff = 0.0;           // ppl / ppl_full - 1
  // Standard error of ppl_rel_diff from the paired per-token differences of the NLL against the first method
  // (full) on the same tokens, taken as independent: (1 + ppl_rel_diff) * sd(diff) / sqrt(steps). A few
  // thousand forced tokens leave it at ~0.3-0.6 points for retro on real text (the hard tokens' NLL moves
  // most), so perplexity gaps closer than ~2 SE are not told apart; the KL is far less noisy.
  double ppl_rel_diff_se = 0.0;
  double kl_mean = 0.0, kl_max = 0.0;  // KL(full || method), nats
  double top1_agreement = 0.0;         // in [0, 1]
  std::vector<double> layer_rel_err;   // [num_layers], mean over steps; empty when not measured (cuda)
  double exact_tokens_per_head = 0.0;  // per layer, KV head and step
  // retro with layer_budget_queries > 0: each layer's retrieval multiple (the budget calibration's), mean over
  // the windows; empty when every layer kept the nominal budget.
  std::vector<double> layer_budget_multipliers;
  double budget_tokens = -1.0;         // baselines: mean budget beyond the steady zone over windows (-1: derived)
  double context_tokens_per_head = 0.0;
  double seconds = 0.0;                // fork + index + decode, all windows
  // cuda: the session's KV placement ("" on the CPU); with host-tier layers their store's element type, the
  // block cache's hits and misses and the PCIe bytes of the misses, summed over windows.
  std::string kv_placement;
  int host_layers = 0;
  std::string host_store;
  uint64_t cache_hits = 0, cache_misses = 0;
  int64_t pcie_bytes = 0;
};

struct PplReport {
  PplOptions options;
  std::string device = "cpu";            // the runner's device
  bool attention_error_measured = true;  // false on cuda (see layer_rel_err)
  int64_t text_tokens = 0;
  int windows_run = 0;           // < options.windows when the time budget was spent
  double prefill_seconds = 0.0;  // all windows
  std::vector<PplMethodResult> methods;
};

// text: the tokenized text; needs windows * (P + T + 1) tokens (throws Error otherwise). Runs on the
// model's device (engine_model.h).
PplReport run_ppl_fidelity(const EngineModel& model, std::span<const int32_t> text, const PplOptions& opt);
// The same on the CPU runner.
PplReport run_ppl_fidelity(const Model& model, std::span<const int32_t> text, const PplOptions& opt);

nlohmann::json to_json(const PplReport& r);
// One row per method: ppl, ppl change, KL mean / max, top-1 agreement, attention error (mean over layers,
// and the worst layer; "n/a" when not measured), exact tokens read.
std::string markdown_table(const PplReport& r);

}  // namespace retroinfer::eval
