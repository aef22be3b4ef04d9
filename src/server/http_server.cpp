#include "server/http_server.h"

#include <sys/socket.h>

#include <array>
#include <atomic>
#include <functional>
#include <limits>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "retroinfer/error.h"

namespace retroinfer::server {

namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

std::string reason_phrase(int status) {
  if (status == 499) return "Client Closed Request";
  const auto r = http::obsolete_reason(static_cast<http::status>(status));
  return r.empty() ? std::string("Unknown") : std::string(r);
}

// A reply's status line and headers. content_length < 0: no Content-Length (chunked, or close-delimited).
std::string reply_head(int version, int status, const HttpReply& r, int64_t content_length, bool chunked,
                       bool keep_alive) {
  std::string h = version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ";
  h += std::to_string(status) + " " + reason_phrase(status) + "\r\nServer: retroinfer\r\n";
  if (status != 204) h += "Content-Type: " + r.content_type + "\r\n";
  for (const auto& [name, value] : r.headers) h += name + ": " + value + "\r\n";
  if (content_length >= 0) h += "Content-Length: " + std::to_string(content_length) + "\r\n";
  if (chunked) h += "Transfer-Encoding: chunked\r\n";
  if (r.stream) h += "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n";
  h += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  return h;
}

HttpReply transport_error(int status, const std::string& message, const char* code) {
  HttpReply r;
  r.status = status;
  r.body = error_json(ApiError(status, message, "", code)).dump();
  return r;
}

}  // namespace

class Connection;

struct HttpServer::Impl : std::enable_shared_from_this<HttpServer::Impl> {
  HttpServerOptions opt;
  std::shared_ptr<ServerMetrics> metrics;
  std::atomic<ServerHandler*> handler{nullptr};
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  // The acceptor's handlers and stop()'s close run on this strand: with several I/O threads an accept
  // handler starting the next accept and stop() closing the acceptor would otherwise touch it at once.
  net::strand<net::io_context::executor_type> accept_strand{net::make_strand(ioc)};
  std::atomic<bool> stopping{false}, serving{false};

  std::mutex mu;
  std::vector<std::weak_ptr<Connection>> connections;  // guarded by mu (stop() closes them)
  std::condition_variable workers_cv;
  int workers = 0;  // guarded by mu: generation threads running

  void accept();
  void refuse(tcp::socket socket);
  void close_all();
  void log(const json& line) {
    if (!opt.log_requests) return;
    const std::string s = line.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    std::fwrite(s.data(), 1, s.size(), stderr);
  }
};

