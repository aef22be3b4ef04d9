#include "server/server_handler.h"

#include <algorithm>
#include <cmath>
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
  p.model = opt_.model_name;
  return p;
}

namespace {

// A piece of streamed output: the text of choice `index` that is safe to show now, with the log-probabilities
// of the tokens that made it (when asked for).
struct StreamItem {
  int index = 0;
  std::string text;
  std::vector<TokenLogprobs> logprobs;
};

// What the scheduler's worker hands to the thread serving a streamed request (all its choices): items as
// they become safe to show, and the ends of the requests. Shared by both threads (the worker's callbacks
// keep it alive).
struct StreamChannel {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<StreamItem> items;   // guarded by mu
  int done = 0;                   // guarded by mu: requests whose result is set
  std::atomic<bool> gone{false};  // the client went away: the worker's on_token stops the requests
};

// The generation request of choice `choice` for the scheduler. The detokenizer is per request and used on
// the worker thread only (token_text), then by the caller after the result is ready (flush). Choice i
// samples with seed + i (n choices of one seeded request differ from each other and repeat across runs).
BatchRequest make_request(const Tokenizer& tok, const std::vector<int32_t>& eos_ids, const std::vector<int32_t>& ids,
                          const CompletionRequest& req, int64_t max_tokens, int choice,
                          const std::shared_ptr<StreamingDecoder>& dec,
                          const std::shared_ptr<const JsonTokenTable>& json_table) {
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

// The log-probabilities reported for a generation: every sampled token's but an end-of-generation token's.
std::vector<TokenLogprobs> reported_logprobs(std::vector<TokenLogprobs> lp, StopReason why) {
  if (why == StopReason::kEos && !lp.empty()) lp.pop_back();
  return lp;
}

// The bytes of token `id` as text ("" past the tokenizer's vocabulary).
std::string piece(const Tokenizer& tok, int32_t id) {
  if (id < 0 || id >= tok.vocab_size()) return {};
  try {
    return tok.token_to_piece(id);
  } catch (const Error&) {
    return {};
  }
}

// A log-probability as JSON: a number, or the most negative float for a banned token (JSON has no -inf).
json logprob_json(float lp) { return std::isfinite(lp) ? json(lp) : json(-9999.0); }

// A token's name for the "token" fields: its bytes when they are valid UTF-8, else (part of a character)
// "bytes:\\xNN..." as OpenAI writes them, and "token_id:N" for a token without text (an id past the
// tokenizer's vocabulary), so that distinct tokens keep distinct names.
std::string token_name(const std::string& bytes, int32_t id) {
  if (bytes.empty()) return "token_id:" + std::to_string(id);
  if (is_valid_utf8(bytes)) return bytes;
  static const char* kHex = "0123456789abcdef";
  std::string out = "bytes:";
  for (const char c : bytes) {
    const auto b = static_cast<uint8_t>(c);
    out += "\\x";
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

json token_json(const Tokenizer& tok, const TokenLogprob& t) {
  const std::string text = piece(tok, t.token);
  json bytes = json::array();
  for (const char c : text) bytes.push_back(static_cast<int>(static_cast<uint8_t>(c)));
  return {{"token", token_name(text, t.token)}, {"logprob", logprob_json(t.logprob)}, {"bytes", std::move(bytes)}};
}

// The chat API's choice.logprobs: {"content": [{token, logprob, bytes, top_logprobs: [...]}], "refusal": null}.
json chat_logprobs_json(const Tokenizer& tok, const std::vector<TokenLogprobs>& lps) {
  json content = json::array();
  for (const TokenLogprobs& lp : lps) {
    json t = token_json(tok, lp.sampled);
    json top = json::array();
    for (const TokenLogprob& x : lp.top) top.push_back(token_json(tok, x));
    t["top_logprobs"] = std::move(top);
    content.push_back(std::move(t));
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

// The completions API's choice.logprobs: {tokens, token_logprobs, top_logprobs: [{token: logprob}],
// text_offset}; `offset` (bytes of the completion text before these tokens) advances.
json completion_logprobs_json(const Tokenizer& tok, const std::vector<TokenLogprobs>& lps, size_t& offset) {
  json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenLogprobs& lp : lps) {
    const std::string text = piece(tok, lp.sampled.token);
    tokens.push_back(token_name(text, lp.sampled.token));
    token_lps.push_back(logprob_json(lp.sampled.logprob));
    json top = json::object();
    for (const TokenLogprob& x : lp.top) top[token_name(piece(tok, x.token), x.token)] = logprob_json(x.logprob);
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += text.size();
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_lps)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

json usage_of(const std::vector<GenerateSummary>& sums) {
  int64_t generated = 0;
  for (const GenerateSummary& s : sums) generated += s.generated_tokens;
  const int64_t prompt = sums.empty() ? 0 : sums[0].prompt_tokens;
  return {{"prompt_tokens", prompt}, {"completion_tokens", generated}, {"total_tokens", prompt + generated}};
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
}

HttpReply ServerHandler::complete(const Prepared& p) {
  const int n = p.req.n;
  std::vector<GenerateSummary> sums(n);
  std::vector<BatchHandle> handles;
  try {
    const auto table = p.req.json_object ? json_table() : nullptr;
    std::vector<std::shared_ptr<StreamingDecoder>> decs;
    for (int i = 0; i < n; ++i) {
      decs.push_back(std::make_shared<StreamingDecoder>(tok_, /*skip_special=*/true));
      handles.push_back(scheduler_->submit(make_request(tok_, eos_ids_, p.ids, p.req, p.max_tokens, i, decs[i], table)));
    }
    for (int i = 0; i < n; ++i) {
      sums[i] = handles[i].result.get();
      add_tail(sums[i], *decs[i]);
      count(sums[i], false);
    }
  } catch (const std::exception& e) {
    for (const BatchHandle& h : handles) h.cancel();  // the other choices' results are not wanted any more
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

void ServerHandler::stream(const Prepared& p, const ChunkWriter& write) {
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
  if (p.req.chat) {
    for (int i = 0; i < n; ++i) {
      json first = {{"index", i}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"finish_reason", nullptr}};
      if (!send(chunk(json::array({std::move(first)})))) return;
    }
  }
  std::vector<GenerateSummary> sums(n);
  std::vector<BatchHandle> handles;
  try {
    const auto table = p.req.json_object ? json_table() : nullptr;
    auto ch = std::make_shared<StreamChannel>();
    std::vector<std::shared_ptr<StreamingDecoder>> decs;
    // Per choice, on the worker: the log-probabilities of tokens whose text is not out yet.
    std::vector<std::shared_ptr<std::vector<TokenLogprobs>>> pending;
    for (int i = 0; i < n; ++i) {
      decs.push_back(std::make_shared<StreamingDecoder>(tok_, /*skip_special=*/true));
      pending.push_back(std::make_shared<std::vector<TokenLogprobs>>());
      BatchRequest r = make_request(tok_, eos_ids_, p.ids, p.req, p.max_tokens, i, decs[i], table);
      auto lp = pending[i];
      if (p.req.logprobs >= 0) r.callbacks.on_logprobs = [lp](const TokenLogprobs& x) { lp->push_back(x); };
      r.callbacks.on_token = [ch, lp, i](int32_t, std::string_view text) {
        if (!text.empty()) {
          std::lock_guard<std::mutex> lk(ch->mu);
          ch->items.push_back({i, std::string(text), std::move(*lp)});
          lp->clear();
        }
        ch->cv.notify_one();
        return !ch->gone.load();
      };
      r.on_done = [ch] {
        {
          std::lock_guard<std::mutex> lk(ch->mu);
          ++ch->done;
        }
        ch->cv.notify_one();
      };
      handles.push_back(scheduler_->submit(std::move(r)));
    }
    // Write the items as they come, on this thread; a failed write cancels the requests (the scheduler
    // ends them at its next iteration). Always wait for the results: the worker may still use `decs`.
    for (bool finished = false; !finished;) {
      std::deque<StreamItem> items;
      {
        std::unique_lock<std::mutex> lk(ch->mu);
        ch->cv.wait(lk, [&] { return !ch->items.empty() || ch->done == n; });
        items.swap(ch->items);
        finished = ch->done == n;
      }
      for (const StreamItem& it : items) {
        if (gone || delta(it.index, it.text, it.logprobs)) continue;
        ch->gone.store(true);
        for (const BatchHandle& h : handles) h.cancel();
      }
    }
    for (int i = 0; i < n; ++i) sums[i] = handles[i].result.get();
    for (int i = 0; i < n; ++i) {
      // The requests are done: the worker no longer touches decs[i] or pending[i].
      const std::string tail = add_tail(sums[i], *decs[i]);
      const auto rest = reported_logprobs(std::move(*pending[i]), sums[i].stop_reason);
      if (!gone && (!tail.empty() || !rest.empty())) delta(i, tail, rest);
      count(sums[i], gone);
    }
  } catch (const std::exception& e) {
    for (const BatchHandle& h : handles) h.cancel();
    const ApiError err(500, std::string("generation failed: ") + e.what(), "", "generation_failed", "server_error");
    if (write("data: " + dump(error_json(err)) + "\n\n")) write("data: [DONE]\n\n");
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
  if (!gone) write("data: [DONE]\n\n");
}

HttpReply ServerHandler::handle(std::string_view method, std::string_view path, std::string_view body) {
  auto method_not_allowed = [&](const char* allowed) {
    HttpReply r = error_reply(ApiError(405, std::string(method) + " is not allowed on " + std::string(path) +
                                                "; use " + allowed,
                                       "", "method_not_allowed"));
    return r;
  };
  auto model_json = [&] {
    return json{{"id", opt_.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "retroinfer"},
                {"context_length", context_limit_}};
  };
  try {
    if (path == "/health") {
      if (method != "GET") return method_not_allowed("GET");
      return json_reply(200, {{"status", "ok"}});
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
                                         "; the endpoints are GET /health, GET /v1/models, GET /v1/models/{id}, "
                                         "POST /v1/completions, "
                                         "POST /v1/chat/completions",
                                "", "not_found"));
  } catch (const ApiError& e) {
    return error_reply(e);
  } catch (const std::exception& e) {
    return error_reply(ApiError(500, e.what(), "", "internal_error", "server_error"));
  }
}

}  // namespace retroinfer::server
