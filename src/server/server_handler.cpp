#include "server/server_handler.h"

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <utility>

#include "engine/kv_placement_json.h"
#include "retroinfer/error.h"
#include "retroinfer/generate.h"
#include "retroinfer/text_generate.h"
#include "server/openai_logprobs.h"

namespace retroinfer::server {

using nlohmann::json;

struct ServerHandler::Prepared {
  CompletionRequest req;
  std::vector<int32_t> ids;  // the prompt's tokens (chat: the rendered template's)
  int64_t max_tokens = 0;    // resolved: given or default, within the context
  std::string id;            // "cmpl-N" | "chatcmpl-N"
  int64_t created = 0;       // Unix seconds
  std::string model;         // echoed model name
};

namespace {

// Serialises a reply; strings from the model are valid UTF-8 (StreamingDecoder), replace guards the rest.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

HttpReply json_reply(int status, const json& j) {
  HttpReply r;
  r.status = status;
  r.body = dump(j);
  return r;
}

HttpReply error_reply(const ApiError& e) { return json_reply(e.status(), error_json(e)); }

std::string finish_reason(StopReason r) {
  switch (r) {
    case StopReason::kMaxTokens:
    case StopReason::kContextFull:
      return "length";
    default:
      return "stop";  // eos, a stop string, or the client went away
  }
}

// The retroinfer extension: the attention method, the share of the cached KV read exactly and, on the CUDA
// runner, where the request's KV lived (add_kv_placement_json: with host-tier layers the block cache's hit
// ratio and the PCIe bytes of its misses).
json extension_json(const GenerateSummary& s, const EngineModel& model) {
  json j = {{"attention", s.attention},
          {"device", std::string(device_name(model.device()))},
          {"kv_read_share", s.kv_read_share},
          {"exact_tokens", s.exact_tokens},
          {"context_tokens", s.context_tokens},
          {"decode_steps", s.decode_steps},
          {"stop_reason", std::string(stop_reason_name(s.stop_reason))},
          {"prefill_seconds", s.prefill_seconds},
          {"decode_seconds", s.decode_seconds},
          {"time_to_first_token_s", s.time_to_first_token_s}};
  add_kv_placement_json(j, s.kv_placement);
  return j;
}

std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

}  // namespace

ServerHandler::ServerHandler(const EngineModel& model, const Tokenizer& tokenizer, ServerOptions opt,
                             std::shared_ptr<ServerMetrics> metrics)
    : model_(model),
      tok_(tokenizer),
      opt_(std::move(opt)),
      metrics_(metrics ? std::move(metrics) : std::make_shared<ServerMetrics>()) {
  const int64_t model_max = model_max_context(model_.config());
  context_limit_ = opt_.max_context > 0 ? opt_.max_context : model_max;
  if (model_max > 0) context_limit_ = std::min(context_limit_, model_max);
  RETROINFER_CHECK(context_limit_ > 1, "serve: the context limit is ", context_limit_,
                   " tokens; give --max-context >= 2 (the model config states no maximum)");
  RETROINFER_CHECK(opt_.default_max_tokens >= 1, "serve: the default max_tokens must be >= 1");
  // End of generation: the tokenizer's end tokens and the model config's eos ids (as `retroinfer generate`).
  eos_ids_ = end_of_generation_ids(model_.config(), &tok_);  // {-1} when none is known
  RETROINFER_CHECK(opt_.max_batch >= 1, "serve: --max-batch must be >= 1, got ", opt_.max_batch);
  RETROINFER_CHECK(opt_.prefill_step_tokens >= 0, "serve: --prefill-step must be >= 0, got ", opt_.prefill_step_tokens);
  RETROINFER_CHECK(opt_.max_queue >= 0, "serve: --max-queue must be >= 0, got ", opt_.max_queue);
  RETROINFER_CHECK(opt_.request_timeout_s >= 0, "serve: --request-timeout must be >= 0, got ", opt_.request_timeout_s);
  metrics_->max_batch = opt_.max_batch;
  metrics_->prefix_cache = opt_.prefix_cache;
  metrics_->set_prefix_gpu_tier(model_.prefix_gpu_tier_stats());
  BatchSchedulerOptions bo;
  bo.prefix_cache = opt_.prefix_cache;
  bo.max_batch = opt_.max_batch;
  bo.prefill_step_tokens = opt_.prefill_step_tokens;
  bo.session = opt_.session;
  scheduler_ = std::make_unique<BatchScheduler>(model_, bo);
}

ServerHandler::~ServerHandler() = default;

ServerHandler::Prepared ServerHandler::prepare(std::string_view body, bool chat) const {
  Prepared p;
  p.req = parse_completion_request(body, chat);
  if (!p.req.model.empty() && p.req.model != opt_.model_name)
    throw ApiError(404, "The model '" + p.req.model + "' does not exist; this server serves '" + opt_.model_name + "'",
                   "model", "model_not_found");
  if (p.req.n > opt_.max_batch)
    throw ApiError(400,
                   "'n' is " + std::to_string(p.req.n) + " but at most " + std::to_string(opt_.max_batch) +
                       " sequences generate at once (--max-batch); ask for at most that many choices",
                   "n");
  const int64_t vocab = model_.config().vocab_size;
  for (const auto& [id, bias] : p.req.logit_bias)
    if (id >= vocab)
      throw ApiError(400, "'logit_bias' names token " + std::to_string(id) + " but the vocabulary has " +
                              std::to_string(vocab) + " tokens", "logit_bias");
  for (const int32_t id : p.req.stop_token_ids)
    if (id >= vocab)
      throw ApiError(400, "'stop_token_ids' names token " + std::to_string(id) + " but the vocabulary has " +
                              std::to_string(vocab) + " tokens", "stop_token_ids");
  try {
    if (chat) {
      if (tok_.chat_format() == ChatFormat::kNone)
        throw ApiError(400, "this model has no known chat template; use /v1/completions with a prompt", "messages",
                       "no_chat_template");
      p.ids = tok_.encode_chat(p.req.messages, /*add_generation_prompt=*/true, opt_.parse_special_in_content);
    } else {
      p.ids = tok_.encode(p.req.prompt, /*add_special=*/true, /*parse_special=*/true);
    }
  } catch (const Error& e) {
    throw ApiError(400, std::string("cannot tokenise the request: ") + e.what(), chat ? "messages" : "prompt");
  }
  const auto n = static_cast<int64_t>(p.ids.size());
  const char* what = chat ? "messages" : "prompt";
  if (n == 0) throw ApiError(400, std::string("the ") + what + " encodes to no tokens", what, "empty_prompt");
  if (n >= context_limit_)
    throw ApiError(400,
                   std::string("the ") + what + " is " + std::to_string(n) + " tokens but the context holds " +
                       std::to_string(context_limit_) + " tokens (prompt + completion): shorten it to at most " +
                       std::to_string(context_limit_ - 1) + " tokens",
                   what, "context_length_exceeded");
  if (p.req.max_tokens) {
    if (n + *p.req.max_tokens > context_limit_)
      throw ApiError(400,
                     std::string("the ") + what + " is " + std::to_string(n) + " tokens and max_tokens is " +
                         std::to_string(*p.req.max_tokens) + ": together more than the context of " +
                         std::to_string(context_limit_) + " tokens; lower max_tokens to at most " +
                         std::to_string(context_limit_ - n),
                     "max_tokens", "context_length_exceeded");
    p.max_tokens = *p.req.max_tokens;
  } else {
    p.max_tokens = std::min(opt_.default_max_tokens, context_limit_ - n);
  }
  const uint64_t k = next_id_.fetch_add(1);
  p.id = std::string(chat ? "chatcmpl-" : "cmpl-") + std::to_string(k);
  p.created = static_cast<int64_t>(std::time(nullptr));
  p.model = opt_.model_name;
  return p;
}

namespace {

// Why a request ended before its end; the first reason set wins.
enum class CancelReason : int { kNone = 0, kClientGone, kDeadline, kShutdown };

// A piece of streamed output: the text of choice `index` that is safe to show now, with the log-probabilities
// of the tokens that made it (when asked for).
struct StreamItem {
  int index = 0;
  std::string text;
  std::vector<TokenLogprobs> logprobs;
};

// What the scheduler's worker hands to the thread serving a request (all its choices): items as they become
// safe to show (streamed requests), and the ends of the scheduler requests. Shared by both threads (the
// worker's callbacks keep it alive).
struct StreamChannel {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<StreamItem> items;   // guarded by mu
  size_t done = 0;                // guarded by mu: scheduler requests whose result is set
  std::atomic<bool> gone{false};  // the request is cancelled: the worker's on_token stops its choices
};
// summary.text ends with the detokenizer's flushed tail (an incomplete UTF-8 sequence at the end becomes
// U+FFFD); returns that tail when it was added.
std::string add_tail(GenerateSummary& s, StreamingDecoder& dec) {
  std::string tail = dec.flush();
  if (s.stop_reason == StopReason::kStopString || tail.empty()) return {};
  s.text += tail;
  return tail;
}

// The log-probabilities reported for a generation: every sampled token's but an end-of-generation token's.
std::vector<TokenLogprobs> reported_logprobs(std::vector<TokenLogprobs> lp, StopReason why) {
  if (why == StopReason::kEos && !lp.empty()) lp.pop_back();
  return lp;
}

// The usage of a request's choices: the prompt once, the completion tokens of all choices; with a prefix-cache
// hit, OpenAI's prompt_tokens_details.cached_tokens (the prompt tokens loaded instead of prefilled).
json usage_of(const std::vector<GenerateSummary>& sums) {
  int64_t generated = 0, cached = 0;
  for (const GenerateSummary& s : sums) {
    generated += s.generated_tokens;
    cached = std::max(cached, s.reused_tokens);
  }
  const int64_t prompt = sums.empty() ? 0 : sums[0].prompt_tokens;
  json u = {{"prompt_tokens", prompt}, {"completion_tokens", generated}, {"total_tokens", prompt + generated}};
  if (cached > 0) u["prompt_tokens_details"] = {{"cached_tokens", cached}};
  return u;
}

using Clock = std::chrono::steady_clock;

}  // namespace

// One admitted generation request (all its `n` choices): its admission slot, cancellation and the timing its
// metrics need. Made by track() on the thread running the work; the scheduler's worker updates the timing.
struct TrackedRequest {
  ServerMetrics* metrics = nullptr;
  Clock::time_point admitted = Clock::now();
  std::optional<Clock::time_point> deadline;
  std::shared_ptr<StreamChannel> channel = std::make_shared<StreamChannel>();
  std::atomic<int> reason{0};  // CancelReason
  std::mutex mu;
  std::vector<std::shared_ptr<std::atomic<bool>>> cancel_flags;  // guarded by mu: the scheduler's, one a choice
  std::atomic<int64_t> kv_bytes{0};                // reserved in metrics' kv_bytes_* while in flight
  std::atomic<int64_t> counted{0};                 // tokens counted in metrics' generated_tokens
  bool kv_on_gpu = false;
  std::shared_ptr<json> log;                  // the reply's log fields
  std::vector<Clock::time_point> last_token;  // worker only: per choice (sized by run_choices)
  bool first_token = true;                    // worker only

