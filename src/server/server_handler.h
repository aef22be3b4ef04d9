// The request handling of `retroinfer serve` without sockets: a request (method, path, headers, body) in,
// an HTTP reply out (a whole body, or a producer of Server-Sent Events for `stream: true`). The transport
// (http_server.h) and the tests call the same code; every HTTP-level policy that is not about bytes on a
// socket lives here: routing, the API key, the content type, CORS, the Host check, admission (--max-batch
// running, --max-queue waiting, 429 beyond), the per-request deadline, the drain, and /metrics.
//
// Two entry points: route() never blocks (it answers what needs no generation at once and returns, for a
// generation, a reply whose `work` the transport runs on a thread that may block); handle() runs both parts
// on the calling thread (tests).
//
// Threading contract: route(), handle(), the `work` and `stream` producers, stats(), begin_drain() and
// cancel_all() may be called from any number of threads at once. Generations run through one BatchScheduler
// (batch_scheduler.h: continuous batching of up to max_batch sequences): a `work` tokenises, submits and
// waits for its request's result (or, streaming, for its tokens, which the scheduler's worker hands over
// through a queue so that a slow client never stalls the batch). A client that goes away (RequestContext's
// client_gone) cancels its request. The EngineModel and the Tokenizer are borrowed and must outlive the
// handler; destroying the handler shuts the scheduler down (requests still running then fail with a 500 /
// an error event).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/json_constraint.h"
#include "retroinfer/batch_scheduler.h"
#include "retroinfer/engine_model.h"
#include "retroinfer/generate.h"
#include "retroinfer/model.h"
#include "retroinfer/prefix_cache.h"
#include "retroinfer/tokenizer.h"
#include "server/metrics.h"
#include "server/openai_api.h"

namespace retroinfer::server {

struct ServerOptions {
  std::string model_name = "retroinfer";  // the id in /v1/models and the responses' "model"
  SessionOptions session;                 // attention method, KV dtype, prefill chunk (max_context is ignored)
  int64_t max_context = 0;                // prompt + generated tokens per request; 0 = the model's maximum
  int64_t default_max_tokens = 256;       // when a request gives none (capped by what the context leaves)
  int max_batch = 8;                      // sequences generating at once (continuous batching; >= 1)
  // Tokens of a new request's prompt prefilled per scheduler iteration, between the running requests' decode
  // steps (BatchSchedulerOptions::prefill_step_tokens; 0: the whole prompt at once; >= 0).
  int64_t prefill_step_tokens = 0;
  // Admitted generation requests waiting for a batch slot beyond the max_batch running; a request beyond
  // max_batch + max_queue is refused with 429 and Retry-After (>= 0).
  int max_queue = 64;
  // Seconds from admission to the end of a generation request (queue + prefill + decode); past it the
  // request is cancelled and answered 504 (a stream: an error event). 0: no deadline.
  double request_timeout_s = 0.0;
  // Bearer token every request but GET /health must carry (Authorization: Bearer KEY); "" = no key.
  std::string api_key;
  // Origins a browser page may call from (CORS: "*" or exact "scheme://host[:port]"); a request carrying
  // another Origin header is refused (403). Empty: no CORS, and any request with an Origin header is refused.
  std::vector<std::string> allowed_origins;
  // Host header values accepted (case-insensitive, with or without the port given in allowed_hosts' entries);
  // empty = any. The CLI fills it when binding a loopback address (DNS rebinding: a page on an attacker's
  // name resolved to 127.0.0.1 sends its own Host).
  std::vector<std::string> allowed_hosts;
  // Chat: special-token text in a message ("<|im_end|>") is encoded as control tokens (trusted callers);
  // false encodes it as text so that a message cannot close its turn or open another role's.
  bool parse_special_in_content = false;
  // Optional: the prefix cache every request looks its prompt up in (and adds its prompt's blocks to): a
  // shared document is prefilled once (prefix_cache.h; `serve --prefix-cache-mb`, `--preload`). /metrics
  // reports its hit ratio. The CPU runner only (the handler refuses it on another device).
  std::shared_ptr<PrefixCache> prefix_cache;
};

// A request as the transport read it. Header names are lower-case; the path has no query string.
struct HttpRequest {
  std::string method, path, body;
  std::vector<std::pair<std::string, std::string>> headers;
  const std::string* header(std::string_view lower_case_name) const;
};

// A one-shot cancellation: the transport fires it when the client goes away; the handler registers what
// cancelling means (ending the request's generation). Thread-safe.
class CancelSignal {
 public:
  void cancel();
  bool cancelled() const;
  // Runs `action` on cancel() (at once when already cancelled); replaces an earlier action.
  void on_cancel(std::function<void()> action);

