// `retroinfer serve`: an OpenAI-compatible HTTP server over one model (src/server/, docs/server.md).
// Requests are served with continuous batching (up to --max-batch sequences at once; batch_scheduler.h).
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <memory>

#include "command.h"
#include "model_cli.h"
#include "retroinfer/error.h"
#include "server/http_server.h"
#include "server/server_handler.h"

namespace retroinfer::cli {
namespace {

struct ServeCliOptions {
  ModelCliOptions model;
  std::string host = "127.0.0.1", attention = "full", served_name;
  int port = 8080;
  int max_batch = 8;
  int64_t max_context = 0, default_max_tokens = 256, prefill_step = 2048;
};

server::HttpServer* g_server = nullptr;  // for the SIGINT/SIGTERM handler
extern "C" void on_stop_signal(int) {
  if (g_server) g_server->stop();
}

void run_serve(const ServeCliOptions& o) {
  const AttentionKind kind = parse_attention_kind(o.attention);
  server::ServerOptions so;
  make_session_options(o.model, kind);  // bad attention flags fail before the model is read
  LoadedModel m = load_model(o.model);
  // With the model's head_dim: the default cluster size depends on it (default_tokens_per_cluster).
  so.session = make_session_options(o.model, kind, m.model->config().head_dim);
  so.max_context = o.max_context;
  so.default_max_tokens = o.default_max_tokens;
  so.max_batch = o.max_batch;
  so.prefill_step_tokens = o.prefill_step;
  so.model_name = o.served_name.empty() ? o.model.model : o.served_name;
  server::ServerHandler handler(*m.engine, *m.tokenizer, so);
  server::HttpServer http(handler);
  const int port = http.bind(o.host, o.port);
  std::fprintf(stderr,
               "retroinfer serve: %s on %s, %s attention, context %lld tokens, loaded in %.1f s\n"
               "listening on http://%s:%d (GET /health, GET /v1/models, POST /v1/completions, "
               "POST /v1/chat/completions); continuous batching of up to %d sequences%s\n",
               so.model_name.c_str(), m.engine->description().c_str(), o.attention.c_str(),
               static_cast<long long>(handler.context_limit()), m.load_seconds, o.host.c_str(), port, o.max_batch,
               m.engine->device() == Device::kCpu ? " (one batched decode step each)"
                                                  : " (one joined decode step each: the products run once over all of them)");
  if (m.engine->device() == Device::kCuda)
    std::fprintf(stderr, "KV placement %s per request (the plan of each request's session decides: auto puts a "
                 "context that does not fit on the GPU onto the GPU / host split); responses report it\n",
                 std::string(buffer::kv_placement_name(so.session.kv_placement.placement)).c_str());
  g_server = &http;
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  http.listen();
  g_server = nullptr;
  std::fprintf(stderr, "retroinfer serve: stopped\n");
}

void setup_serve(CLI::App& app) {
  auto o = std::make_shared<ServeCliOptions>();
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)");
  add_model_options(cmd, o->model);
  cmd->add_option("--host", o->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o->port, "Port to listen on (0: any free port)")->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--attention", o->attention, "Decode attention: full, retro, quest, streaming, oracle")
      ->capture_default_str();
  cmd->add_option("--max-context", o->max_context, "Prompt + completion tokens per request; 0 = the model's maximum")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--default-max-tokens", o->default_max_tokens, "max_tokens when a request gives none")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-batch", o->max_batch,
                  "Requests generating at once (continuous batching: new requests join between decode steps)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--prefill-step", o->prefill_step,
                  "Prompt tokens prefilled per iteration while other requests decode (whole --prefill-chunk chunks, at "
                  "least one; CPU sessions; 0 = each prompt at once)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--served-model-name", o->served_name, "Model id in /v1/models and responses (default: --model)");
  cmd->callback([o] { run_serve(*o); });
}
RETROINFER_COMMAND(setup_serve);

}  // namespace
}  // namespace retroinfer::cli
