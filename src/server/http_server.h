// The HTTP transport of `retroinfer serve` (cpp-httplib): every request goes to a ServerHandler; SSE
// replies are sent chunked, and a failed write (the client went away) stops the generation.
//
// Threading contract: listen() blocks the calling thread and serves on httplib's worker threads; stop()
// may be called from any thread and makes listen() return.
#pragma once

#include <memory>
#include <string>

#include "server/server_handler.h"

namespace retroinfer::server {

class HttpServer {
 public:
  explicit HttpServer(ServerHandler& handler);  // borrows the handler
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port (port 0: an ephemeral port); returns the bound port. Throws Error when binding fails.
  int bind(const std::string& host, int port);
  // Serves until stop(); call after bind().
  void listen();
  void stop();
  bool running() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace retroinfer::server
