#include "retroinfer/generate.h"

#include <algorithm>
#include <chrono>

#include "retroinfer/error.h"
#include "retroinfer/prefix_cache.h"

namespace retroinfer {
namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void check_request(const GenerateOptions& opt, const GenerateCallbacks& cb) {
  RETROINFER_CHECK(opt.max_new_tokens >= 1, "generate: max_new_tokens must be >= 1, got ", opt.max_new_tokens);
  RETROINFER_CHECK(opt.stop_strings.empty() || cb.token_text,
                   "generate: stop strings need a token_text callback (a detokenizer)");
}
}  // namespace

GenerationStepper::GenerationStepper(const SequenceSession& session, const GenerateOptions& opt,
                                     const GenerateCallbacks& cb)
    : session_(session), opt_((check_request(opt, cb), opt)), cb_(cb), sampler_(opt.sampler),
      matcher_(opt.stop_strings), t0_(std::chrono::steady_clock::now()) {
  const ModelConfig& c = session.model_config();
  eos_ = opt.eos_token_ids.empty() ? c.eos_token_ids : opt.eos_token_ids;
  sum_.attention = std::string(attention_kind_name(session.attention_config().kind));
}

bool GenerationStepper::step(std::span<const float> logits) {
  RETROINFER_CHECK(!done_, "generate: step after the generation ended");
  RETROINFER_CHECK(static_cast<int64_t>(logits.size()) == session_.model_config().vocab_size, "generate: logits of size ",
                   logits.size(), ", expected vocab_size ", session_.model_config().vocab_size);
  const int32_t tok = sampler_.sample(logits);
  if (sum_.tokens.empty()) sum_.time_to_first_token_s = seconds_since(t0_);
  sum_.tokens.push_back(tok);
  if (opt_.sampler.logprobs >= 0) {
    sum_.logprobs.push_back(sampler_.last_logprobs());
    if (cb_.on_logprobs) cb_.on_logprobs(sum_.logprobs.back());
  }
  done_ = true;  // until the checks below say go on
  const auto listed = [tok](const std::vector<int32_t>& ids) { return std::find(ids.begin(), ids.end(), tok) != ids.end(); };
  if ((!opt_.ignore_eos && listed(eos_)) || listed(opt_.stop_token_ids)) {
    sum_.stop_reason = StopReason::kEos;
    if (cb_.on_token) cb_.on_token(tok, {});
    return false;
  }
  std::string text = cb_.token_text ? cb_.token_text(tok) : std::string();
  StopMatcher::Result r = matcher_.feed(text);
  sum_.text += r.emit;
  const bool go_on = cb_.on_token ? cb_.on_token(tok, r.emit) : true;
  if (r.stopped) {
    sum_.stop_reason = StopReason::kStopString;
    return false;
  }
  if (opt_.sampler.constraint && opt_.sampler.constraint->complete()) {
    sum_.stop_reason = StopReason::kConstraintComplete;  // the text is whole: flush what a stop string held
    std::string rest = matcher_.flush();
    if (!rest.empty()) {
      sum_.text += rest;
      if (cb_.on_token) cb_.on_token(tok, rest);
    }
    return false;
  }
  if (!go_on) {
    sum_.stop_reason = StopReason::kCallback;
    return false;
  }
  if (static_cast<int64_t>(sum_.tokens.size()) == opt_.max_new_tokens) {
    sum_.stop_reason = StopReason::kMaxTokens;  // an end without a stop string: flush the withheld text
    std::string rest = matcher_.flush();
    if (!rest.empty()) {
      sum_.text += rest;
      if (cb_.on_token) cb_.on_token(tok, rest);
    }
    return false;
  }
  if (session_.position() >= session_.max_context()) {
    sum_.stop_reason = StopReason::kContextFull;
    return false;
  }
  done_ = false;
  return true;
}

void GenerationStepper::count_decode(const AttentionStats& stats) {
  ++sum_.decode_steps;
  sum_.exact_tokens += stats.exact_tokens;
  sum_.context_tokens += stats.context_tokens;
}

void GenerationStepper::cancel() {
  if (done_) return;
  done_ = true;
  sum_.stop_reason = StopReason::kCallback;
}

void GenerationStepper::set_prefill(std::span<const int32_t> prompt, double seconds) {
  const auto prompt_tokens = static_cast<int64_t>(prompt.size());
  sampler_.add_prompt(prompt);
  sum_.prompt_tokens = prompt_tokens;
  sum_.prefill_seconds = seconds;
  sum_.prefill_tokens_per_s = seconds > 0 ? prompt_tokens / seconds : 0.0;
}