 private:
  mutable std::mutex mu_;
  bool cancelled_ = false;               // guarded by mu_
  std::function<void()> action_;         // guarded by mu_
};

struct RequestContext {
  std::shared_ptr<CancelSignal> client_gone = std::make_shared<CancelSignal>();
};

// Writes one chunk of a streamed body; returns false when the client is gone (generation then stops).
using ChunkWriter = std::function<bool(std::string_view chunk)>;

struct HttpReply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;                                   // the whole body when `stream` and `work` are empty
  std::vector<std::pair<std::string, std::string>> headers;  // more headers (Retry-After, CORS, WWW-Authenticate)
  std::function<void(const ChunkWriter&)> stream;     // set for SSE replies: writes every event, [DONE] last
  // Set by route() for a generation: blocks until the reply is known (a whole body, or `stream` set to
  // produce it); run it off the transport's I/O threads. Holds the request's admission slot until it and
  // the `stream` it returns are destroyed.
  std::function<HttpReply(const RequestContext&)> work;
  // Fields for the request's log line (id, tokens, finish reason), filled as the request ends.
  std::shared_ptr<nlohmann::json> log = std::make_shared<nlohmann::json>(nlohmann::json::object());
};

// The reply while the model is still loading: GET /health 503 {"status": "loading"}, everything else 503
// with Retry-After.
HttpReply loading_reply(const HttpRequest& req);

struct TrackedRequest;  // server_handler.cpp: one admitted generation's cancellation and metrics

class ServerHandler {
 public:
  // `metrics`: shared with the transport (one is made when null).
  ServerHandler(const EngineModel& model, const Tokenizer& tokenizer, ServerOptions opt,
                std::shared_ptr<ServerMetrics> metrics = nullptr);
  ~ServerHandler();

  // Routes GET /health, GET /metrics, GET /v1/models, GET /v1/models/{id}, POST /v1/completions,
  // POST /v1/chat/completions after
  // the Host, Origin, API key and Content-Type checks (403, 401, 415) and, for a generation, admission
  // (429 when max_batch + max_queue requests are in, 503 once draining). Unknown paths give 404, a known
  // path with another method 405. Never blocks, never throws; see HttpReply::work.
  HttpReply route(const HttpRequest& req);
  // route() and its work on this thread: invalid requests 400 (OpenAI error object), a model name other than
  // the served one 404 (model_not_found), a failure while generating 500, ... Never throws.
  HttpReply handle(const HttpRequest& req, const RequestContext& ctx = {});
  // A POST with Content-Type: application/json (or any other method) without headers: for tests.
  HttpReply handle(std::string_view method, std::string_view path, std::string_view body);

  // Drain: new generations are refused (503) from now on; those admitted go on.
  void begin_drain();
  // Cancels every admitted generation (they end at the scheduler's next iteration: 503 / an error event).
  void cancel_all();
  // Admitted generation requests not finished yet.
  int64_t in_flight() const { return metrics_->requests_in_flight.load(); }
  ServerMetrics& metrics() { return *metrics_; }

  // Counters since construction (for logs and tests): completed generations, tokens generated, requests
  // stopped because the client went away, and the most sequences the scheduler decoded in one step.
  struct Stats {
    int64_t generations = 0;
    int64_t generated_tokens = 0;
    int64_t cancelled_streams = 0;
    int max_batch_seen = 0;
  };
  Stats stats() const;

  int64_t context_limit() const { return context_limit_; }
  const ServerOptions& options() const { return opt_; }

 private:
  struct Prepared;
  Prepared prepare(std::string_view body, bool chat) const;
  HttpReply complete(const Prepared& p, const std::shared_ptr<TrackedRequest>& t);
  void stream(const Prepared& p, const std::shared_ptr<TrackedRequest>& t, const ChunkWriter& write);
  std::shared_ptr<TrackedRequest> track(const RequestContext& ctx, std::shared_ptr<nlohmann::json> log);
  HttpReply check_access(const HttpRequest& req, std::vector<std::pair<std::string, std::string>>& cors) const;

  const EngineModel& model_;
  const Tokenizer& tok_;
  ServerOptions opt_;
  int64_t context_limit_ = 0;
  std::vector<int32_t> eos_ids_;
  // The token texts for response_format json_object (JsonTokenTable), built at the first such request.
  std::shared_ptr<const JsonTokenTable> json_table() const;
  mutable std::once_flag json_table_once_;
  mutable std::shared_ptr<const JsonTokenTable> json_table_;
  mutable std::atomic<uint64_t> next_id_{1};  // response ids
  std::atomic<int64_t> generations_{0}, generated_tokens_{0}, cancelled_streams_{0};
  void count(const GenerateSummary& s, bool cancelled);
  std::shared_ptr<ServerMetrics> metrics_;
  std::atomic<bool> draining_{false};
  std::mutex tracked_mu_;
  std::vector<std::weak_ptr<TrackedRequest>> tracked_;  // guarded by tracked_mu_: the admitted requests (cancel_all)
  std::unique_ptr<BatchScheduler> scheduler_;  // last: shut down (joined) before the members above go
};

}  // namespace retroinfer::server