// One client connection. Everything but the stream writer's wait runs on the connection's strand.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(std::shared_ptr<HttpServer::Impl> server, tcp::socket socket)
      : server_(std::move(server)),
        socket_(std::move(socket)),
        read_timer_(socket_.get_executor()),
        write_timer_(socket_.get_executor()) {
    boost::system::error_code ec;
    const auto ep = socket_.remote_endpoint(ec);
    if (!ec) remote_ = ep.address().to_string() + ":" + std::to_string(ep.port());
  }

  void start() { wait_for_request(); }

  net::any_io_executor executor() { return socket_.get_executor(); }

  // From any thread.
  void close_from_anywhere() {
    net::post(socket_.get_executor(), [self = shared_from_this()] { self->close("server_stopped"); });
  }

 private:
  struct Pending {
    HttpRequest req;
    int version = 11;
    bool keep_alive = true;
    Clock::time_point start;
    int64_t bytes_in = 0;
    RequestContext ctx;
  };

  // --- reading ---------------------------------------------------------------------------------------------

  // Waits for the next request's first byte: idle timeout while no request is in progress.
  void wait_for_request() {
    if (closed_ || reading_) return;
    // After a last request (Connection: close, HTTP/1.0): bytes that follow are dropped, and the end of the
    // connection still says that the client left.
    if (no_more_requests_) return drain();
    if (static_cast<int>(pipeline_.size()) > server_->opt.max_pipelined) return;  // resumed by finish()
    reading_ = true;
    if (buffer_.size() > 0) return read_header();
    if (pipeline_.empty()) arm_read_timer(server_->opt.idle_timeout_s, "idle_timeout");
    await_first_byte();
  }

  void await_first_byte() {
    waiting_first_byte_ = true;
    socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](boost::system::error_code ec) {
      self->waiting_first_byte_ = false;
      if (self->lingering_) return self->drain();
      if (!ec) {
        // The header clock starts at a request's first byte: a readiness report with no byte behind it,
        // should the reactor give one, waits again (the idle timer running on) instead of starting a header
        // timeout that would close the connection under a request still generating.
        switch (self->peek_first_byte(ec)) {
          case FirstByte::kNothingYet: return self->await_first_byte();
          case FirstByte::kEndOfFile: ec = net::error::eof; break;
          case FirstByte::kData:
          case FirstByte::kError: break;
        }
      }
      self->disarm_read_timer();
      if (ec) return self->on_read_error(ec);
      self->read_header();
    });
  }

  enum class FirstByte { kData, kEndOfFile, kNothingYet, kError };
  // What the socket holds without taking it: a byte, its end of file, nothing yet, or an error (in ec).
  FirstByte peek_first_byte(boost::system::error_code& ec) {
    char byte = 0;
    for (;;) {
      const ssize_t n = ::recv(socket_.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n > 0) return FirstByte::kData;
      if (n == 0) return FirstByte::kEndOfFile;
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return FirstByte::kNothingYet;
      ec = boost::system::error_code(errno, boost::system::system_category());
      return FirstByte::kError;
    }
  }

  void read_header() {
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(server_->opt.max_header_bytes));
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());  // checked below from Content-Length, before the body is read
    header_start_ = Clock::now();
    arm_read_timer(server_->opt.header_timeout_s, "header_timeout");
    http::async_read_header(socket_, buffer_, *parser_,
                            [self = shared_from_this()](boost::system::error_code ec, size_t n) {
                              if (self->lingering_) return self->drain();
                              self->disarm_read_timer();
                              self->on_header(ec, n);
                            });
  }

  void on_header(boost::system::error_code ec, size_t n) {
    if (ec == http::error::header_limit) return refuse_request(431, "the request's headers are too large");
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::operation_aborted ||
        ec == net::error::connection_reset || ec == net::error::bad_descriptor)
      return on_read_error(ec);
    if (ec) return refuse_request(400, "malformed HTTP request: " + ec.message());
    bytes_in_ = static_cast<int64_t>(n);
    const auto& h = parser_->get();
    const int64_t limit = server_->opt.max_body_bytes;
    if (parser_->content_length() && static_cast<int64_t>(*parser_->content_length()) > limit)
      return refuse_request(413, "the request body is " + std::to_string(*parser_->content_length()) +
                                     " bytes; this server accepts at most " + std::to_string(limit) +
                                     " (--max-body-bytes)");
    parser_->body_limit(static_cast<uint64_t>(limit));  // a chunked body is counted as it comes
    if (parser_->is_done()) return on_request();
    if (boost::beast::iequals(h[http::field::expect], "100-continue")) {
      const std::string cont = h.version() == 10 ? "HTTP/1.0 100 Continue\r\n\r\n" : "HTTP/1.1 100 Continue\r\n\r\n";
      enqueue(cont);
    }
    arm_read_timer(server_->opt.body_timeout_s, "body_timeout");
    http::async_read(socket_, buffer_, *parser_, [self = shared_from_this()](boost::system::error_code ec, size_t n) {
      if (self->lingering_) return self->drain();
      self->disarm_read_timer();
      if (ec == http::error::body_limit)
        return self->refuse_request(413, "the request body is larger than this server accepts (--max-body-bytes " +
                                             std::to_string(self->server_->opt.max_body_bytes) + ")");
      if (ec) return self->on_read_error(ec);
      self->bytes_in_ += static_cast<int64_t>(n);
      self->on_request();
    });
  }

  void on_request() {
    reading_ = false;
    auto msg = parser_->release();
    parser_.reset();
    Pending p;
    p.start = header_start_;
    p.version = static_cast<int>(msg.version());
    p.keep_alive = msg.keep_alive();
    p.bytes_in = bytes_in_;
    p.req.method = std::string(msg.method_string());
    std::string target(msg.target());
    p.req.path = target.substr(0, target.find('?'));
    for (const auto& f : msg) {
      std::string name(f.name_string());  // lower-cased: HttpRequest::header's contract
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      p.req.headers.emplace_back(std::move(name), std::string(f.value()));
    }
    p.req.body = std::move(msg.body());
    if (!p.keep_alive) no_more_requests_ = true;
    pipeline_.push_back(std::move(p));
    if (pipeline_.size() == 1) process_head();
    // Read on: the next pipelined request, or the end of file that says the client left.
    wait_for_request();
  }

  // The socket ended or failed while reading: the client is gone (a request in progress is cancelled).
  void on_read_error(boost::system::error_code ec) {
    reading_ = false;
    const bool eof = ec == http::error::end_of_stream || ec == net::error::eof;
    close(eof ? "client_closed" : "read_error: " + ec.message());
  }

  // A request the transport refuses itself (malformed, too large, timed out); the connection closes after.
  void refuse_request(int status, const std::string& message) {
    reading_ = false;
    no_more_requests_ = true;
    if (!pipeline_.empty()) return close("malformed_pipelined_request");  // a reply is in progress: it cannot be interleaved
    const char* code = status == 413 ? "body_too_large" : status == 431 ? "headers_too_large" : "bad_request";
    const HttpReply r = transport_error(status, message, code);
    enqueue(reply_head(11, status, r, static_cast<int64_t>(r.body.size()), false, false) + r.body);
    server_->metrics->count_response(status);
    json line = {{"remote", remote_}, {"status", status}, {"error", message}};
    server_->log(line);
    close_after_write_ = true;
  }

  // The deadline of the read in progress (idle, header or body); a generation number tells a stale expiry
  // (one already queued when the timer was re-armed or cancelled) from the current one.
  void arm_read_timer(double seconds, const char* why) {
    const uint64_t gen = ++read_timer_gen_;
    read_timer_.expires_after(millis(seconds));
    read_timer_.async_wait([weak = weak_from_this(), gen, why](boost::system::error_code ec) {
      auto self = weak.lock();
      if (ec || !self || self->read_timer_gen_ != gen) return;
      self->close(why);  // the pending read ends with operation_aborted
    });
  }
  void disarm_read_timer() {
    ++read_timer_gen_;
    read_timer_.cancel();
  }

  // --- answering -------------------------------------------------------------------------------------------

  void process_head() {
    Pending& p = pipeline_.front();
    ServerHandler* handler = server_->handler.load();
    HttpReply r = handler ? handler->route(p.req) : loading_reply(p.req);
    if (!r.work) return send_whole(std::move(r));
    // A generation: its own thread (admission bounds how many), never this I/O thread.
    auto work = std::move(r.work);
    auto headers = std::move(r.headers);
    auto guard = std::make_shared<WorkerGuard>(server_);
    // The guard is captured first so that it is destroyed last: stop() returns once the workers are done, and
    // the connection (whose destructor counts in the server's metrics) must be gone by then.
    std::thread([guard, self = shared_from_this(), work = std::move(work), headers = std::move(headers), ctx = p.ctx,
                 version = p.version, keep_alive = p.keep_alive]() mutable {
      HttpReply done;
      try {
        done = work(ctx);
      } catch (...) {
        done = transport_error(500, "the request failed unexpectedly", "internal_error");
      }
      work = nullptr;  // its admission slot goes, unless the stream holds it
      done.headers.insert(done.headers.end(), headers.begin(), headers.end());
      if (done.stream) {
        self->run_stream(std::move(done), version, keep_alive);
      } else {
        net::post(self->socket_.get_executor(),
                  [self, d = std::move(done)]() mutable { self->send_whole(std::move(d)); });
      }
    }).detach();
  }

  // Counts a generation thread while it runs (HttpServer::stop waits for them).
  struct WorkerGuard {
    std::shared_ptr<HttpServer::Impl> server;
    explicit WorkerGuard(std::shared_ptr<HttpServer::Impl> s) : server(std::move(s)) {
      std::lock_guard<std::mutex> lk(server->mu);
      ++server->workers;
    }
    ~WorkerGuard() {
      {
        std::lock_guard<std::mutex> lk(server->mu);
        --server->workers;
      }
      server->workers_cv.notify_all();
    }
  };

  void send_whole(HttpReply r) {
    if (closed_ || pipeline_.empty()) return;
    Pending& p = pipeline_.front();
    const bool keep_alive = p.keep_alive && !server_->stopping.load() && r.status != 499;
    if (r.status != 499)
      enqueue(reply_head(p.version, r.status, r, static_cast<int64_t>(r.body.size()), false, keep_alive) + r.body);
    finish(r.status, r, keep_alive);
  }

  // On the generation thread: streams the reply through the bounded queue, chunked for HTTP/1.1 and
  // delimited by the connection's end for HTTP/1.0.
  void run_stream(HttpReply r, int version, bool keep_alive) {
    const bool chunked = version >= 11;
    keep_alive = chunked && keep_alive && !server_->stopping.load();
    bool ok = enqueue_from_worker(reply_head(version, r.status, r, -1, chunked, keep_alive));
    if (ok) {
      const ChunkWriter write = [&](std::string_view chunk) {
        if (chunk.empty()) return !is_closed();
        std::string framed;
        if (chunked) {
          char size[32];
          std::snprintf(size, sizeof size, "%zx\r\n", chunk.size());
          framed = size;
          framed += chunk;
          framed += "\r\n";
        } else {
          framed = std::string(chunk);
        }
        return enqueue_from_worker(std::move(framed));
      };
      r.stream(write);
      ok = !is_closed();
    }
    r.stream = nullptr;  // the admission slot goes here
    net::post(socket_.get_executor(), [self = shared_from_this(), r = std::move(r), chunked, keep_alive, ok]() mutable {
      if (!ok || self->closed_) return self->close("stream_write_failed");
      if (chunked) self->enqueue("0\r\n\r\n");
      self->finish(r.status, r, keep_alive);
    });
  }

  // One request's log line; closed: what ended the connection before its reply was out ("" when it was).
  void log_request(const Pending& p, int status, const HttpReply* r, const std::string& closed) {
    json line = {{"time", static_cast<int64_t>(std::time(nullptr))},
                 {"remote", remote_},
                 {"method", p.req.method},
                 {"path", p.req.path},
                 {"http", p.version == 10 ? "1.0" : "1.1"},
                 {"status", status},
                 {"bytes_in", p.bytes_in},
                 {"seconds", std::chrono::duration<double>(Clock::now() - p.start).count()}};
    if (r && r->log)
      for (const auto& [k, v] : r->log->items()) line[k] = v;
    if (!closed.empty()) line["closed"] = closed;
    server_->log(line);
  }

  // The head request's reply is queued: log it, take the next.
  void finish(int status, const HttpReply& r, bool keep_alive) {
    Pending p = std::move(pipeline_.front());
    pipeline_.pop_front();
    server_->metrics->count_response(status);
    if (server_->opt.log_requests) log_request(p, status, &r, "");
    if (!keep_alive) {
      no_more_requests_ = true;
      pipeline_.clear();
      close_after_write_ = true;
      if (out_.empty()) close_gracefully();
      return;
    }
    if (!pipeline_.empty()) return process_head();
    if (waiting_first_byte_) arm_read_timer(server_->opt.idle_timeout_s, "idle_timeout");  // now idle
    wait_for_request();
  }

  // --- writing ---------------------------------------------------------------------------------------------

  bool is_closed() {
    std::lock_guard<std::mutex> lk(mu_);
    return closed_flag_;
  }

  // From the generation thread: waits while the queue is over its bound (back-pressure), then queues.
  bool enqueue_from_worker(std::string bytes) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return closed_flag_ || queued_bytes_ < server_->opt.stream_queue_bytes; });
      if (closed_flag_) return false;
      queued_bytes_ += static_cast<int64_t>(bytes.size());
    }
    net::post(socket_.get_executor(), [self = shared_from_this(), b = std::move(bytes)]() mutable {
      self->push(std::move(b), /*counted=*/true);
    });
    return true;
  }

  void enqueue(std::string bytes) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      queued_bytes_ += static_cast<int64_t>(bytes.size());
    }
    push(std::move(bytes), true);
  }

  void push(std::string bytes, bool) {
    if (closed_) return;
    out_.push_back(std::move(bytes));
    if (!writing_) write_next();
  }

  void write_next() {
    if (out_.empty() || closed_) {
      writing_ = false;
      if (close_after_write_ && out_.empty()) close_gracefully();
      else if (pipeline_.empty() && !reading_) wait_for_request();
      return;
    }
    writing_ = true;
    const uint64_t gen = ++write_timer_gen_;
    write_timer_.expires_after(millis(server_->opt.write_timeout_s));
    write_timer_.async_wait([weak = weak_from_this(), gen](boost::system::error_code ec) {
      auto self = weak.lock();
      if (ec || !self || self->write_timer_gen_ != gen) return;
      self->close("write_timeout");  // the client stopped reading
    });
    net::async_write(socket_, net::buffer(out_.front()),
                     [self = shared_from_this()](boost::system::error_code ec, size_t n) {
                       ++self->write_timer_gen_;
                       self->write_timer_.cancel();
                       {
                         std::lock_guard<std::mutex> lk(self->mu_);
                         self->queued_bytes_ -= static_cast<int64_t>(n);
                       }
                       self->cv_.notify_all();
                       if (ec) return self->close("write_error: " + ec.message());
                       self->out_.pop_front();
                       self->write_next();
                     });
  }

  // After the last reply: stop sending, then read and drop what the client still sends (a body refused
  // with 413, say) until it closes, for at most a second, so that closing with unread bytes does not reset
  // the connection before the client has read the reply.
  void close_gracefully() {
    if (closed_ || lingering_) return;
    lingering_ = true;
    boost::system::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return close("shutdown_error: " + ec.message());
    arm_read_timer(1.0, "linger_done");
    if (!reading_) drain();  // else the read in progress ends in drain()
  }

  void drain() {
    reading_ = true;
    auto scratch = std::make_shared<std::array<char, 16384>>();
    socket_.async_read_some(net::buffer(*scratch), [self = shared_from_this(), scratch](boost::system::error_code ec,
                                                                                        size_t) {
      self->reading_ = false;
      if (self->closed_) return;
      if (ec && !self->lingering_) return self->on_read_error(ec);  // the client left before its reply
      if (ec) return self->close("linger_done");
      self->drain();
    });
  }

 public:
  // why: what ended the connection (client_closed, write_timeout, idle_timeout, ...), logged with every
  // request it cut short.
  void close(const std::string& why) {
    if (closed_) return;
    closed_ = true;
    {
      std::lock_guard<std::mutex> lk(mu_);
      closed_flag_ = true;
    }
    cv_.notify_all();
    disarm_read_timer();
    ++write_timer_gen_;
    write_timer_.cancel();
    boost::system::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    // The requests read and not answered: the one in progress is cancelled (its generation stops), and each
    // gets its log line (status 499, as for a client that closed) with what ended the connection.
    for (Pending& p : pipeline_) {
      p.ctx.client_gone->cancel();
      server_->metrics->count_response(499);
      if (server_->opt.log_requests) log_request(p, 499, nullptr, why);
    }
    pipeline_.clear();
  }

  ~Connection() { server_->metrics->connections_open.fetch_sub(1); }

 private:
  std::shared_ptr<HttpServer::Impl> server_;
  tcp::socket socket_;
  net::steady_timer read_timer_, write_timer_;
  std::string remote_;
  boost::beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Clock::time_point header_start_;
  int64_t bytes_in_ = 0;
  std::deque<Pending> pipeline_;  // read, not yet answered; the front is being answered
  std::deque<std::string> out_;   // bytes to send, in order
  uint64_t read_timer_gen_ = 0, write_timer_gen_ = 0;
  bool waiting_first_byte_ = false, lingering_ = false;
  bool reading_ = false, writing_ = false, closed_ = false, no_more_requests_ = false, close_after_write_ = false;

  std::mutex mu_;  // the stream writer's view, shared with the generation thread
  std::condition_variable cv_;
  int64_t queued_bytes_ = 0;   // guarded by mu_: bytes queued and not written yet
  bool closed_flag_ = false;   // guarded by mu_
};