GenerateSummary GenerationStepper::finish() {
  RETROINFER_CHECK(done_, "generate: finish before the generation ended");
  GenerateSummary sum = std::move(sum_);
  sum.decode_seconds = seconds_since(t0_);
  sum.time_to_first_token_s += sum.prefill_seconds;
  const ModelConfig& c = session_.model_config();
  sum.generated_tokens = static_cast<int64_t>(sum.tokens.size());
  sum.decode_tokens_per_s = sum.decode_seconds > 0 ? sum.decode_steps / sum.decode_seconds : 0.0;
  sum.kv_read_share = sum.context_tokens > 0 ? static_cast<double>(sum.exact_tokens) / sum.context_tokens : 0.0;
  const double heads = static_cast<double>(sum.decode_steps) * c.num_layers * c.num_heads_kv;
  sum.mean_exact_tokens_per_head = heads > 0 ? sum.exact_tokens / heads : 0.0;
  return sum;
}

GenerateSummary continue_generation(SequenceSession& session, std::vector<float> logits, const GenerateOptions& opt,
                                    const GenerateCallbacks& cb) {
  GenerationStepper g(session, opt, cb);
  while (g.step(logits)) {
    session.decode(g.next_token(), logits);
    g.count_decode(session.last_stats());
  }
  GenerateSummary sum = g.finish();
  sum.kv_placement = session.kv_placement_report();
  return sum;
}

std::unique_ptr<SequenceSession> make_generation_session(const EngineModel& model, const SessionOptions& session_opt,
                                                         std::span<const int32_t> prompt, const GenerateOptions& opt,
                                                         const GenerateCallbacks& cb) {
  check_request(opt, cb);
  RETROINFER_CHECK(!prompt.empty(), "generate: empty prompt");
  const int64_t need = static_cast<int64_t>(prompt.size()) + opt.max_new_tokens;
  const int64_t model_max = model_max_context(model.config());
  RETROINFER_CHECK(need <= model_max, "generate: the prompt (", prompt.size(), " tokens) plus max_new_tokens (",
                   opt.max_new_tokens, ") is ", need, " tokens, more than the model's maximum context of ", model_max,
                   "; shorten the prompt or lower --max-new-tokens");
  SessionOptions so = session_opt;
  so.max_context = need;  // the last sampled token is never fed back: the cache holds at most need - 1
  return make_session(model, so);
}

GenerateSummary generate(const EngineModel& model, const SessionOptions& session_opt, std::span<const int32_t> prompt,
                         const GenerateOptions& opt, const GenerateCallbacks& cb, PrefixCache* prefix,
                         const KvPrefix* context) {
  RETROINFER_CHECK(prefix == nullptr || context == nullptr, "generate: a prefix cache and a context at once");
  const std::unique_ptr<SequenceSession> session = make_generation_session(model, session_opt, prompt, opt, cb);
  const auto t0 = std::chrono::steady_clock::now();
  int64_t reused = 0;
  if (prefix != nullptr)
    reused = reuse_prefix(*prefix, *session, prompt, session_opt.kv_dtype, session_opt.prefill_chunk);
  if (context != nullptr) {
    RETROINFER_CHECK(prefix_cache_applies(model.config()), "generate: this model's RoPE is `dynamic`: its K/V depends "
                     "on the prompt's length, so a saved context cannot be continued; prefill the whole prompt");
    const KvPrefix use = calibration_safe_prefix(context_prefix_for(*context, prompt),
                                                 static_cast<int64_t>(prompt.size()), session_opt.attention,
                                                 session_opt.prefill_chunk);
    session->load_prefix(use);
    reused = use.size();
  }
  std::vector<float> logits = session->prefill(prompt, false, cb.on_prefill);
  const double prefill_s = seconds_since(t0);
  GenerationStepper g(*session, opt, cb);
  g.set_prefill(prompt, prefill_s);
  while (g.step(logits)) {
    session->decode(g.next_token(), logits);
    g.count_decode(session->last_stats());
  }
  GenerateSummary sum = g.finish();
  // After the generation: the copy of the prompt's K/V does not delay the first token.
  if (prefix != nullptr) remember_prefix(*prefix, *session, prompt, session_opt.kv_dtype, session_opt.prefill_chunk);
  sum.kv_placement = session->kv_placement_report();
  sum.reused_tokens = reused;
  return sum;
}

GenerateSummary generate(const Model& model, const SessionOptions& session, std::span<const int32_t> prompt,
                         const GenerateOptions& opt, const GenerateCallbacks& cb) {
  const EngineModel cpu(model);
  return generate(cpu, session, prompt, opt, cb);
}

}  // namespace retroinfer