  ~TrackedRequest() { release_kv(); }
  // The live token count misses the tokens that show no text (an end-of-generation token): the summaries'
  // count (all choices') settles it.
  void settle_tokens(int64_t generated) { metrics->generated_tokens.fetch_add(generated - counted.exchange(generated)); }
  // Gives back the KV bytes reserved in the metrics (once): when the results are in (the scheduler may keep
  // the requests' callbacks, and with them this object, a little longer).
  void release_kv() {
    (kv_on_gpu ? metrics->kv_bytes_gpu : metrics->kv_bytes_host).fetch_sub(kv_bytes.exchange(0));
  }
  CancelReason why() const { return static_cast<CancelReason>(reason.load()); }
  // Ends every choice submitted (and, through why(), keeps the others from being submitted).
  void cancel(CancelReason r) {
    int none = 0;
    reason.compare_exchange_strong(none, static_cast<int>(r));
    channel->gone.store(true);
    {
      std::lock_guard<std::mutex> lk(mu);
      for (const auto& flag : cancel_flags) flag->store(true);
    }
    {
      std::lock_guard<std::mutex> lk(channel->mu);  // the waiter checks `reason` under this lock
    }
    channel->cv.notify_all();
  }
  // On the worker, per sampled token of choice `choice`: the time to the request's first token, and the
  // gaps between the tokens of each choice.
  void on_token(int choice) {
    const Clock::time_point now = Clock::now();
    metrics->generated_tokens.fetch_add(1);
    counted.fetch_add(1);
    if (first_token)
      metrics->time_to_first_token.observe(std::chrono::duration<double>(now - admitted).count());
    else if (last_token[choice] != Clock::time_point())
      metrics->inter_token_latency.observe(std::chrono::duration<double>(now - last_token[choice]).count());
    first_token = false;
    last_token[choice] = now;
  }
};

std::shared_ptr<TrackedRequest> ServerHandler::track(const RequestContext& ctx, std::shared_ptr<json> log) {
  auto t = std::make_shared<TrackedRequest>();
  t->log = std::move(log);
  t->metrics = metrics_.get();
  if (opt_.request_timeout_s > 0)
    t->deadline = t->admitted + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(opt_.request_timeout_s));
  std::weak_ptr<TrackedRequest> weak = t;
  ctx.client_gone->on_cancel([weak] {
    if (auto p = weak.lock()) p->cancel(CancelReason::kClientGone);
  });
  std::lock_guard<std::mutex> lk(tracked_mu_);
  std::erase_if(tracked_, [](const std::weak_ptr<TrackedRequest>& w) { return w.expired(); });
  tracked_.push_back(t);
  return t;
}

