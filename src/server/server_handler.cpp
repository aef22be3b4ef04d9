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

json usage_json(const GenerateSummary& s) {
  return {{"prompt_tokens", s.prompt_tokens},
          {"completion_tokens", s.generated_tokens},
          {"total_tokens", s.prompt_tokens + s.generated_tokens}};
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
  BatchSchedulerOptions bo;
  bo.max_batch = opt_.max_batch;
  bo.prefill_step_tokens = opt_.prefill_step_tokens;
  bo.session = opt_.session;
  scheduler_ = std::make_unique<BatchScheduler>(model_, bo);
}

ServerHandler::~ServerHandler() = default;

ServerHandler::Prepared ServerHandler::prepare(std::string_view body, bool chat) const {
  Prepared p;
  p.req = parse_completion_request(body, chat);
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
  p.model = p.req.model.empty() ? opt_.model_name : p.req.model;
  return p;
}

namespace {

// Why a request ended before its end; the first reason set wins.
enum class CancelReason : int { kNone = 0, kClientGone, kDeadline, kShutdown };

// What the scheduler's worker hands to the thread serving a request: texts as they become safe to show
// (streamed requests), and the end of the request. Shared by both threads (the worker's callbacks keep it
// alive).
struct StreamChannel {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> texts;  // guarded by mu
  bool done = false;              // guarded by mu: the request's result is set
  std::atomic<bool> gone{false};  // the request is cancelled: the worker's on_token stops it
};

// summary.text ends with the detokenizer's flushed tail (an incomplete UTF-8 sequence at the end becomes
// U+FFFD); returns that tail when it was added.
std::string add_tail(GenerateSummary& s, StreamingDecoder& dec) {
  std::string tail = dec.flush();
  if (s.stop_reason == StopReason::kStopString || tail.empty()) return {};
  s.text += tail;
  return tail;
}

using Clock = std::chrono::steady_clock;

}  // namespace

// One admitted generation request: its admission slot, cancellation and the timing its metrics need.
// Made by track() on the thread running the work; the scheduler's worker updates the timing.
struct TrackedRequest {
  ServerMetrics* metrics = nullptr;
  Clock::time_point admitted = Clock::now();
  std::optional<Clock::time_point> deadline;
  std::shared_ptr<StreamChannel> channel = std::make_shared<StreamChannel>();
  std::atomic<int> reason{0};  // CancelReason
  std::mutex mu;
  std::shared_ptr<std::atomic<bool>> cancel_flag;  // guarded by mu: the scheduler's, once submitted
  std::atomic<int64_t> kv_bytes{0};                // reserved in metrics' kv_bytes_* while in flight
  std::atomic<int64_t> counted{0};                 // tokens counted in metrics' generated_tokens
  bool kv_on_gpu = false;
  std::shared_ptr<json> log;     // the reply's log fields
  Clock::time_point last_token;  // worker only
  bool first_token = true;       // worker only

  ~TrackedRequest() { release_kv(); }
  // The live token count misses the tokens that show no text (an end-of-generation token): the summary's
  // count settles it.
  void settle_tokens(int64_t generated) { metrics->generated_tokens.fetch_add(generated - counted.exchange(generated)); }
  // Gives back the KV bytes reserved in the metrics (once): when the result is in (the scheduler may keep
  // the request's callbacks, and with them this object, a little longer).
  void release_kv() {
    (kv_on_gpu ? metrics->kv_bytes_gpu : metrics->kv_bytes_host).fetch_sub(kv_bytes.exchange(0));
  }
  CancelReason why() const { return static_cast<CancelReason>(reason.load()); }
  void cancel(CancelReason r) {
    int none = 0;
    reason.compare_exchange_strong(none, static_cast<int>(r));
    channel->gone.store(true);
    {
      std::lock_guard<std::mutex> lk(mu);
      if (cancel_flag) cancel_flag->store(true);
    }
    {
      std::lock_guard<std::mutex> lk(channel->mu);  // the waiter checks `reason` under this lock
    }
    channel->cv.notify_all();
  }
  // On the worker, per sampled token.
  void on_token() {
    const Clock::time_point now = Clock::now();
    metrics->generated_tokens.fetch_add(1);
    counted.fetch_add(1);
    if (first_token)
      metrics->time_to_first_token.observe(std::chrono::duration<double>(now - admitted).count());
    else
      metrics->inter_token_latency.observe(std::chrono::duration<double>(now - last_token).count());
    first_token = false;
    last_token = now;
  }
};

namespace {

// A generation request for the scheduler. The detokenizer is per request and used on the worker thread
// only (token_text), then by the caller after the result is ready (flush).
BatchRequest make_request(const Tokenizer& tok, const std::vector<int32_t>& eos_ids, const std::vector<int32_t>& ids,
                          const CompletionRequest& req, int64_t max_tokens,
                          const std::shared_ptr<StreamingDecoder>& dec,
                          const std::shared_ptr<TrackedRequest>& t);

}  // namespace

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

