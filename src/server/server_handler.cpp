#include "server/server_handler.h"

#include <algorithm>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <exception>
#include <mutex>

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

ServerHandler::ServerHandler(const EngineModel& model, const Tokenizer& tokenizer, ServerOptions opt)
    : model_(model), tok_(tokenizer), opt_(std::move(opt)) {
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
  BatchSchedulerOptions bo;
  bo.max_batch = opt_.max_batch;
  bo.prefill_step_tokens = opt_.prefill_step_tokens;
  bo.session = opt_.session;
  scheduler_ = std::make_unique<BatchScheduler>(model_, bo);
}

ServerHandler::Prepared ServerHandler::prepare(std::string_view body, bool chat) const {
  Prepared p;
  p.req = parse_completion_request(body, chat);
  try {
    if (chat) {
      if (tok_.chat_format() == ChatFormat::kNone)
        throw ApiError(400, "this model has no known chat template; use /v1/completions with a prompt", "messages",
                       "no_chat_template");
      p.ids = tok_.encode(tok_.apply_chat_template(p.req.messages, /*add_generation_prompt=*/true), false, true);
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

struct Outcome {
  GenerateSummary summary;
  bool client_gone = false;
};

// What the scheduler's worker hands to the thread serving a streamed request: texts as they become safe to
// show, and the end of the request. Shared by both threads (the worker's callbacks keep it alive).
struct StreamChannel {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> texts;  // guarded by mu
  bool done = false;              // guarded by mu: the request's result is set
  std::atomic<bool> gone{false};  // the client went away: the worker's on_token stops the request
};

// A generation request for the scheduler. The detokenizer is per request and used on the worker thread
// only (token_text), then by the caller after the result is ready (flush).
BatchRequest make_request(const Tokenizer& tok, const std::vector<int32_t>& eos_ids, const std::vector<int32_t>& ids,
                          const CompletionRequest& req, int64_t max_tokens,
                          const std::shared_ptr<StreamingDecoder>& dec) {
  BatchRequest r;
  r.prompt = ids;
  r.options.max_new_tokens = static_cast<int>(max_tokens);
  r.options.sampler = SamplerConfig{req.temperature, 0, req.top_p, req.seed};
  r.options.stop_strings = req.stop;
  r.options.eos_token_ids = eos_ids;
  const int32_t vocab = tok.vocab_size();
  // A model's vocabulary may be larger than its tokenizer's (padded embedding rows): such ids show as
  // nothing instead of failing the request.
  r.callbacks.token_text = [dec, vocab](int32_t t) { return t >= 0 && t < vocab ? dec->push(t) : std::string(); };
  return r;
}

// summary.text ends with the detokenizer's flushed tail (an incomplete UTF-8 sequence at the end becomes
// U+FFFD); returns that tail when it was added.
std::string add_tail(GenerateSummary& s, StreamingDecoder& dec) {
  std::string tail = dec.flush();
  if (s.stop_reason == StopReason::kStopString || tail.empty()) return {};
  s.text += tail;
  return tail;
}

}  // namespace

ServerHandler::Stats ServerHandler::stats() const {
  return {generations_.load(), generated_tokens_.load(), cancelled_streams_.load(), scheduler_->stats().max_running};
}

void ServerHandler::count(const GenerateSummary& s, bool cancelled) {
  generations_.fetch_add(1);
  generated_tokens_.fetch_add(s.generated_tokens);
  if (cancelled) cancelled_streams_.fetch_add(1);
}

HttpReply ServerHandler::complete(const Prepared& p) {
  Outcome o;
  try {
    auto dec = std::make_shared<StreamingDecoder>(tok_, /*skip_special=*/true);
    BatchHandle h = scheduler_->submit(make_request(tok_, eos_ids_, p.ids, p.req, p.max_tokens, dec));
    o.summary = h.result.get();
    add_tail(o.summary, *dec);
    count(o.summary, false);
  } catch (const std::exception& e) {
    return error_reply(ApiError(500, std::string("generation failed: ") + e.what(), "", "generation_failed",
                                "server_error"));
  }
  const GenerateSummary& s = o.summary;
  json choice = {{"index", 0}, {"finish_reason", finish_reason(s.stop_reason)}};
  if (p.req.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", s.text}};
  } else {
    choice["text"] = s.text;
    choice["logprobs"] = nullptr;
  }
  return json_reply(200, {{"id", p.id},
                          {"object", p.req.chat ? "chat.completion" : "text_completion"},
                          {"created", p.created},
                          {"model", p.model},
                          {"choices", json::array({choice})},
                          {"usage", usage_json(s)},
                          {"retroinfer", extension_json(s, model_)}});
}

void ServerHandler::stream(const Prepared& p, const ChunkWriter& write) {
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
  if (p.req.chat) {
    json first = {{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"finish_reason", nullptr}};
    if (!write(sse(chunk(std::move(first))))) return;
  }
  Outcome o;
  try {
    auto dec = std::make_shared<StreamingDecoder>(tok_, /*skip_special=*/true);
    auto ch = std::make_shared<StreamChannel>();
    BatchRequest r = make_request(tok_, eos_ids_, p.ids, p.req, p.max_tokens, dec);
    r.callbacks.on_token = [ch](int32_t, std::string_view text) {
      if (!text.empty()) {
        std::lock_guard<std::mutex> lk(ch->mu);
        ch->texts.emplace_back(text);
      }
      ch->cv.notify_one();
      return !ch->gone.load();
    };
    r.on_done = [ch] {
      {
        std::lock_guard<std::mutex> lk(ch->mu);
        ch->done = true;
      }
      ch->cv.notify_one();
    };
    BatchHandle h = scheduler_->submit(std::move(r));
    // Write the texts as they come, on this thread; a failed write cancels the request (the scheduler
    // ends it at its next iteration). Always wait for the result: the worker may still use `dec`.
    for (bool finished = false; !finished;) {
      std::deque<std::string> texts;
      {
        std::unique_lock<std::mutex> lk(ch->mu);
        ch->cv.wait(lk, [&] { return !ch->texts.empty() || ch->done; });
        texts.swap(ch->texts);
        finished = ch->done;
      }
      for (const std::string& t : texts) {
        if (o.client_gone || delta(t)) continue;
        o.client_gone = true;
        ch->gone.store(true);
        h.cancel();
      }
    }
    o.summary = h.result.get();
    const std::string tail = add_tail(o.summary, *dec);
    if (!tail.empty() && !o.client_gone) o.client_gone = !delta(tail);
    count(o.summary, o.client_gone);
  } catch (const std::exception& e) {
    const ApiError err(500, std::string("generation failed: ") + e.what(), "", "generation_failed", "server_error");
    if (write("data: " + dump(error_json(err)) + "\n\n")) write("data: [DONE]\n\n");
    return;
  }
  if (o.client_gone) return;
  const GenerateSummary& s = o.summary;
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

HttpReply ServerHandler::handle(std::string_view method, std::string_view path, std::string_view body) {
  auto method_not_allowed = [&](const char* allowed) {
    HttpReply r = error_reply(ApiError(405, std::string(method) + " is not allowed on " + std::string(path) +
                                                "; use " + allowed,
                                       "", "method_not_allowed"));
    return r;
  };
  try {
    if (path == "/health") {
      if (method != "GET") return method_not_allowed("GET");
      return json_reply(200, {{"status", "ok"}});
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
    const bool chat = path == "/v1/chat/completions";
    if (chat || path == "/v1/completions") {
      if (method != "POST") return method_not_allowed("POST");
      auto p = std::make_shared<Prepared>(prepare(body, chat));
      if (!p->req.stream) return complete(*p);
      HttpReply r;
      r.content_type = "text/event-stream";
      r.stream = [this, p](const ChunkWriter& write) { stream(*p, write); };
      return r;
    }
    return error_reply(ApiError(404, "no route " + std::string(method) + " " + std::string(path) +
                                         "; the endpoints are GET /health, GET /v1/models, POST /v1/completions, "
                                         "POST /v1/chat/completions",
                                "", "not_found"));
  } catch (const ApiError& e) {
    return error_reply(e);
  } catch (const std::exception& e) {
    return error_reply(ApiError(500, e.what(), "", "internal_error", "server_error"));
  }
}

}  // namespace retroinfer::server
