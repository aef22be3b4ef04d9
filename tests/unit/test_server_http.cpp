// `retroinfer serve` end to end: the httplib server on an ephemeral port in a thread, talked to with
// httplib::Client (non-stream, stream, a 400, a 404, a client leaving mid-stream), stopped cleanly.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "server/http_server.h"
#include "test_server_util.h"

namespace retroinfer {
namespace {

using nlohmann::json;

TEST(ServerHttp, EndToEnd) {
  server::ServerHandler* h = test::tiny_handler(AttentionKind::kFull);
  if (!h) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  server::HttpServer http(*h);
  const int port = http.bind("127.0.0.1", 0);
  ASSERT_GT(port, 0);
  std::thread serving([&] { http.listen(); });
  for (int i = 0; i < 200 && !http.running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(http.running());

  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(10, 0);
  {
    const auto r = cli.Get("/health");
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(json::parse(r->body).at("status"), "ok");
  }
  const json req = {{"prompt", "Hello"}, {"max_tokens", 6}, {"temperature", 0}};
  std::string text;
  {
    const auto r = cli.Post("/v1/completions", req.dump(), "application/json");
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
    const json j = json::parse(r->body);
    text = j.at("choices")[0].at("text");
    EXPECT_EQ(j.at("usage").at("prompt_tokens"), 5);
  }
  {
    json sreq = req;
    sreq["stream"] = true;
    std::string body;
    const auto r = cli.Post("/v1/completions", httplib::Headers{}, sreq.dump(), "application/json");
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
    const auto events = test::sse_events(r->body);
    ASSERT_GE(events.size(), 2u) << r->body;
    EXPECT_EQ(events.back(), "[DONE]");
    std::string streamed;
    for (size_t i = 0; i + 1 < events.size(); ++i) streamed += json::parse(events[i]).at("choices")[0].at("text");
    EXPECT_EQ(streamed, text);
  }
  {
    const auto r = cli.Post("/v1/completions", "{\"prompt\": 1}", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_EQ(json::parse(r->body).at("error").at("type"), "invalid_request_error");
    const auto g = cli.Get("/v2/anything");
    ASSERT_TRUE(g);
    EXPECT_EQ(g->status, 404);
    EXPECT_EQ(json::parse(g->body).at("error").at("code"), "not_found");
    // httplib's own refusal (a form-encoded body over 8 KiB, as `curl -d` sends) is a JSON error too.
    const auto f = cli.Post("/v1/completions", std::string(9000, 'a'), "application/x-www-form-urlencoded");
    ASSERT_TRUE(f);
    EXPECT_EQ(f->status, 413);
    EXPECT_NE(json::parse(f->body).at("error").at("message").get<std::string>().find("application/json"),
              std::string::npos);
    const auto m = cli.Get("/v1/chat/completions");
    ASSERT_TRUE(m);
    EXPECT_EQ(m->status, 405);
  }
  {
    // A client that leaves after the first chunk: the server stops that generation and goes on serving.
    const auto before = h->stats();
    httplib::Client quitter("127.0.0.1", port);
    int chunks = 0;
    const json long_req = {{"prompt", "abc"}, {"max_tokens", 400}, {"temperature", 0}, {"stream", true}};
    httplib::Request hreq;
    hreq.method = "POST";
    hreq.path = "/v1/completions";
    hreq.body = long_req.dump();
    hreq.set_header("Content-Type", "application/json");
    hreq.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 1; };
    quitter.send(hreq);
    quitter.stop();
    EXPECT_GE(chunks, 1);
    // Requests run concurrently (continuous batching): the next one is served while the cancelled stream's
    // thread may still be winding down, so wait (bounded) until both are counted.
    const auto r = cli.Post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 1}}.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    // ServerHandler::count adds the generation before the cancellation: wait for both counters.
    auto counted = [&] {
      const auto s = h->stats();
      return s.generations >= before.generations + 2 && s.cancelled_streams >= before.cancelled_streams + 1;
    };
    while (!counted() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const auto after = h->stats();
    EXPECT_EQ(after.generations, before.generations + 2);
    EXPECT_EQ(after.cancelled_streams, before.cancelled_streams + 1);
    EXPECT_LT(after.generated_tokens - before.generated_tokens, 400);
  }
  http.stop();
  serving.join();
  EXPECT_FALSE(http.running());
}

}  // namespace
}  // namespace retroinfer