BatchRequest make_request(const Tokenizer& tok, const std::vector<int32_t>& eos_ids, const std::vector<int32_t>& ids,
                          const CompletionRequest& req, int64_t max_tokens,
                          const std::shared_ptr<StreamingDecoder>& dec,
                          const std::shared_ptr<TrackedRequest>& t) {
  BatchRequest r;
  r.prompt = ids;
  r.options.max_new_tokens = static_cast<int>(max_tokens);
  r.options.sampler = SamplerConfig{req.temperature, 0, req.top_p, req.seed};
  r.options.stop_strings = req.stop;
  r.options.eos_token_ids = eos_ids;
  const int32_t vocab = tok.vocab_size();
  // A model's vocabulary may be larger than its tokenizer's (padded embedding rows): such ids show as
  // nothing instead of failing the request. token_text runs once per sampled token: the metrics' clock.
  r.callbacks.token_text = [dec, vocab, t](int32_t id) {
    t->on_token();
    return id >= 0 && id < vocab ? dec->push(id) : std::string();
  };
  // Every request has an on_token: a cancelled request (client gone, deadline, drain) stops at its next token
  // even before the scheduler's next iteration looks at its cancel flag. A streamed one's texts go to the
  // thread writing them through the channel.
  auto ch = t->channel;
  r.callbacks.on_token = [ch, stream = req.stream](int32_t, std::string_view text) {
    if (stream && !text.empty()) {
      std::lock_guard<std::mutex> lk(ch->mu);
      ch->texts.emplace_back(text);
    }
    if (stream) ch->cv.notify_all();
    return !ch->gone.load();
  };
  r.on_done = [ch] {
    {
      std::lock_guard<std::mutex> lk(ch->mu);
      ch->done = true;
    }
    ch->cv.notify_all();
  };
  return r;
}

// Waits for the end of the request, handing each text to `texts` (may be empty) as it comes; cancels the
// request at its deadline. Returns when the result is set.
void wait_for_end(TrackedRequest& t, BatchHandle& h,
                  const std::function<void(std::deque<std::string>&)>& texts) {
  StreamChannel& ch = *t.channel;
  std::optional<Clock::time_point> deadline = t.deadline;
  for (bool finished = false; !finished;) {
    std::deque<std::string> got;
    {
      std::unique_lock<std::mutex> lk(ch.mu);
      auto ready = [&] { return !ch.texts.empty() || ch.done; };
      if (deadline.has_value()) {
        const Clock::time_point until = deadline.value();
        if (!ch.cv.wait_until(lk, until, ready)) {
          lk.unlock();
          deadline.reset();  // cancelled once: now wait for the scheduler to end it
          t.cancel(CancelReason::kDeadline);
          h.cancel();
          continue;
        }
      } else {
        ch.cv.wait(lk, ready);
      }
      got.swap(ch.texts);
      finished = ch.done;
    }
    if (texts && !got.empty()) texts(got);
  }
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
}

namespace {

// Counts a request that ended early by its reason (once per request).
void count_cancel(ServerMetrics& m, CancelReason r, json& log) {
  log["cancelled"] = r == CancelReason::kClientGone ? "client_gone" : r == CancelReason::kDeadline ? "deadline" : "shutdown";
  if (r == CancelReason::kClientGone) m.requests_cancelled_client.fetch_add(1);
  if (r == CancelReason::kDeadline) m.requests_cancelled_deadline.fetch_add(1);
  if (r == CancelReason::kShutdown) m.requests_cancelled_shutdown.fetch_add(1);
}

void log_summary(json& log, const std::string& id, const GenerateSummary& s) {
  log["id"] = id;
  log["prompt_tokens"] = s.prompt_tokens;
  log["completion_tokens"] = s.generated_tokens;
  log["stop_reason"] = std::string(stop_reason_name(s.stop_reason));
  log["ttft_s"] = s.time_to_first_token_s;
}

}  // namespace

namespace {

// Submits the request and hands its cancel switch to `t` (a cancel that came first applies at once).
BatchHandle submit_tracked(BatchScheduler& scheduler, TrackedRequest& t, BatchRequest r) {
  BatchHandle h = scheduler.submit(std::move(r));
  std::lock_guard<std::mutex> lk(t.mu);
  t.cancel_flag = h.cancel_flag;
  if (t.why() != CancelReason::kNone) h.cancel();
  return h;
}

}  // namespace