namespace {

// The generation request of choice `choice` for the scheduler. The detokenizer is per request and used on
// the worker thread only (token_text), then by the caller after the result is ready (flush). Choice i
// samples with seed + i (n choices of one seeded request differ from each other and repeat across runs).
// `pending` (streamed requests with logprobs): the log-probabilities of the choice's tokens whose text is
// not out yet, used on the worker until the result is set.
BatchRequest make_request(const Tokenizer& tok, const std::vector<int32_t>& eos_ids, const std::vector<int32_t>& ids,
                          const CompletionRequest& req, int64_t max_tokens, int choice,
                          const std::shared_ptr<StreamingDecoder>& dec,
                          const std::shared_ptr<const JsonTokenTable>& json_table,
                          const std::shared_ptr<TrackedRequest>& t,
                          const std::shared_ptr<std::vector<TokenLogprobs>>& pending) {
  BatchRequest r;
  r.prompt = ids;
  r.options.max_new_tokens = static_cast<int>(max_tokens);
  SamplerConfig& sc = r.options.sampler;
  sc.temperature = req.temperature;
  sc.top_k = req.top_k;
  sc.top_p = req.top_p;
  sc.seed = req.seed + static_cast<uint64_t>(choice);
  sc.repetition_penalty = req.repetition_penalty;
  sc.frequency_penalty = req.frequency_penalty;
  sc.presence_penalty = req.presence_penalty;
  sc.logit_bias = req.logit_bias;
  sc.logprobs = req.logprobs;
  if (req.json_object) sc.constraint = std::make_shared<JsonConstraint>(json_table);
  r.options.stop_strings = req.stop;
  r.options.eos_token_ids = eos_ids;
  r.options.stop_token_ids = req.stop_token_ids;
  r.options.ignore_eos = req.ignore_eos;
  const int32_t vocab = tok.vocab_size();
  // A model's vocabulary may be larger than its tokenizer's (padded embedding rows): such ids show as
  // nothing instead of failing the request. token_text runs once per sampled token: the metrics' clock.
  r.callbacks.token_text = [dec, vocab, t, choice](int32_t id) {
    t->on_token(choice);
    return id >= 0 && id < vocab ? dec->push(id) : std::string();
  };
  if (pending) r.callbacks.on_logprobs = [pending](const TokenLogprobs& x) { pending->push_back(x); };
  // Every request has an on_token: a cancelled request (client gone, deadline, drain) stops at its next token
  // even before the scheduler's next iteration looks at its cancel flag. A streamed one's texts (with the
  // log-probabilities of their tokens) go to the thread writing them through the channel.
  auto ch = t->channel;
  r.callbacks.on_token = [ch, pending, choice, stream = req.stream](int32_t, std::string_view text) {
    if (stream && !text.empty()) {
      std::lock_guard<std::mutex> lk(ch->mu);
      StreamItem item{choice, std::string(text), {}};
      if (pending) {
        item.logprobs = std::move(*pending);
        pending->clear();
      }
      ch->items.push_back(std::move(item));
    }
    if (stream) ch->cv.notify_all();
    return !ch->gone.load();
  };
  r.on_done = [ch] {
    {
      std::lock_guard<std::mutex> lk(ch->mu);
      ++ch->done;
    }
    ch->cv.notify_all();
  };
  return r;
}

// Submits one choice's request and hands its cancel switch to `t` (a cancel that came first applies at once).
BatchHandle submit_tracked(BatchScheduler& scheduler, TrackedRequest& t, BatchRequest r) {
  BatchHandle h = scheduler.submit(std::move(r));
  std::lock_guard<std::mutex> lk(t.mu);
  t.cancel_flags.push_back(h.cancel_flag);
  if (t.why() != CancelReason::kNone) h.cancel();
  return h;
}

// Waits for the end of every submitted choice, handing the streamed items to `items` (may be empty) as
// they come; cancels the request at its deadline. Returns when all the results are set.
void wait_for_end(TrackedRequest& t, const std::vector<BatchHandle>& handles,
                  const std::function<void(std::deque<StreamItem>&)>& items) {
  StreamChannel& ch = *t.channel;
  std::optional<Clock::time_point> deadline = t.deadline;
  for (bool finished = false; !finished;) {
    std::deque<StreamItem> got;
    {
      std::unique_lock<std::mutex> lk(ch.mu);
      auto ready = [&] { return !ch.items.empty() || ch.done >= handles.size(); };
      if (deadline.has_value()) {
        const Clock::time_point until = deadline.value();
        if (!ch.cv.wait_until(lk, until, ready)) {
          lk.unlock();
          deadline.reset();  // cancelled once: now wait for the scheduler to end it
          t.cancel(CancelReason::kDeadline);
          for (const BatchHandle& h : handles) h.cancel();
          continue;
        }
      } else {
        ch.cv.wait(lk, ready);
      }
      got.swap(ch.items);
      finished = ch.done >= handles.size();
    }
    if (items && !got.empty()) items(got);
  }
}

// Submits the `n` choices of a request (none once it is cancelled: a request cancelled while it waited for
// its slot is never submitted, since once submitted the scheduler may start it before the cancellation
// reaches its flag), waits for them and collects their summaries (those of choices cancelled before they
// started stay empty).
void run_choices(BatchScheduler& scheduler, TrackedRequest& t,
                 const std::function<BatchRequest(int)>& request, int n,
                 const std::function<void(std::deque<StreamItem>&)>& items, std::vector<GenerateSummary>& sums) {
  std::vector<BatchHandle> handles;
  t.last_token.assign(static_cast<size_t>(n), Clock::time_point());
  try {
    for (int i = 0; i < n && t.why() == CancelReason::kNone; ++i)
      handles.push_back(submit_tracked(scheduler, t, request(i)));
  } catch (...) {
    for (const BatchHandle& h : handles) h.cancel();  // the other choices' results are not wanted any more
    throw;
  }
  if (!handles.empty()) wait_for_end(t, handles, items);
  t.release_kv();
  int64_t generated = 0;
  for (size_t i = 0; i < handles.size(); ++i) {
    try {
      sums[i] = handles[i].result.get();
      generated += sums[i].generated_tokens;
    } catch (const std::exception&) {
      if (t.why() == CancelReason::kNone) throw;  // else: cancelled before it started
    }
  }
  t.settle_tokens(generated);
}

ApiError cancelled_error(CancelReason r, double timeout_s) {
  if (r == CancelReason::kDeadline)
    return ApiError(504, "the request did not finish within --request-timeout " + std::to_string(timeout_s) +
                             " s; lower max_tokens or raise the server's --request-timeout",
                    "", "request_timeout", "server_error");
  return ApiError(503, "the server is shutting down; retry on another instance", "", "shutting_down",
                  "server_error");
}

}  // namespace

