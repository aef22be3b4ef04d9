// `retroinfer serve`: an OpenAI-compatible HTTP server over one model (src/server/, docs/server.md).
// Requests are served with continuous batching (up to --max-batch sequences at once; batch_scheduler.h).
#include <CLI/CLI.hpp>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "command.h"
#include "model_cli.h"
#include "retroinfer/error.h"
#include "retroinfer/prefix_cache.h"
#include "retroinfer/snapshot.h"
#include "server/http_server.h"
#include "server/server_handler.h"

namespace retroinfer::cli {
namespace {

struct ServeCliOptions {
  ModelCliOptions model;
  std::string host = "127.0.0.1", attention = "retro", served_name;
  int port = 8080;
  int max_batch = 8, max_queue = 64;
  int64_t max_context = 0, default_max_tokens = 256, prefill_step = 2048;
  double request_timeout = 0.0, drain_timeout = 30.0;
  server::HttpServerOptions http;
  std::string api_key, api_key_file;
  std::vector<std::string> allowed_origins, allowed_hosts;
  bool allow_special_tokens_in_content = false, no_request_log = false;
  double prefix_cache_mb = 0.0;  // 0: no prefix cache
  double prefix_cache_gpu_mb = 0.0;  // cuda: the prefix cache's GPU tier (device copies of its blocks); 0: none
  int prefix_cache_block = PrefixCacheOptions{}.block_tokens;
  std::vector<std::string> preload;  // snapshots put in the prefix cache, pinned
};

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// The API key: --api-key, else the first line of --api-key-file, else $RETROINFER_API_KEY; "" = none.
std::string api_key(const ServeCliOptions& o) {
  if (!o.api_key.empty()) return o.api_key;
  if (!o.api_key_file.empty()) {
    std::ifstream f(o.api_key_file);
    RETROINFER_CHECK(f.good(), "serve: cannot read --api-key-file '", o.api_key_file, "'");
    std::string key;
    std::getline(f, key);
    while (!key.empty() && (key.back() == '\r' || key.back() == ' ')) key.pop_back();
    RETROINFER_CHECK(!key.empty(), "serve: --api-key-file '", o.api_key_file, "' holds no key on its first line");
    return key;
  }
  const char* env = std::getenv("RETROINFER_API_KEY");
  return env ? std::string(env) : std::string();
}

// Host header values the server answers when it binds a loopback address: its own names with and without
// the port, and --allowed-hosts. Empty (no check) for another address unless --allowed-hosts is given.
std::vector<std::string> allowed_hosts(const ServeCliOptions& o, int port) {
  std::vector<std::string> hosts;
  if (is_loopback(o.host)) {
    for (std::string h : {std::string("localhost"), std::string("127.0.0.1"), std::string("[::1]"),
                          o.host == "::1" ? std::string("[::1]") : o.host}) {
      hosts.push_back(h);
      hosts.push_back(h + ":" + std::to_string(port));
    }
  }
  if (!hosts.empty() || !o.allowed_hosts.empty()) {
    for (const std::string& h : o.allowed_hosts) {
      hosts.push_back(h);
      if (h.find(':') == std::string::npos) hosts.push_back(h + ":" + std::to_string(port));
    }
  }
  return hosts;
}

void run_serve(const ServeCliOptions& o) {
  const AttentionKind kind = parse_attention_kind(o.attention);
  server::ServerOptions so;
  make_session_options(o.model, kind);  // bad attention flags fail before the model is read
  so.max_context = o.max_context;
  so.default_max_tokens = o.default_max_tokens;
  so.max_batch = o.max_batch;
  so.max_queue = o.max_queue;
  so.request_timeout_s = o.request_timeout;
  so.prefill_step_tokens = o.prefill_step;
  so.model_name = o.served_name.empty() ? o.model.model : o.served_name;
  so.api_key = api_key(o);
  so.allowed_origins = o.allowed_origins;
  so.parse_special_in_content = o.allow_special_tokens_in_content;
  RETROINFER_CHECK(o.preload.empty() || o.prefix_cache_mb > 0, "serve: --preload puts snapshots in the prefix cache; "
                   "give --prefix-cache-mb (at least the snapshots' K/V)");
  RETROINFER_CHECK(o.prefix_cache_gpu_mb == 0 || o.prefix_cache_mb > 0, "serve: --prefix-cache-gpu-mb keeps device "
                   "copies of the prefix cache's blocks; give --prefix-cache-mb too (the cache itself, in host memory)");
  if (o.prefix_cache_mb > 0) {
    const auto bytes = static_cast<int64_t>(o.prefix_cache_mb * (1 << 20));
    so.prefix_cache = std::make_shared<PrefixCache>(PrefixCacheOptions{o.prefix_cache_block, bytes});
  }

  // SIGINT / SIGTERM are taken by one thread (sigwait): blocked here, before any thread starts, so that
  // every thread (I/O, scheduler, OpenMP) inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  // Static: the signal thread is detached and outlives this function when loading fails.
  static std::atomic<int> signals{0};
  static std::atomic<bool> loaded{false};
  // The first signal drains (below); a second one, or one while the model loads, ends the process at once.
  std::thread([stop_signals] {
    for (;;) {
      int sig = 0;
      if (sigwait(&stop_signals, &sig) != 0) continue;
      if (signals.fetch_add(1) == 0 && loaded.load()) {
        signals.notify_all();
        continue;
      }
      std::fprintf(stderr, "retroinfer serve: signal %d: stopping now\n", sig);
      std::_Exit(128 + sig);
    }
  }).detach();

  // The transport answers from the start: /health says "loading" (503) until the model is in.
  auto metrics = std::make_shared<server::ServerMetrics>();
  server::HttpServerOptions ho = o.http;
  ho.log_requests = !o.no_request_log;
  server::HttpServer http(ho, metrics);
  const int port = http.bind(o.host, o.port);
  so.allowed_hosts = allowed_hosts(o, port);
  std::thread io([&http] { http.listen(); });
  struct Joiner {
    server::HttpServer& http;
    std::thread& io;
    ~Joiner() {
      http.stop();
      if (io.joinable()) io.join();
    }
  } joiner{http, io};
  std::fprintf(stderr, "retroinfer serve: listening on http://%s:%d; loading %s\n", o.host.c_str(), port,
               o.model.model.c_str());

  ModelCliOptions model_opt = o.model;
  if (so.prefix_cache) model_opt.reserved_host_bytes = so.prefix_cache->options().capacity_bytes;
  model_opt.prefix_gpu_bytes = static_cast<int64_t>(o.prefix_cache_gpu_mb * (1 << 20));
  LoadedModel m = load_model(model_opt);
  // With the model's head_dim: the default cluster size depends on it (default_tokens_per_cluster).
  so.session = make_session_options(o.model, kind, m.model->config().head_dim);
  calibrate_kv_keys(m, so.session, "serve");
  if (so.prefix_cache) {
    if (m.engine->device() == Device::kCuda)
      std::fprintf(stderr, "retroinfer serve: the prefix cache serves CUDA requests whose session keeps every layer's KV "
                   "on the GPU (a request placed on the GPU / host split prefills in full)\n");
    const ModelIdentity id = model_identity(*m.model, m.tokenizer.get());
    for (const std::string& path : o.preload) {
      const Snapshot snap = load_snapshot(path);
      check_snapshot(snap, id, so.session.kv_dtype, so.session.attention, path);
      preload_context(*so.prefix_cache, snap.context, so.session.kv_dtype);
      std::fprintf(stderr, "retroinfer serve: preloaded %s (%lld tokens) into the prefix cache\n", path.c_str(),
                   static_cast<long long>(snap.context.size()));
    }
  }
  server::ServerHandler handler(*m.engine, *m.tokenizer, so, metrics);
  http.set_handler(&handler);
  loaded.store(true);
  std::fprintf(stderr,
               "retroinfer serve: %s on %s, %s attention, context %lld tokens, loaded in %.1f s; ready\n"
               "  GET /health, GET /metrics, GET /v1/models, GET /v1/models/{id}, POST /v1/completions, "
               "POST /v1/chat/completions; "
               "continuous batching of up to %d sequences%s, %d queued\n"
               "  API key %s; %s\n",
               so.model_name.c_str(), m.engine->description().c_str(), o.attention.c_str(),
               static_cast<long long>(handler.context_limit()), m.load_seconds, o.max_batch,
               m.engine->device() == Device::kCpu ? " (one batched decode step each)"
                                                  : " (one joined decode step each: the products run once over all of them)",
               o.max_queue, so.api_key.empty() ? "off (anyone who reaches the port may generate)" : "required",
               so.allowed_hosts.empty() ? "any Host header" : "Host header checked (loopback names)");
  if (m.engine->device() == Device::kCuda)
    std::fprintf(stderr, "KV placement %s per request (the plan of each request's session decides: auto puts a "
                 "context that does not fit on the GPU onto the GPU / host split); responses report it\n",
                 std::string(buffer::kv_placement_name(so.session.kv_placement.placement)).c_str());

  // Drain on the first signal: no new generations (503), those admitted finish within --drain-timeout, then
  // the rest are cancelled.
  signals.wait(0);
  handler.begin_drain();
  std::fprintf(stderr, "retroinfer serve: draining: no new requests, %lld admitted finish within %.1f s (a second "
               "signal stops at once)\n", static_cast<long long>(handler.in_flight()), o.drain_timeout);
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.drain_timeout * 1000));
  while (handler.in_flight() > 0 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (handler.in_flight() > 0) {
    std::fprintf(stderr, "retroinfer serve: %lld requests still running after --drain-timeout %.1f s: cancelled\n",
                 static_cast<long long>(handler.in_flight()), o.drain_timeout);
    handler.cancel_all();
    const auto grace = Clock::now() + std::chrono::seconds(5);
    while (handler.in_flight() > 0 && Clock::now() < grace) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  http.stop();  // closes the connections and waits for the generation threads
  io.join();
  http.set_handler(nullptr);
  std::fprintf(stderr, "retroinfer serve: stopped\n");
}

void setup_serve(CLI::App& app) {
  auto o = std::make_shared<ServeCliOptions>();
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)");
  o->model.device = "auto";  // this engine's defaults: the GPU when usable, retro attention
  add_model_options(cmd, o->model);
  cmd->add_option("--host", o->host, "IP address to listen on (a loopback address also checks the Host header)")
      ->capture_default_str();
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
  cmd->add_option("--max-queue", o->max_queue, "Requests waiting for a batch slot; more are refused with 429")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--request-timeout", o->request_timeout,
                  "Seconds a generation request may take from admission (queue + generation); then 504. 0 = none")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--drain-timeout", o->drain_timeout,
                  "On SIGTERM/SIGINT: seconds the running requests may finish in before they are cancelled")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-connections", o->http.max_connections, "Open connections; more are answered 503")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--backlog", o->http.backlog, "Listen backlog (capped by net.core.somaxconn)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--io-threads", o->http.io_threads, "Threads serving the sockets")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-body-bytes", o->http.max_body_bytes, "Largest request body; larger: 413")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--header-timeout", o->http.header_timeout_s, "Seconds to receive a request's headers")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--body-timeout", o->http.body_timeout_s, "Seconds to receive a request's body")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--idle-timeout", o->http.idle_timeout_s, "Seconds a keep-alive connection may stay idle")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--write-timeout", o->http.write_timeout_s,
                  "Seconds a client may leave the reply's bytes unread before it is disconnected")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--api-key", o->api_key,
                  "Require Authorization: Bearer KEY on every request but GET /health (also --api-key-file, "
                  "$RETROINFER_API_KEY)");
  cmd->add_option("--api-key-file", o->api_key_file, "Read the API key from the first line of this file");
  cmd->add_option("--allowed-origins", o->allowed_origins,
                  "Web origins allowed to call the API from a browser (CORS), comma-separated, or *; default none")
      ->delimiter(',');
  cmd->add_option("--allowed-hosts", o->allowed_hosts,
                  "More Host header names accepted (comma-separated; a loopback bind accepts only its own names)")
      ->delimiter(',');
  cmd->add_flag("--allow-special-tokens-in-content", o->allow_special_tokens_in_content,
                "Chat: parse special-token text in messages as control tokens (trusted callers only)");
  cmd->add_flag("--no-request-log", o->no_request_log, "No JSON log line per request on stderr");
  cmd->add_option("--prefix-cache-mb", o->prefix_cache_mb,
                  "Host memory (MiB) of a prefix cache across requests: a prompt that starts with cached blocks "
                  "prefills only the rest (0 = none; on cuda, requests whose KV is all on the GPU)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--prefix-cache-gpu-mb", o->prefix_cache_gpu_mb,
                  "cuda: GPU memory (MiB) for device copies of the prefix cache's blocks, so that a hit copies them "
                  "inside the GPU instead of over PCIe; sessions leave it free (0 = none)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--prefix-cache-block", o->prefix_cache_block, "Tokens per prefix-cache block")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--preload", o->preload,
                  "Snapshot (retroinfer snapshot save) put in the prefix cache at start, never evicted (repeatable)");
  cmd->callback([o] { run_serve(*o); });
}
RETROINFER_COMMAND(setup_serve);

}  // namespace
}  // namespace retroinfer::cli
