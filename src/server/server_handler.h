// The request handling of `retroinfer serve` without sockets: method + path + body in, an HTTP reply out
// (a whole body, or a producer of Server-Sent Events for `stream: true`). The transport (http_server.h)
// and the tests call the same code.
//
// Threading contract: handle() (and the stream producers it returns) may be called from any number of
// threads at once. Generations run through one BatchScheduler (batch_scheduler.h: continuous batching of up
// to max_batch sequences; one batched decode step per iteration on the CPU, one sequence after the other on
// CUDA): the calling thread tokenises, submits and waits for its request's result (or, streaming, for its
// tokens, which the scheduler's worker hands over through a queue so that a slow client never stalls the
// batch). A streaming client that goes away cancels its request. The EngineModel and the Tokenizer are
// borrowed and must outlive the handler; destroying the handler shuts the scheduler down (requests still
// running then fail with a 500 / an error event).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "engine/json_constraint.h"
#include "retroinfer/batch_scheduler.h"
#include "retroinfer/engine_model.h"
#include "retroinfer/generate.h"
#include "retroinfer/model.h"
#include "retroinfer/tokenizer.h"
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
};

// Writes one chunk of a streamed body; returns false when the client is gone (generation then stops).
using ChunkWriter = std::function<bool(std::string_view chunk)>;

struct HttpReply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;                                   // the whole body when `stream` is empty
  std::function<void(const ChunkWriter&)> stream;     // set for SSE replies: writes every event, [DONE] last
};

class ServerHandler {
 public:
  ServerHandler(const EngineModel& model, const Tokenizer& tokenizer, ServerOptions opt);

  // Routes GET /health, GET /v1/models, GET /v1/models/{id}, POST /v1/completions, POST /v1/chat/completions.
  // Unknown paths give 404, a known path with another method 405, invalid requests 400 (OpenAI error
  // object), a model name other than the served one 404 (model_not_found), a failure while generating 500.
  // Never throws.
  HttpReply handle(std::string_view method, std::string_view path, std::string_view body);

  // Counters since construction (for logs and tests): completed generations, tokens generated, streams
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
  HttpReply complete(const Prepared& p);
  void stream(const Prepared& p, const ChunkWriter& write);

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
  std::unique_ptr<BatchScheduler> scheduler_;  // last: shut down (joined) before the members above go
};

}  // namespace retroinfer::server