void HttpServer::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), net::bind_executor(accept_strand, [self = shared_from_this()](
                                                                             boost::system::error_code ec,
                                                                             tcp::socket socket) {
    if (self->stopping.load() || !self->acceptor.is_open()) return;
    if (!ec) {
      if (self->metrics->connections_open.load() >= self->opt.max_connections) {
        self->refuse(std::move(socket));
      } else {
        self->metrics->connections_open.fetch_add(1);
        auto c = std::make_shared<Connection>(self, std::move(socket));
        {
          std::lock_guard<std::mutex> lk(self->mu);
          std::erase_if(self->connections, [](const std::weak_ptr<Connection>& w) { return w.expired(); });
          self->connections.push_back(c);
        }
        net::post(c->executor(), [c] { c->start(); });
      }
    }
    // Errors of one accept (a client that reset before it was accepted, out of descriptors) end that
    // connection only.
    self->accept();
  }));
}

// Over --max-connections: 503 at once, then close (after the client has had a moment to read it, so
// that its unread request does not turn the close into a reset that loses the reply).
void HttpServer::Impl::refuse(tcp::socket socket) {
  metrics->connections_refused.fetch_add(1);
  metrics->count_response(503);
  HttpReply r = transport_error(503, "the server has too many open connections (--max-connections " +
                                         std::to_string(opt.max_connections) + "); retry later",
                                "too_many_connections");
  r.headers.emplace_back("Retry-After", "1");
  auto bytes = std::make_shared<std::string>(
      reply_head(11, 503, r, static_cast<int64_t>(r.body.size()), false, false) + r.body);
  auto sock = std::make_shared<tcp::socket>(std::move(socket));
  auto timer = std::make_shared<net::steady_timer>(sock->get_executor());
  net::async_write(*sock, net::buffer(*bytes), [sock, bytes, timer](boost::system::error_code ec, size_t) {
    boost::system::error_code ignored;
    if (ec) {
      sock->close(ignored);
      return;
    }
    sock->shutdown(tcp::socket::shutdown_send, ignored);
    timer->expires_after(std::chrono::seconds(1));
    timer->async_wait([sock](boost::system::error_code) {
      boost::system::error_code e;
      sock->close(e);
    });
    auto sink = std::make_shared<std::array<char, 4096>>();
    auto drain = std::make_shared<std::function<void()>>();
    *drain = [sock, sink, timer, drain] {
      sock->async_read_some(net::buffer(*sink), [sock, timer, drain](boost::system::error_code e, size_t) {
        if (e) {
          timer->cancel();
          *drain = nullptr;  // breaks the cycle
          return;
        }
        (*drain)();
      });
    };
    (*drain)();
  });
}

