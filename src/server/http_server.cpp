#include "server/http_server.h"

#include <httplib.h>

#include "retroinfer/error.h"

namespace retroinfer::server {

struct HttpServer::Impl {
  ServerHandler& handler;
  httplib::Server http;
  explicit Impl(ServerHandler& h) : handler(h) {}
};

HttpServer::HttpServer(ServerHandler& handler) : impl_(std::make_unique<Impl>(handler)) {
  // Routing is the handler's (404 / 405 included): every method and path goes to it.
  auto serve = [this](const httplib::Request& req, httplib::Response& res) {
    HttpReply r = impl_->handler.handle(req.method, req.path, req.body);
    res.status = r.status;
    if (!r.stream) {
      res.set_content(r.body, r.content_type.c_str());
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    auto producer = std::move(r.stream);
    res.set_chunked_content_provider(r.content_type.c_str(), [producer](size_t, httplib::DataSink& sink) {
      bool gone = false;
      producer([&](std::string_view chunk) {
        // write() fails once the peer has closed; is_writable() catches it before the next token.
        gone = gone || !sink.is_writable() || !sink.write(chunk.data(), chunk.size());
        return !gone;
      });
      if (!gone) sink.done();
      return !gone;
    });
  };
  // Errors httplib answers itself (a malformed request, 413 for a form-encoded body over 8 KiB) get the
  // OpenAI error object too; the handler's own error replies already have a body and are left alone.
  impl_->http.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message = "HTTP error " + std::to_string(res.status);
    if (res.status == 413)
      message += ": the body is too large for its Content-Type; send JSON with Content-Type: application/json";
    res.set_content(error_json(ApiError(res.status, message, "", "http_error")).dump(), "application/json");
  });
  const char* kAny = ".*";
  impl_->http.Get(kAny, serve);
  impl_->http.Post(kAny, serve);
  impl_->http.Put(kAny, serve);
  impl_->http.Patch(kAny, serve);
  impl_->http.Delete(kAny, serve);
  impl_->http.Options(kAny, serve);
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::bind(const std::string& host, int port) {
  RETROINFER_CHECK(port >= 0 && port <= 65535, "serve: --port ", port, " is outside [0, 65535]");
  if (port == 0) {
    const int p = impl_->http.bind_to_any_port(host);
    RETROINFER_CHECK(p > 0, "serve: cannot bind an ephemeral port on '", host, "'");
    return p;
  }
  RETROINFER_CHECK(impl_->http.bind_to_port(host, port), "serve: cannot bind ", host, ":", port,
                   " (in use, or not an address of this machine?); choose another --host/--port");
  return port;
}

void HttpServer::listen() { impl_->http.listen_after_bind(); }

void HttpServer::stop() {
  if (impl_) impl_->http.stop();
}

bool HttpServer::running() const { return impl_->http.is_running(); }

}  // namespace retroinfer::server
