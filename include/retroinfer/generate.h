// Text generation on one sequence: prefill + decode with sampling, stop tokens and stop strings, streamed
// through a per-token callback, with a timing and KV-read summary.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "retroinfer/engine_model.h"
#include "retroinfer/model.h"
#include "retroinfer/sampler.h"

namespace retroinfer {

class PrefixCache;  // prefix_cache.h

// Withholds streamed text that could still become a stop string, and cuts the text at the first stop
// string. Not thread-safe.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);  // empty strings are ignored
  struct Result {
    std::string emit;      // text that is safe to show now
    bool stopped = false;  // a stop string matched; `emit` ends right before it
  };
  // Adds newly decoded text.
  Result feed(std::string_view text);
  // End of generation without a match: whatever is still withheld.
  std::string flush();

 private:
  std::vector<std::string> stops_;
  std::string pending_;
};

// kConstraintComplete: the sampler's TokenConstraint says the text is complete (e.g. a whole JSON value).
enum class StopReason : uint8_t { kMaxTokens, kEos, kStopString, kCallback, kContextFull, kConstraintComplete };
// "max_tokens" | "eos" | "stop_string" | "callback" | "context_full" | "constraint_complete"
std::string_view stop_reason_name(StopReason r);

struct GenerateOptions {
  int max_new_tokens = 128;                // tokens to generate at most (>= 1)
  SamplerConfig sampler;                   // greedy by default
  std::vector<int32_t> eos_token_ids;      // stop tokens; empty: the model config's eos_token_ids
  bool ignore_eos = false;                 // generate max_new_tokens whatever comes (benchmarks)
  std::vector<int32_t> stop_token_ids;     // more stop tokens, honoured even with ignore_eos (StopReason::kEos)
  std::vector<std::string> stop_strings;   // stop when the decoded text contains one (not emitted)
};

struct GenerateSummary {
  std::string attention;               // method name
  int64_t prompt_tokens = 0;
  int64_t reused_tokens = 0;           // of those, tokens taken from a prefix cache or snapshot (not prefilled)
  int64_t generated_tokens = 0;        // sampled tokens, the stop token included
  int64_t decode_steps = 0;            // SequenceSession::decode calls (generated_tokens - 1 at most)
  double prefill_seconds = 0.0;        // prefill + on_prefill (index construction)
  double decode_seconds = 0.0;         // all decode steps, sampling included
  double prefill_tokens_per_s = 0.0;   // prompt_tokens / prefill_seconds
  double decode_tokens_per_s = 0.0;    // decode_steps / decode_seconds
  double time_to_first_token_s = 0.0;  // prefill + first sample
  // KV read over all decode steps and layers, exactly: sum of AttentionStats::exact_tokens over
  // sum of context_tokens (1 for full attention).
  int64_t exact_tokens = 0;
  int64_t context_tokens = 0;
  double kv_read_share = 0.0;
  double mean_exact_tokens_per_head = 0.0;  // exact_tokens / (decode_steps * layers * kv heads)
  StopReason stop_reason = StopReason::kMaxTokens;
  // The session's KV placement and host-tier traffic at the end (SequenceSession::kv_placement_report;
  // nullopt on the CPU runner).
  std::optional<KvPlacementReport> kv_placement;
  std::vector<int32_t> tokens;         // generated ids
  std::vector<TokenLogprobs> logprobs; // one per generated token when sampler.logprobs >= 0, else empty
  std::string text;                    // emitted text (stop string excluded)
};

// The text a token adds to the output (from a streaming detokenizer; may be empty while a UTF-8
// sequence is incomplete).
using TokenText = std::function<std::string(int32_t token)>;
// Called once per generated token with the text that may be shown now (possibly empty), and once more
// with the last token when generation ends without a stop string while text was still withheld (a
// possible stop-string prefix). Return false to stop generating.
using TokenCallback = std::function<bool(int32_t token, std::string_view text)>;

struct GenerateCallbacks {
  TokenText token_text;       // required when stop_strings are given; else optional
  TokenCallback on_token;     // optional
  PrefillProgress on_prefill; // optional
  // Optional, with sampler.logprobs >= 0: each generated token's log-probabilities, called right before its
  // on_token.
  std::function<void(const TokenLogprobs&)> on_logprobs;
};

