// The HTTP transport of `retroinfer serve`, on Boost.Beast (request parsing) and Boost.Asio (event-driven
// sockets): a few I/O threads serve every connection asynchronously; a generation's work (ServerHandler's
// HttpReply::work: tokenise, wait for the batch scheduler, stream) runs on a thread of its own, so that no
// I/O thread ever waits on generation and --max-batch (with --max-queue behind it, admission being the
// handler's) is the only cap on the requests generating at once.
//
// Per connection: a bounded number of open connections (beyond it: 503 and close), header / body / idle
// timeouts, a body limit checked from Content-Length before the body is read (413), HTTP/1.1 keep-alive and
// pipelining (requests read ahead, answered in order), HTTP/1.0 (never chunked: a streamed reply is
// delimited by closing the connection), Server-Sent Events through a bounded write queue (back-pressure:
// the stream's writer waits while the client is not reading), and a client that goes away (its socket
// reads end of file or fails, or a write fails) cancels its request through RequestContext::client_gone.
// One JSON log line per request on stderr.
//
// Threading contract: bind(), then listen() on one thread (it runs the I/O threads and returns after
// stop()); set_handler() and stop() may be called from any thread. The destructor stops and waits for the
// generation threads still running (they end once their connection is closed: the handler cancels them).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "server/metrics.h"
#include "server/server_handler.h"

namespace retroinfer::server {

struct HttpServerOptions {
  int io_threads = 2;                  // threads running the sockets (never blocked by generation)
  int max_connections = 256;           // open connections; one more is answered 503 and closed
  int backlog = 1024;                  // the listen queue (the kernel caps it at net.core.somaxconn)
  double header_timeout_s = 10.0;      // from a request's first byte to the end of its headers
  double body_timeout_s = 30.0;        // to read a request's body
  double idle_timeout_s = 60.0;        // a keep-alive connection with no request in progress
  double write_timeout_s = 30.0;       // a reply's bytes not taken by the client for this long: closed
  int64_t max_body_bytes = 8 << 20;    // larger request bodies: 413 before the body is read
  int64_t max_header_bytes = 16 << 10; // request line + headers; larger: 431
  int64_t stream_queue_bytes = 64 << 10;  // a connection's unsent bytes beyond which a stream waits
  int max_pipelined = 16;              // requests read ahead of the one being answered
  bool log_requests = true;            // one JSON line per request on stderr
};

class HttpServer {
 public:
  HttpServer(HttpServerOptions opt, std::shared_ptr<ServerMetrics> metrics);
  // Borrows the handler (it must outlive the server or be replaced by set_handler(nullptr) first).
  HttpServer(ServerHandler& handler, HttpServerOptions opt = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Until a handler is set, requests get loading_reply() (GET /health: 503 "loading").
  void set_handler(ServerHandler* handler);
  // Binds host:port (port 0: an ephemeral port); returns the bound port. Throws Error when binding fails.
  int bind(const std::string& host, int port);
  // Serves until stop(); call after bind().
  void listen();
  // Closes the listening socket and every connection (their requests are cancelled), lets the I/O threads
  // end, and waits for the generation threads. Idempotent.
  void stop();
  bool running() const;
  ServerMetrics& metrics();

  struct Impl;  // http_server.cpp (its connections share it)

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace retroinfer::server