std::shared_ptr<const JsonTokenTable> ServerHandler::json_table() const {
  std::call_once(json_table_once_,
                 [&] { json_table_ = JsonTokenTable::build(tok_, model_.config().vocab_size, eos_ids_); });
  return json_table_;
}

ServerHandler::Stats ServerHandler::stats() const {
  return {generations_.load(), generated_tokens_.load(), cancelled_streams_.load(), scheduler_->stats().max_running};
}

void ServerHandler::count(const GenerateSummary& s, bool cancelled) {
  generations_.fetch_add(1);
  generated_tokens_.fetch_add(s.generated_tokens);
  if (cancelled) cancelled_streams_.fetch_add(1);
  metrics_->prompt_tokens.fetch_add(s.prompt_tokens);
  metrics_->kv_exact_tokens.fetch_add(s.exact_tokens);
  metrics_->kv_context_tokens.fetch_add(s.context_tokens);
  if (s.kv_placement) {
    metrics_->cache_hits.fetch_add(static_cast<int64_t>(s.kv_placement->cache_hits));
    metrics_->cache_misses.fetch_add(static_cast<int64_t>(s.kv_placement->cache_misses));
    metrics_->pcie_bytes.fetch_add(s.kv_placement->pcie_bytes);
  }
  metrics_->set_prefix_gpu_tier(model_.prefix_gpu_tier_stats());
}

