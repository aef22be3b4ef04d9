#include "retroinfer/generate.h"

#include <algorithm>
#include <chrono>

#include "retroinfer/error.h"

namespace retroinfer {
namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

GenerateSummary continue_generation(SequenceSession& session, std::vector<float> logits, const GenerateOptions& opt,
                                    const GenerateCallbacks& cb) {
  RETROINFER_CHECK(opt.max_new_tokens >= 1, "generate: max_new_tokens must be >= 1, got ", opt.max_new_tokens);
  RETROINFER_CHECK(opt.stop_strings.empty() || cb.token_text,
                   "generate: stop strings need a token_text callback (a detokenizer)");
  const ModelConfig& c = session.model_config();
  RETROINFER_CHECK(static_cast<int64_t>(logits.size()) == c.vocab_size, "generate: logits of size ", logits.size(),
                   ", expected vocab_size ", c.vocab_size);
  Sampler sampler(opt.sampler);
  const std::vector<int32_t>& eos = opt.eos_token_ids.empty() ? c.eos_token_ids : opt.eos_token_ids;
  StopMatcher matcher(opt.stop_strings);
  GenerateSummary sum;
  sum.attention = std::string(attention_kind_name(session.attention_config().kind));
  const auto t1 = std::chrono::steady_clock::now();
  bool first = true;
  bool stopped = false;
  for (int i = 0; i < opt.max_new_tokens; ++i) {
    const int32_t tok = sampler.sample(logits);
    if (first) {
      sum.time_to_first_token_s = seconds_since(t1);
      first = false;
    }
    sum.tokens.push_back(tok);
    if (!opt.ignore_eos && std::find(eos.begin(), eos.end(), tok) != eos.end()) {
      sum.stop_reason = StopReason::kEos;
      stopped = true;
      if (cb.on_token) cb.on_token(tok, {});
      break;
    }
    std::string text = cb.token_text ? cb.token_text(tok) : std::string();
    StopMatcher::Result r = matcher.feed(text);
    sum.text += r.emit;
    const bool go_on = cb.on_token ? cb.on_token(tok, r.emit) : true;
    if (r.stopped) {
      sum.stop_reason = StopReason::kStopString;
      stopped = true;
      break;
    }
    if (!go_on) {
      sum.stop_reason = StopReason::kCallback;
      stopped = true;
      break;
    }
    if (i + 1 == opt.max_new_tokens) break;
    if (session.position() >= session.max_context()) {
      sum.stop_reason = StopReason::kContextFull;
      stopped = true;
      break;
    }
    session.decode(tok, logits);
    ++sum.decode_steps;
    sum.exact_tokens += session.last_stats().exact_tokens;
    sum.context_tokens += session.last_stats().context_tokens;
  }
  sum.decode_seconds = seconds_since(t1);
  if (!stopped) {
    sum.stop_reason = StopReason::kMaxTokens;
    std::string rest = matcher.flush();
    if (!rest.empty()) {
      sum.text += rest;
      if (cb.on_token) cb.on_token(sum.tokens.back(), rest);
    }
  }
  sum.generated_tokens = static_cast<int64_t>(sum.tokens.size());
  sum.decode_tokens_per_s = sum.decode_seconds > 0 ? sum.decode_steps / sum.decode_seconds : 0.0;
  sum.kv_read_share = sum.context_tokens > 0 ? static_cast<double>(sum.exact_tokens) / sum.context_tokens : 0.0;
  const double heads = static_cast<double>(sum.decode_steps) * c.num_layers * c.num_heads_kv;
  sum.mean_exact_tokens_per_head = heads > 0 ? sum.exact_tokens / heads : 0.0;
  return sum;
}

GenerateSummary generate(const EngineModel& model, const SessionOptions& session_opt, std::span<const int32_t> prompt,
                         const GenerateOptions& opt, const GenerateCallbacks& cb) {
  RETROINFER_CHECK(opt.max_new_tokens >= 1, "generate: max_new_tokens must be >= 1, got ", opt.max_new_tokens);
  RETROINFER_CHECK(!prompt.empty(), "generate: empty prompt");
  RETROINFER_CHECK(opt.stop_strings.empty() || cb.token_text,
                   "generate: stop strings need a token_text callback (a detokenizer)");
  const int64_t need = static_cast<int64_t>(prompt.size()) + opt.max_new_tokens;
  const int64_t model_max = model_max_context(model.config());
  RETROINFER_CHECK(need <= model_max, "generate: the prompt (", prompt.size(), " tokens) plus max_new_tokens (",
                   opt.max_new_tokens, ") is ", need, " tokens, more than the model's maximum context of ", model_max,
                   "; shorten the prompt or lower --max-new-tokens");
  SessionOptions so = session_opt;
  so.max_context = need;  // the last sampled token is never fed back: the cache holds at most need - 1
  const std::unique_ptr<SequenceSession> session = make_session(model, so);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits = session->prefill(prompt, false, cb.on_prefill);
  const double prefill_s = seconds_since(t0);
  GenerateSummary sum = continue_generation(*session, std::move(logits), opt, cb);
  sum.prompt_tokens = static_cast<int64_t>(prompt.size());
  sum.prefill_seconds = prefill_s;
  sum.prefill_tokens_per_s = prefill_s > 0 ? sum.prompt_tokens / prefill_s : 0.0;
  sum.time_to_first_token_s += prefill_s;
  return sum;
}

GenerateSummary generate(const Model& model, const SessionOptions& session, std::span<const int32_t> prompt,
                         const GenerateOptions& opt, const GenerateCallbacks& cb) {
  const EngineModel cpu(model);
  return generate(cpu, session, prompt, opt, cb);
}

}  // namespace retroinfer