void HttpServer::Impl::close_all() {
  std::vector<std::shared_ptr<Connection>> live;
  {
    std::lock_guard<std::mutex> lk(mu);
    for (const auto& w : connections)
      if (auto c = w.lock()) live.push_back(std::move(c));
  }
  for (const auto& c : live) c->close_from_anywhere();
}

HttpServer::HttpServer(HttpServerOptions opt, std::shared_ptr<ServerMetrics> metrics)
    : impl_(std::make_shared<Impl>()) {
  impl_->opt = std::move(opt);
  impl_->metrics = metrics ? std::move(metrics) : std::make_shared<ServerMetrics>();
  RETROINFER_CHECK(impl_->opt.io_threads >= 1, "serve: --io-threads must be >= 1");
  RETROINFER_CHECK(impl_->opt.max_connections >= 1, "serve: --max-connections must be >= 1");
  RETROINFER_CHECK(impl_->opt.max_body_bytes >= 1, "serve: --max-body-bytes must be >= 1");
}

HttpServer::HttpServer(ServerHandler& handler, HttpServerOptions opt) : HttpServer(std::move(opt), nullptr) {
  impl_->metrics = std::shared_ptr<ServerMetrics>(&handler.metrics(), [](ServerMetrics*) {});
  set_handler(&handler);
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::set_handler(ServerHandler* handler) { impl_->handler.store(handler); }

ServerMetrics& HttpServer::metrics() { return *impl_->metrics; }

int HttpServer::bind(const std::string& host, int port) {
  RETROINFER_CHECK(port >= 0 && port <= 65535, "serve: --port ", port, " is outside [0, 65535]");
  boost::system::error_code ec;
  const auto address = net::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  RETROINFER_CHECK(!ec, "serve: --host '", host, "' is not an IP address (", ec.message(),
                   "); give one, e.g. 127.0.0.1 or 0.0.0.0");
  const tcp::endpoint ep(address, static_cast<unsigned short>(port));
  tcp::acceptor& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  RETROINFER_CHECK(!ec, "serve: cannot bind ", host, ":", port, " (", ec.message(),
                   "; in use, or not an address of this machine?); choose another --host/--port");
  a.listen(impl_->opt.backlog, ec);
  RETROINFER_CHECK(!ec, "serve: cannot listen on ", host, ":", port, ": ", ec.message());
  return a.local_endpoint().port();
}

void HttpServer::listen() {
  RETROINFER_CHECK(impl_->acceptor.is_open(), "serve: listen() before bind()");
  impl_->accept();
  impl_->serving.store(true);
  std::vector<std::thread> threads;
  for (int i = 1; i < impl_->opt.io_threads; ++i) threads.emplace_back([this] { impl_->ioc.run(); });
  impl_->ioc.run();
  for (auto& t : threads) t.join();
  impl_->serving.store(false);
}

void HttpServer::stop() {
  if (!impl_) return;
  if (!impl_->stopping.exchange(true)) {
    net::post(impl_->accept_strand, [impl = impl_] {
      boost::system::error_code ec;
      impl->acceptor.close(ec);
      impl->close_all();
    });
  }
  // The generation threads end once their connections are closed (their requests are cancelled).
  std::unique_lock<std::mutex> lk(impl_->mu);
  impl_->workers_cv.wait(lk, [&] { return impl_->workers == 0; });
}

bool HttpServer::running() const { return impl_->serving.load() && !impl_->stopping.load(); }

}  // namespace retroinfer::server