namespace {

// Counts a request that ended early by its reason (once per request).
void count_cancel(ServerMetrics& m, CancelReason r, json& log) {
  log["cancelled"] = r == CancelReason::kClientGone ? "client_gone" : r == CancelReason::kDeadline ? "deadline" : "shutdown";
  if (r == CancelReason::kClientGone) m.requests_cancelled_client.fetch_add(1);
  if (r == CancelReason::kDeadline) m.requests_cancelled_deadline.fetch_add(1);
  if (r == CancelReason::kShutdown) m.requests_cancelled_shutdown.fetch_add(1);
}

// The log fields of a request's end: the tokens of all its choices, the first choice's stop reason and time
// to first token.
void log_summary(json& log, const std::string& id, const std::vector<GenerateSummary>& sums) {
  const json usage = usage_of(sums);
  log["id"] = id;
  log["prompt_tokens"] = usage["prompt_tokens"];
  log["completion_tokens"] = usage["completion_tokens"];
  log["stop_reason"] = std::string(stop_reason_name(sums[0].stop_reason));
  log["ttft_s"] = sums[0].time_to_first_token_s;
  if (sums.size() > 1) log["n"] = sums.size();
}

}  // namespace

HttpReply ServerHandler::complete(const Prepared& p, const std::shared_ptr<TrackedRequest>& t) {
  const int n = p.req.n;
  std::vector<GenerateSummary> sums(n);
  try {
    const auto table = p.req.json_object ? json_table() : nullptr;
    std::vector<std::shared_ptr<StreamingDecoder>> decs;
    for (int i = 0; i < n; ++i) decs.push_back(std::make_shared<StreamingDecoder>(tok_, /*skip_special=*/true));
    run_choices(
        *scheduler_, *t,
        [&](int i) { return make_request(tok_, eos_ids_, p.ids, p.req, p.max_tokens, i, decs[i], table, t, nullptr); },
        n, nullptr, sums);
    log_summary(*t->log, p.id, sums);
    const CancelReason why = t->why();
    if (why != CancelReason::kNone) {
      count_cancel(*metrics_, why, *t->log);
      for (const GenerateSummary& s : sums) count(s, why == CancelReason::kClientGone);
      if (why == CancelReason::kClientGone)
        return error_reply(ApiError(499, "the client closed the connection", "", "client_gone"));
      return error_reply(cancelled_error(why, opt_.request_timeout_s));
    }
    for (int i = 0; i < n; ++i) {
      add_tail(sums[i], *decs[i]);
      count(sums[i], false);
    }
  } catch (const std::exception& e) {
    return error_reply(ApiError(500, std::string("generation failed: ") + e.what(), "", "generation_failed",
                                "server_error"));
  }
  json choices = json::array();
  for (int i = 0; i < n; ++i) {
    const GenerateSummary& s = sums[i];
    json choice = {{"index", i}, {"finish_reason", finish_reason(s.stop_reason)}};
    json logprobs = nullptr;
    if (p.req.logprobs >= 0) {
      const auto lps = reported_logprobs(s.logprobs, s.stop_reason);
      size_t offset = 0;
      logprobs = p.req.chat ? chat_logprobs_json(tok_, lps) : completion_logprobs_json(tok_, lps, offset);
    }
    if (p.req.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", s.text}};
    } else {
      choice["text"] = s.text;
    }
    choice["logprobs"] = std::move(logprobs);
    choices.push_back(std::move(choice));
  }
  return json_reply(200, {{"id", p.id},
                          {"object", p.req.chat ? "chat.completion" : "text_completion"},
                          {"created", p.created},
                          {"model", p.model},
                          {"choices", std::move(choices)},
                          {"usage", usage_of(sums)},
                          {"retroinfer", extension_json(sums[0], model_)}});
}