// The per-token logic of one generation, apart from running the model: sampling with the request's own
// Sampler, EOS, stop strings (StopMatcher), the streaming callback, max_new_tokens, the context limit, and
// the summary. continue_generation drives it with one session's decode(); the batch scheduler
// (batch_scheduler.h) with batched decode steps over many sequences. Not thread-safe (one caller).
class GenerationStepper {
 public:
  // Validates opt (max_new_tokens >= 1, the sampler config, stop strings need cb.token_text). Keeps
  // references to `session` (for its position and limits) and copies opt and cb. The decode clock starts here.
  GenerationStepper(const SequenceSession& session, const GenerateOptions& opt, const GenerateCallbacks& cb);
  // Samples the next token from `logits` ([vocab], of the prefill or the last decode) and handles it
  // (callbacks included). Returns true when the session must now be fed next_token() (decode), false when
  // the generation ended (done()).
  bool step(std::span<const float> logits);
  int32_t next_token() const { return sum_.tokens.back(); }
  // After each decode that fed next_token(): counts the step and its attention statistics.
  void count_decode(const AttentionStats& stats);
  // Ends the generation now with StopReason::kCallback (a cancelled request); no-op when done().
  void cancel();
  bool done() const { return done_; }
  // Records the prefill (the prompt, seconds) for the summary (time_to_first_token_s then includes it) and
  // for the sampler (repetition_penalty counts the prompt's tokens).
  void set_prefill(std::span<const int32_t> prompt, double seconds);
  // The summary (every field); call once, after done().
  GenerateSummary finish();

 private:
  const SequenceSession& session_;
  GenerateOptions opt_;
  GenerateCallbacks cb_;
  Sampler sampler_;
  std::vector<int32_t> eos_;
  StopMatcher matcher_;
  GenerateSummary sum_;
  std::chrono::steady_clock::time_point t0_;
  bool done_ = false;
};

// Checks a generation request against the model (max_new_tokens >= 1, a non-empty prompt, stop strings
// need cb.token_text, prompt + max_new_tokens within the model's context) and makes its session
// (make_session with max_context = prompt + max_new_tokens, so its memory checks refuse oversized requests
// before any work). generate() and the batch scheduler start every request here.
std::unique_ptr<SequenceSession> make_generation_session(const EngineModel& model, const SessionOptions& session,
                                                         std::span<const int32_t> prompt, const GenerateOptions& opt,
                                                         const GenerateCallbacks& cb);

// Samples and decodes on an already prefilled session, starting from `logits` ([vocab], the output of its
// prefill or last decode step). Fills every summary field except prompt_tokens, prefill_seconds and
// prefill_tokens_per_s; time_to_first_token_s counts from the call.
// Any SequenceSession: the CPU Session or the CUDA runner's.
GenerateSummary continue_generation(SequenceSession& session, std::vector<float> logits, const GenerateOptions& opt,
                                    const GenerateCallbacks& cb = {});

// Runs prompt + generation on a fresh session of `model` (make_session: on the model's device) with
// max_context = prompt + max_new_tokens (so the context and memory checks refuse oversized requests with
// an Error before any work).
// prefix: optional, a cache of prefilled prompts (prefix_cache.h): the longest cached prefix of `prompt` is
// loaded instead of prefilled (reused_tokens), and the prompt's blocks are added to it after the prefill.
// context: optional, a prefilled context (a snapshot's) that `prompt` starts with: loaded whole when the prompt
// is longer, all but its last token when the prompt is the context itself (context_prefix_for, prefix_cache.h;
// Error when the prompt does not start with it). At most one of the two.
GenerateSummary generate(const EngineModel& model, const SessionOptions& session, std::span<const int32_t> prompt,
                         const GenerateOptions& opt, const GenerateCallbacks& cb = {}, PrefixCache* prefix = nullptr,
                         const KvPrefix* context = nullptr);
// The same on the CPU runner.
GenerateSummary generate(const Model& model, const SessionOptions& session, std::span<const int32_t> prompt,
                         const GenerateOptions& opt, const GenerateCallbacks& cb = {});

}  // namespace retroinfer
