// The `retroinfer eval tasks` driver: RULER-style samples (tasks.h) through the model runner of the chosen
// device (engine_model.h: the CPU Session or the CUDA runner) with every decode-attention method, scored
// (scoring.h), one JSON line per (sample, method) appended to a results file, so an interrupted run
// resumes where it stopped.
//
// Prefill is the same for every method (they differ only in decode), so each sample is prefilled once
// with full attention; then, per method, SequenceSession::fork_session copies the prompt's KV caches,
// builds that method's index and decodes the answer greedily (at most the task's max_new_tokens, stopping
// at an end-of-generation token). The first answer token comes from the shared prefill logits.
// Retro with a host or split KV placement (EvalOptions::kv_placement) cannot be forked from that prefill
// (its KV lives in its wave buffers): it prefills the sample in its own session, and its line's prefill_s is
// its own.
//
// Order: sample index outermost, then context length, then task, so that a run stopped early (its time
// budget spent, or interrupted) holds about as many samples of every task and length.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "eval/tasks.h"
#include "retroinfer/engine_model.h"
#include "retroinfer/model.h"
#include "retroinfer/tokenizer.h"

namespace retroinfer::eval {

// Method names: full, retro, quest, streaming, oracle, and retro-noest (retro without the estimation
// zone), each optionally followed by overrides of AttentionConfig fields, ":field=value" per field
// ("retro:retrieval_fraction=0.036:estimation_fraction=0.5"), so that one run compares several settings of a
// method on the same inputs (the name with its overrides names the method in tables and JSON). Returns `base`
// with kind (and estimation) set and the overrides applied; throws Error for an unknown name or field, or a
// value outside the field's range (the config as a whole is checked by validate).
// One more override names the KV cache's storage instead of an AttentionConfig field: ":kv_dtype=fp8"
// (method_kv_dtype; method_config passes over it), so "full:kv_dtype=fp8" is full attention over an fp8 KV
// cache, measured against the reference full attention of the run's --kv-dtype.
AttentionConfig method_config(std::string_view method, const AttentionConfig& base);
// The method's KV storage: its ":kv_dtype=" override (f32, bf16, int8 or fp8; throws Error for another), else
// `base`.
DType method_kv_dtype(std::string_view method, DType base);
// The method name without its overrides: "retro" for "retro:window_tokens=128".
std::string_view method_base_name(std::string_view method);

// How quest, streaming and oracle are budgeted against retro. kNominal: AttentionConfig's budget_tokens
// (< 0: round(retrieval_fraction * indexed tokens), retro's nominal retrieval size). kMatched: each
// baseline reads as many exact tokens per (layer, KV head, step) as retro's statistics report on the same
// input (on both runners the tokens actually attended: the CUDA runner reads retro's per-head counts back):
// budget_tokens =
// matched_budget_tokens(retro's exact tokens per head). Needs retro among the methods (or, for a resumed
// task run, retro's result line of the same sample).
enum class BaselineBudget : uint8_t { kNominal, kMatched };
BaselineBudget parse_baseline_budget(std::string_view s);  // "nominal" | "matched"; throws Error otherwise
std::string_view baseline_budget_name(BaselineBudget b);
// True for the methods whose exact-token budget is AttentionConfig::budget_tokens (quest, streaming, oracle).
bool budgeted_baseline(std::string_view method);
// Budget beyond the steady zone giving a baseline retro's exact-token count: round(retro_exact_per_head)
// minus the steady zone (sink + window), at least 0. Throws Error for a negative or non-finite count.
int64_t matched_budget_tokens(double retro_exact_per_head, const AttentionConfig& c);
// Throws Error when matched budgets cannot apply: a budgeted baseline without retro among the methods, or
// an explicit budget_tokens with kMatched. `who` starts the message ("eval", "eval ppl").
void validate_baseline_budget(BaselineBudget b, const std::vector<std::string>& methods, const AttentionConfig& c,
                              std::string_view who);
// Methods reordered for matching: full first, then retro, then the rest in their given order.
std::vector<std::string> matched_order(const std::vector<std::string>& methods);

struct EvalOptions {
  std::vector<std::string> tasks = task_names();
  std::vector<int64_t> contexts = {4096, 8192};  // target prompt tokens
  int samples = 50;                              // per task and context (indices 0 .. samples - 1)
  int first_sample = 0;                          // first index (to split a run)
  std::vector<std::string> methods = {"full", "retro", "quest", "streaming", "oracle"};
  AttentionConfig attention;                     // budgets, sink, window, ... (kind set per method)
  BaselineBudget baseline_budget = BaselineBudget::kMatched;
  DType kv_dtype = DType::kF32;                  // cuda: must be bf16 (default_kv_dtype)
  int prefill_chunk = 512;
  // cuda: where the KV lives. host / split apply to retro (and retro-noest), which then prefills each sample
  // in its own session (prefills_alone, engine_model.h); the other methods fork the shared prefill with every
  // layer on the GPU. auto / gpu: every method forks the shared full-attention prefill, whose plan decides.
  KvPlacementOptions kv_placement;
  std::string results_path;                      // JSON lines, appended; required
  // Wall-clock budget in seconds for the whole call (0 = none): a sample is not started when, at the
  // slowest pace seen so far for its context length, it would end past the budget; the run then stops
  // cleanly (every written line complete) and reports budget_spent.
  double time_budget_s = 0.0;
  std::function<void(std::string_view)> progress;  // progress lines (stderr in the CLI); may be empty
};
void validate(const EvalOptions& o);

// The resume key of one result line.
std::string result_key(std::string_view task, int64_t context, int index, std::string_view method);

// Result lines already in `path` (none when the file does not exist). A truncated last line (an
// interrupted write) is dropped; any other malformed line throws Error naming the line.
std::vector<nlohmann::json> load_results(const std::string& path);
// Keys of the given result lines.
std::set<std::string> result_keys(const std::vector<nlohmann::json>& lines);

// One result line: task, context, index, method, depth, prompt_tokens, prompt_hash, references, output,
// score_all, score_part, generated_tokens, exact_tokens_per_head (mean over decode steps, layers and KV
// heads), context_tokens_per_head, prefill_s (shared), method_s (fork + index + decode, or with its own
// prefill prefill + index + decode); run_eval adds device, kv_dtype, gen_s (task generation + tokenization of
// the sample, shared) and the CUDA session's KV placement (add_kv_placement_json: kv_placement, gpu_layers,
// host_layers, and with host-tier layers cache_hits, cache_misses, cache_hit_ratio, pcie_bytes, ...).
struct SampleOutcome {
  std::string output;
  int64_t generated_tokens = 0;
  int64_t decode_steps = 0;
  double exact_tokens_per_head = 0.0;
  double context_tokens_per_head = 0.0;
  double seconds = 0.0;
};
nlohmann::json result_line(const TaskSample& s, std::string_view method, const SampleOutcome& o,
                           double prefill_s);

struct EvalRunStats {
  int64_t lines_written = 0;
  int64_t samples_run = 0;      // samples prefilled in this call
  int64_t samples_skipped = 0;  // samples whose every method was already in the file
  int64_t samples_left = 0;     // samples not started (time budget spent)
  bool budget_spent = false;
  double seconds = 0.0;
};

// Runs every (task, context, sample, method) not yet in results_path and appends its line, with the
// device's runner. Each line also records "device" and "kv_dtype"; a results file made on another device
// is refused (its numbers would mix two runners). Returns the number of lines written; `stats` (optional)
// gets the details.
int64_t run_eval(const EngineModel& model, const Tokenizer& tok, const TaskGenerator& gen, const EvalOptions& opt,
                 EvalRunStats* stats = nullptr);
// The same on the CPU runner.
int64_t run_eval(const Model& model, const Tokenizer& tok, const TaskGenerator& gen, const EvalOptions& opt,
                 EvalRunStats* stats = nullptr);

// The prompt wrapper for a model's tokenizer: its chat template (user turn + generation prompt) followed
// by the answer prefix; without a chat template, BOS-less plain text "user\n\nanswer_prefix".
PromptWrapper chat_prompt_wrapper(const Tokenizer& tok);
// encode(prompt, add_special = false, parse_special = true) size.
TokenCounter token_counter(const Tokenizer& tok);

}  // namespace retroinfer::eval