void ServerHandler::stream(const Prepared& p, const std::shared_ptr<TrackedRequest>& t, const ChunkWriter& write) {
  const int n = p.req.n;
  const char* object = p.req.chat ? "chat.completion.chunk" : "text_completion";
  auto chunk = [&](json choices) {
    json j = {{"id", p.id}, {"object", object}, {"created", p.created}, {"model", p.model},
              {"choices", std::move(choices)}};
    if (p.req.include_usage) j["usage"] = nullptr;  // OpenAI: every chunk but the usage chunk has usage null
    return j;
  };
  bool gone = false;
  auto send = [&](const json& j) {
    if (!gone && !write(sse(j))) gone = true;
    return !gone;
  };
  std::vector<size_t> offsets(n, 0);  // completions' text_offset per choice
  auto delta = [&](int index, std::string_view text, const std::vector<TokenLogprobs>& lps) {
    json c = {{"index", index}, {"finish_reason", nullptr}};
    if (p.req.chat)
      c["delta"] = {{"content", std::string(text)}};
    else
      c["text"] = std::string(text);
    if (p.req.logprobs >= 0)
      c["logprobs"] = p.req.chat ? chat_logprobs_json(tok_, lps) : completion_logprobs_json(tok_, lps, offsets[index]);
    return send(chunk(json::array({std::move(c)})));
  };
  auto write_error = [&](const ApiError& err) {
    if (write("data: " + dump(error_json(err)) + "\n\n")) write("data: [DONE]\n\n");
  };
  if (p.req.chat) {
    for (int i = 0; i < n; ++i) {
      json first = {{"index", i}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"finish_reason", nullptr}};
      if (!send(chunk(json::array({std::move(first)})))) {
        t->cancel(CancelReason::kClientGone);
        count_cancel(*metrics_, CancelReason::kClientGone, *t->log);
        return;
      }
    }
  }
  std::vector<GenerateSummary> sums(n);
  if (t->why() != CancelReason::kNone) {  // cancelled while it waited for its slot: never submitted
    t->release_kv();
    for (const GenerateSummary& s : sums) count(s, t->why() == CancelReason::kClientGone);
    count_cancel(*metrics_, t->why(), *t->log);
    if (t->why() != CancelReason::kClientGone) write_error(cancelled_error(t->why(), opt_.request_timeout_s));
    return;
  }
  try {
    const auto table = p.req.json_object ? json_table() : nullptr;
    std::vector<std::shared_ptr<StreamingDecoder>> decs;
    // Per choice, on the worker: the log-probabilities of tokens whose text is not out yet.
    std::vector<std::shared_ptr<std::vector<TokenLogprobs>>> pending;
    for (int i = 0; i < n; ++i) {
      decs.push_back(std::make_shared<StreamingDecoder>(tok_, /*skip_special=*/true));
      pending.push_back(p.req.logprobs >= 0 ? std::make_shared<std::vector<TokenLogprobs>>() : nullptr);
    }
    // Write the items as they come, on this thread (a write blocks while the client's queue is full: the
    // scheduler's worker only appends to the channel); a failed write cancels the request, all its choices
    // (the scheduler ends them at its next iteration). run_choices always waits for the results: the worker
    // may still use `decs` and `pending`.
    run_choices(
        *scheduler_, *t,
        [&](int i) {
          return make_request(tok_, eos_ids_, p.ids, p.req, p.max_tokens, i, decs[i], table, t, pending[i]);
        },
        n,
        [&](std::deque<StreamItem>& items) {
          for (const StreamItem& it : items) {
            if (gone || t->why() != CancelReason::kNone || delta(it.index, it.text, it.logprobs)) continue;
            t->cancel(CancelReason::kClientGone);
          }
        },
        sums);
    if (t->why() == CancelReason::kNone) {
      for (int i = 0; i < n; ++i) {
        // The requests are done: the worker no longer touches decs[i] or pending[i].
        const std::string tail = add_tail(sums[i], *decs[i]);
        auto rest = pending[i] ? reported_logprobs(std::move(*pending[i]), sums[i].stop_reason)
                               : std::vector<TokenLogprobs>();
        if ((!tail.empty() || !rest.empty()) && !gone && !delta(i, tail, rest)) t->cancel(CancelReason::kClientGone);
      }
    }
    for (const GenerateSummary& s : sums) count(s, t->why() == CancelReason::kClientGone);
    log_summary(*t->log, p.id, sums);
  } catch (const std::exception& e) {
    write_error(ApiError(500, std::string("generation failed: ") + e.what(), "", "generation_failed", "server_error"));
    return;
  }
  const CancelReason why = t->why();
  if (why != CancelReason::kNone) {
    count_cancel(*metrics_, why, *t->log);
    if (why != CancelReason::kClientGone) write_error(cancelled_error(why, opt_.request_timeout_s));
    return;
  }
  for (int i = 0; i < n; ++i) {
    json last = {{"index", i}, {"finish_reason", finish_reason(sums[i].stop_reason)}};
    if (p.req.chat)
      last["delta"] = json::object();
    else
      last["text"] = "";
    json j = chunk(json::array({std::move(last)}));
    if (i == n - 1 && !p.req.include_usage) {  // without include_usage the usage rides on the last chunk
      j["usage"] = usage_of(sums);
      j["retroinfer"] = extension_json(sums[0], model_);
    }
    if (!send(j)) return;
  }
  if (p.req.include_usage) {
    json j = chunk(json::array());
    j["usage"] = usage_of(sums);
    j["retroinfer"] = extension_json(sums[0], model_);
    if (!send(j)) return;
  }
  write("data: [DONE]\n\n");
}

const std::string* HttpRequest::header(std::string_view lower_case_name) const {
  for (const auto& [name, value] : headers)
    if (name == lower_case_name) return &value;
  return nullptr;
}

void CancelSignal::cancel() {
  std::function<void()> action;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (cancelled_) return;
    cancelled_ = true;
    action = std::move(action_);
  }
  if (action) action();
}