HttpReply ServerHandler::complete(const Prepared& p, const std::shared_ptr<TrackedRequest>& t) {
  GenerateSummary s;
  try {
    auto dec = std::make_shared<StreamingDecoder>(tok_, /*skip_special=*/true);
    BatchHandle h = submit_tracked(*scheduler_, *t, make_request(tok_, eos_ids_, p.ids, p.req, p.max_tokens, dec, t));
    wait_for_end(*t, h, nullptr);
    t->release_kv();
    try {
      s = h.result.get();
      t->settle_tokens(s.generated_tokens);
    } catch (const std::exception&) {
      if (t->why() == CancelReason::kNone) throw;  // else: cancelled before it started
    }
    log_summary(*t->log, p.id, s);
    const CancelReason why = t->why();
    if (why != CancelReason::kNone) {
      count_cancel(*metrics_, why, *t->log);
      if (why == CancelReason::kClientGone) {
        count(s, true);
        return error_reply(ApiError(499, "the client closed the connection", "", "client_gone"));
      }
      count(s, false);
      return error_reply(cancelled_error(why, opt_.request_timeout_s));
    }
    add_tail(s, *dec);
    count(s, false);
  } catch (const std::exception& e) {
    return error_reply(ApiError(500, std::string("generation failed: ") + e.what(), "", "generation_failed",
                                "server_error"));
  }
  json choice = {{"index", 0}, {"finish_reason", finish_reason(s.stop_reason)}};
  if (p.req.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", s.text}};
  } else {
    choice["text"] = s.text;
    choice["logprobs"] = nullptr;
  }
  HttpReply r = json_reply(200, {{"id", p.id},
                                 {"object", p.req.chat ? "chat.completion" : "text_completion"},
                                 {"created", p.created},
                                 {"model", p.model},
                                 {"choices", json::array({choice})},
                                 {"usage", usage_json(s)},
                                 {"retroinfer", extension_json(s, model_)}});
  return r;
}

void ServerHandler::stream(const Prepared& p, const std::shared_ptr<TrackedRequest>& t, const ChunkWriter& write) {
  const char* object = p.req.chat ? "chat.completion.chunk" : "text_completion";
  auto chunk = [&](json choice) {
    return json{{"id", p.id}, {"object", object}, {"created", p.created}, {"model", p.model},
                {"choices", json::array({std::move(choice)})}};
  };
  auto delta = [&](std::string_view text) {
    json c = {{"index", 0}, {"finish_reason", nullptr}};
    if (p.req.chat)
      c["delta"] = {{"content", std::string(text)}};
    else
      c["text"] = std::string(text);
    return write(sse(chunk(std::move(c))));
  };
  auto write_error = [&](const ApiError& err) {
    if (write("data: " + dump(error_json(err)) + "\n\n")) write("data: [DONE]\n\n");
  };
  if (p.req.chat) {
    json first = {{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"finish_reason", nullptr}};
    if (!write(sse(chunk(std::move(first))))) {
      t->cancel(CancelReason::kClientGone);
      count_cancel(*metrics_, CancelReason::kClientGone, *t->log);
      return;
    }
  }
  GenerateSummary s;
  bool client_gone = false;
  try {
    auto dec = std::make_shared<StreamingDecoder>(tok_, /*skip_special=*/true);
    BatchHandle h = submit_tracked(*scheduler_, *t, make_request(tok_, eos_ids_, p.ids, p.req, p.max_tokens, dec, t));
    // Write the texts as they come, on this thread (a write blocks while the client's queue is full: the
    // scheduler's worker only appends to the channel); a failed write cancels the request (the scheduler
    // ends it at its next iteration). Always wait for the result: the worker may still use `dec`.
    wait_for_end(*t, h, [&](std::deque<std::string>& texts) {
      for (const std::string& text : texts) {
        if (client_gone || t->why() != CancelReason::kNone || delta(text)) continue;
        client_gone = true;
        t->cancel(CancelReason::kClientGone);
      }
    });
    t->release_kv();
    try {
      s = h.result.get();
      t->settle_tokens(s.generated_tokens);
    } catch (const std::exception&) {
      if (t->why() == CancelReason::kNone) throw;  // else: cancelled before it started
    }
    if (t->why() == CancelReason::kNone) {
      const std::string tail = add_tail(s, *dec);
      if (!tail.empty() && !delta(tail)) {
        client_gone = true;
        t->cancel(CancelReason::kClientGone);
      }
    }
    count(s, t->why() == CancelReason::kClientGone);
    log_summary(*t->log, p.id, s);
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
  json last = {{"index", 0}, {"finish_reason", finish_reason(s.stop_reason)}};
  if (p.req.chat)
    last["delta"] = json::object();
  else
    last["text"] = "";
  json j = chunk(std::move(last));
  j["usage"] = usage_json(s);
  j["retroinfer"] = extension_json(s, model_);
  if (write(sse(j))) write("data: [DONE]\n\n");
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
        return json_reply(200, {{"object", "list"},
                                {"data", json::array({{{"id", opt_.model_name},
                                                       {"object", "model"},
                                                       {"created", 0},
                                                       {"owned_by", "retroinfer"},
                                                       {"context_length", context_limit_}}})}});
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
            const int64_t kv_bytes = (static_cast<int64_t>(p->ids.size()) + p->max_tokens) * c.num_layers * 2 *
                                     c.num_heads_kv * c.head_dim * dtype_size(opt_.session.kv_dtype);
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
                                           "; the endpoints are GET /health, GET /metrics, GET /v1/models, POST "
                                           "/v1/completions, POST /v1/chat/completions",
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