bool CancelSignal::cancelled() const {
  std::lock_guard<std::mutex> lk(mu_);
  return cancelled_;
}

void CancelSignal::on_cancel(std::function<void()> action) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!cancelled_) {
      action_ = std::move(action);
      return;
    }
  }
  action();
}

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Equal strings, in a time that depends on the lengths only (an API key must not leak by timing).
bool constant_time_equal(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

bool is_generation_path(std::string_view path) {
  return path == "/v1/completions" || path == "/v1/chat/completions";
}

// The media type of a Content-Type value ("application/json; charset=utf-8" -> "application/json").
std::string media_type(std::string_view content_type) {
  const size_t semi = content_type.find(';');
  std::string_view t = content_type.substr(0, semi);
  while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.remove_suffix(1);
  while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.remove_prefix(1);
  return lower(t);
}

HttpReply text_reply(int status, std::string content_type, std::string body) {
  HttpReply r;
  r.status = status;
  r.content_type = std::move(content_type);
  r.body = std::move(body);
  return r;
}

}  // namespace

HttpReply loading_reply(const HttpRequest& req) {
  if (req.path == "/health") return json_reply(503, {{"status", "loading"}});
  HttpReply r = error_reply(ApiError(503, "the model is still loading; retry when GET /health answers 200", "",
                                     "loading", "server_error"));
  r.headers.emplace_back("Retry-After", "5");
  return r;
}

// The Host, Origin and API key checks; a reply with status 0 when the request may go on (`cors` then holds
// the headers a cross-origin reply carries).
HttpReply ServerHandler::check_access(const HttpRequest& req,
                                      std::vector<std::pair<std::string, std::string>>& cors) const {
  HttpReply ok;
  ok.status = 0;
  if (!opt_.allowed_hosts.empty()) {
    const std::string* host = req.header("host");
    const std::string h = host ? lower(*host) : std::string();
    const bool allowed = std::any_of(opt_.allowed_hosts.begin(), opt_.allowed_hosts.end(),
                                     [&](const std::string& a) { return lower(a) == h; });
    if (!allowed)
      return error_reply(ApiError(403, "the Host header '" + h + "' is not this server's address (the server binds a "
                                       "loopback address and accepts only its own names: DNS rebinding); start it "
                                       "with --allowed-hosts to accept another name",
                                  "", "host_not_allowed"));
  }
  if (const std::string* origin = req.header("origin")) {
    const bool allowed = std::any_of(opt_.allowed_origins.begin(), opt_.allowed_origins.end(),
                                     [&](const std::string& a) { return a == "*" || a == *origin; });
    if (!allowed)
      return error_reply(ApiError(403, "requests from the web origin '" + *origin + "' are not allowed; start the "
                                       "server with --allowed-origins to allow a browser page to call it",
                                  "", "origin_not_allowed"));
    cors.emplace_back("Access-Control-Allow-Origin", *origin);
    cors.emplace_back("Vary", "Origin");
    if (req.method == "OPTIONS") {
      HttpReply r = text_reply(204, "text/plain", "");
      r.headers = cors;
      r.headers.emplace_back("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      r.headers.emplace_back("Access-Control-Allow-Headers", "Authorization, Content-Type");
      r.headers.emplace_back("Access-Control-Max-Age", "600");
      return r;
    }
  }
  if (!opt_.api_key.empty() && req.path != "/health") {
    const std::string* auth = req.header("authorization");
    constexpr std::string_view kBearer = "Bearer ";
    const bool bearer = auth && auth->size() > kBearer.size() && lower(auth->substr(0, kBearer.size())) == "bearer ";
    if (!bearer || !constant_time_equal(std::string_view(*auth).substr(kBearer.size()), opt_.api_key)) {
      HttpReply r = error_reply(ApiError(401,
                                         bearer ? "the API key is not valid"
                                                : "an API key is required: send the header Authorization: Bearer KEY",
                                         "", "invalid_api_key"));
      r.headers.emplace_back("WWW-Authenticate", "Bearer");
      r.headers.insert(r.headers.end(), cors.begin(), cors.end());
      return r;
    }
  }
  return ok;
}

HttpReply ServerHandler::route(const HttpRequest& req) {
  const std::string_view method = req.method, path = req.path;
  auto method_not_allowed = [&](const char* allowed) {
    HttpReply r = error_reply(ApiError(405, std::string(method) + " is not allowed on " + std::string(path) +
                                                "; use " + allowed,
                                       "", "method_not_allowed"));
    r.headers.emplace_back("Allow", allowed);
    return r;
  };
  auto model_json = [&] {
    return json{{"id", opt_.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "retroinfer"},
                {"context_length", context_limit_}};
  };
  std::vector<std::pair<std::string, std::string>> cors;
  HttpReply r = [&]() -> HttpReply {
    try {
      HttpReply refused = check_access(req, cors);
      if (refused.status != 0) return refused;
      if (path == "/health") {
        if (method != "GET") return method_not_allowed("GET");
        return json_reply(200, {{"status", "ok"}});
      }
      if (path == "/metrics") {
        if (method != "GET") return method_not_allowed("GET");
        return text_reply(200, "text/plain; version=0.0.4", metrics_->render(true));
      }
      if (path == "/v1/models") {
        if (method != "GET") return method_not_allowed("GET");
        return json_reply(200, {{"object", "list"}, {"data", json::array({model_json()})}});
      }
      if (path.rfind("/v1/models/", 0) == 0) {
        if (method != "GET") return method_not_allowed("GET");
        const std::string_view id = path.substr(std::string_view("/v1/models/").size());
        if (id != opt_.model_name)
          return error_reply(ApiError(404, "The model '" + std::string(id) + "' does not exist; this server serves '" +
                                               opt_.model_name + "'",
                                      "model", "model_not_found"));
        return json_reply(200, model_json());
      }
      if (is_generation_path(path)) {
        if (method != "POST") return method_not_allowed("POST");
        const std::string* ct = req.header("content-type");
        if (!ct || media_type(*ct) != "application/json")
          return error_reply(ApiError(415,
                                      "the body must be JSON sent with Content-Type: application/json (got " +
                                          (ct ? "'" + *ct + "'" : std::string("none")) + ")",
                                      "", "unsupported_media_type"));
        if (draining_.load())
          return error_reply(ApiError(503, "the server is shutting down; retry on another instance", "",
                                      "shutting_down", "server_error"));
        // Admission: a slot among max_batch running + max_queue waiting (requests_in_flight), taken here and
        // given back when the work and the stream it returns are gone.
        const int64_t cap = int64_t(opt_.max_batch) + opt_.max_queue;
        int64_t n = metrics_->requests_in_flight.load();
        do {
          if (n >= cap) {
            HttpReply busy = error_reply(
                ApiError(429,
                         "the server is at capacity (" + std::to_string(opt_.max_batch) + " running, " +
                             std::to_string(opt_.max_queue) + " queued); retry after the Retry-After seconds",
                         "", "server_busy", "server_error"));
            busy.headers.emplace_back("Retry-After", "1");
            return busy;
          }
        } while (!metrics_->requests_in_flight.compare_exchange_weak(n, n + 1));
        HttpReply deferred;
        const bool chat = path == "/v1/chat/completions";
        // The slot: released when the work (and the stream it returns) is destroyed, run or not.
        auto slot = std::shared_ptr<void>(nullptr, [m = metrics_](void*) { m->requests_in_flight.fetch_sub(1); });
        deferred.work = [this, body = req.body, chat, slot, log = deferred.log](const RequestContext& ctx) {
          std::shared_ptr<TrackedRequest> t;
          try {
            auto p = std::make_shared<Prepared>(prepare(body, chat));
            t = track(ctx, log);
            const ModelConfig& c = model_.config();
            t->kv_on_gpu = model_.device() != Device::kCpu;
            // Every choice is a sequence of its own (prompt + completion).
            const int64_t kv_bytes = int64_t(p->req.n) * (static_cast<int64_t>(p->ids.size()) + p->max_tokens) *
                                     c.num_layers * 2 * c.num_heads_kv *
                                     stored_row_bytes(opt_.session.kv_dtype, c.head_dim);
            t->kv_bytes.store(kv_bytes);
            (t->kv_on_gpu ? metrics_->kv_bytes_gpu : metrics_->kv_bytes_host).fetch_add(kv_bytes);
            if (!p->req.stream) {
              HttpReply done = complete(*p, t);
              done.log = log;
              return done;
            }
            HttpReply s;
            s.content_type = "text/event-stream";
            s.log = log;
            s.stream = [this, p, t, slot](const ChunkWriter& write) { stream(*p, t, write); };
            return s;
          } catch (const ApiError& e) {
            return error_reply(e);
          } catch (const std::exception& e) {
            return error_reply(ApiError(500, e.what(), "", "internal_error", "server_error"));
          }
        };
        return deferred;
      }
      return error_reply(ApiError(404, "no route " + std::string(method) + " " + std::string(path) +
                                           "; the endpoints are GET /health, GET /metrics, GET /v1/models, GET "
                                           "/v1/models/{id}, POST /v1/completions, POST /v1/chat/completions",
                                  "", "not_found"));
    } catch (const ApiError& e) {
      return error_reply(e);
    } catch (const std::exception& e) {
      return error_reply(ApiError(500, e.what(), "", "internal_error", "server_error"));
    }
  }();
  r.headers.insert(r.headers.end(), cors.begin(), cors.end());
  return r;
}

HttpReply ServerHandler::handle(const HttpRequest& req, const RequestContext& ctx) {
  HttpReply r = route(req);
  if (!r.work) return r;
  auto work = std::move(r.work);
  HttpReply done = work(ctx);
  done.headers.insert(done.headers.end(), r.headers.begin(), r.headers.end());
  return done;
}

HttpReply ServerHandler::handle(std::string_view method, std::string_view path, std::string_view body) {
  HttpRequest req;
  req.method = method;
  req.path = path;
  req.body = body;
  if (method == "POST") req.headers.emplace_back("content-type", "application/json");
  return handle(req);
}

void ServerHandler::begin_drain() { draining_.store(true); }

void ServerHandler::cancel_all() {
  std::vector<std::shared_ptr<TrackedRequest>> live;
  {
    std::lock_guard<std::mutex> lk(tracked_mu_);
    for (const auto& w : tracked_)
      if (auto t = w.lock()) live.push_back(std::move(t));
  }
  for (const auto& t : live) t->cancel(CancelReason::kShutdown);
}

}  // namespace retroinfer::server
