// `retroinfer serve` without sockets: request JSON in, response JSON out, on the tiny model fixture
// (random weights: the texts mean nothing, their consistency does). Skips when the fixture is absent.
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "server/openai_api.h"
#include "server/server_handler.h"
#include "error_of.h"
#include "test_server_util.h"

namespace retroinfer {
namespace {

using nlohmann::json;
using server::HttpReply;
using server::ServerHandler;

#define TINY_HANDLER(h, kind)                                              \
  ServerHandler* h = test::tiny_handler(kind);                             \
  if (!h) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found"

json post(ServerHandler& h, const std::string& path, const json& body) {
  const HttpReply r = h.handle("POST", path, body.dump());
  EXPECT_EQ(r.status, 200) << body.dump() << " -> " << r.body;
  EXPECT_FALSE(r.stream) << "a non-stream request got a stream";
  return json::parse(r.body);
}

// Runs a stream reply to the end; returns the events.
std::vector<std::string> run_stream(const HttpReply& r) {
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.content_type, "text/event-stream");
  if (!r.stream) return {};
  std::string body;
  r.stream([&](std::string_view c) {
    body += c;
    return true;
  });
  return test::sse_events(body);
}

// The error reply of a bad request: status, the OpenAI error object, the param.
void expect_error(const HttpReply& r, int status, const std::string& param, const std::string& message_part = "") {
  EXPECT_EQ(r.status, status) << r.body;
  EXPECT_FALSE(r.stream);
  const json j = json::parse(r.body);
  ASSERT_TRUE(j.contains("error")) << r.body;
  const json& e = j.at("error");
  EXPECT_FALSE(e.at("message").get<std::string>().empty());
  EXPECT_EQ(e.at("type"), status >= 500 ? "server_error" : "invalid_request_error");
  EXPECT_TRUE(e.contains("code"));
  if (param.empty()) {
    EXPECT_TRUE(e.at("param").is_null()) << r.body;
  } else {
    EXPECT_EQ(e.at("param"), param) << r.body;
  }
  if (!message_part.empty()) {
    EXPECT_NE(e.at("message").get<std::string>().find(message_part), std::string::npos) << r.body;
  }
}

TEST(Server, HealthAndModels) {
  TINY_HANDLER(h, AttentionKind::kFull);
  const HttpReply health = h->handle("GET", "/health", "");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(json::parse(health.body).at("status"), "ok");
  const HttpReply models = h->handle("GET", "/v1/models", "");
  ASSERT_EQ(models.status, 200);
  const json m = json::parse(models.body);
  EXPECT_EQ(m.at("object"), "list");
  ASSERT_EQ(m.at("data").size(), 1u);
  EXPECT_EQ(m.at("data")[0].at("id"), "tiny");
  EXPECT_EQ(m.at("data")[0].at("context_length"), 512);  // the fixture's max_position_embeddings
}

TEST(Server, UnknownPathIs404WrongMethodIs405) {
  TINY_HANDLER(h, AttentionKind::kFull);
  expect_error(h->handle("GET", "/v1/nothing", ""), 404, "", "/v1/nothing");
  expect_error(h->handle("POST", "/", "{}"), 404, "");
  expect_error(h->handle("GET", "/v1/completions", ""), 405, "", "POST");
  expect_error(h->handle("PUT", "/v1/chat/completions", "{}"), 405, "");
  expect_error(h->handle("POST", "/health", ""), 405, "", "GET");
  expect_error(h->handle("DELETE", "/v1/models", ""), 405, "");
}

TEST(Server, CompletionShapeUsageAndDeterminism) {
  TINY_HANDLER(h, AttentionKind::kFull);
  const json req = {{"prompt", "Hello there"}, {"max_tokens", 6}, {"temperature", 0}};
  const json a = post(*h, "/v1/completions", req);
  EXPECT_EQ(a.at("object"), "text_completion");
  EXPECT_EQ(a.at("model"), "tiny");
  EXPECT_EQ(a.at("id").get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_GT(a.at("created").get<int64_t>(), 0);
  ASSERT_EQ(a.at("choices").size(), 1u);
  const json& c = a.at("choices")[0];
  EXPECT_EQ(c.at("index"), 0);
  const json& u = a.at("usage");
  EXPECT_EQ(u.at("prompt_tokens"), 11);  // the byte tokenizer: one token per byte, no BOS
  const int64_t n = u.at("completion_tokens").get<int64_t>();
  EXPECT_GE(n, 1);
  EXPECT_LE(n, 6);
  EXPECT_EQ(u.at("total_tokens"), 11 + n);
  const json& x = a.at("retroinfer");
  EXPECT_EQ(x.at("attention"), "full");
  EXPECT_EQ(x.at("kv_read_share").get<double>(), 1.0);  // full attention reads every cached token
  EXPECT_EQ(c.at("finish_reason"), x.at("stop_reason") == "max_tokens" ? "length" : "stop");
  EXPECT_EQ(x.at("stop_reason") == "max_tokens", n == 6);
  // Greedy: the same request gives the same completion; the served model's name is accepted.
  json req2 = req;
  req2["model"] = "tiny";
  const json b = post(*h, "/v1/completions", req2);
  EXPECT_EQ(b.at("choices")[0].at("text"), c.at("text"));
  EXPECT_EQ(b.at("model"), "tiny");
  EXPECT_NE(b.at("id"), a.at("id"));
  // No max_tokens: the server's default (8 here).
  const json d = post(*h, "/v1/completions", {{"prompt", "Hello there"}, {"temperature", 0}});
  EXPECT_LE(d.at("usage").at("completion_tokens").get<int64_t>(), 8);
}

TEST(Server, SeededSamplingIsReproducible) {
  TINY_HANDLER(h, AttentionKind::kFull);
  const json req = {{"prompt", "abc"}, {"max_tokens", 8}, {"temperature", 1.5}, {"top_p", 0.9}, {"seed", 7}};
  const json a = post(*h, "/v1/completions", req);
  const json b = post(*h, "/v1/completions", req);
  EXPECT_EQ(a.at("choices")[0].at("text"), b.at("choices")[0].at("text"));
  EXPECT_EQ(a.at("usage"), b.at("usage"));
}

TEST(Server, RetroReportsAPartialKvRead) {
  TINY_HANDLER(h, AttentionKind::kRetro);
  std::string prompt;
  for (int i = 0; i < 30; ++i) prompt += "word " + std::to_string(i) + ". ";  // 260 bytes = 260 tokens
  const json a = post(*h, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}});
  const json& x = a.at("retroinfer");
  EXPECT_EQ(x.at("attention"), "retro");
  std::printf("[server retro] prompt %lld tokens, kv_read_share %.4f\n",
              static_cast<long long>(a.at("usage").at("prompt_tokens").get<int64_t>()), x.at("kv_read_share").get<double>());
  ASSERT_GT(x.at("decode_steps").get<int64_t>(), 0) << a.dump();  // greedy on the fixture: no end token first
  // Sinks + a 16-token window + the retrieved clusters of a 260-token context: a part, not all.
  EXPECT_GT(x.at("kv_read_share").get<double>(), 0.0);
  EXPECT_LT(x.at("kv_read_share").get<double>(), 1.0) << a.dump();
  EXPECT_LT(x.at("exact_tokens").get<int64_t>(), x.at("context_tokens").get<int64_t>());
}

TEST(Server, StreamEqualsNonStream) {
  TINY_HANDLER(h, AttentionKind::kFull);
  for (const bool chat : {false, true}) {
    SCOPED_TRACE(chat ? "chat" : "completions");
    const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
    json req = {{"max_tokens", 6}, {"temperature", 0}};
    if (chat)
      req["messages"] = {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi!"}}};
    else
      req["prompt"] = "Once upon";
    const json whole = post(*h, path, req);
    req["stream"] = true;
    const auto events = run_stream(h->handle("POST", path, req.dump()));
    ASSERT_GE(events.size(), 2u);
    EXPECT_EQ(events.back(), "[DONE]");
    std::string text;
    json last;
    for (size_t i = 0; i + 1 < events.size(); ++i) {
      const json e = json::parse(events[i]);
      EXPECT_EQ(e.at("object"), chat ? "chat.completion.chunk" : "text_completion");
      const json& c = e.at("choices")[0];
      if (chat) {
        if (i == 0) {
          EXPECT_EQ(c.at("delta").at("role"), "assistant");
        }
        text += c.at("delta").value("content", "");
      } else {
        text += c.at("text").get<std::string>();
      }
      if (i + 2 < events.size()) {
        EXPECT_TRUE(c.at("finish_reason").is_null()) << events[i];
      }
      last = e;
    }
    const json& wc = whole.at("choices")[0];
    EXPECT_EQ(text, chat ? wc.at("message").at("content") : wc.at("text"));
    if (chat) {
      EXPECT_EQ(wc.at("message").at("role"), "assistant");
    }
    EXPECT_EQ(last.at("choices")[0].at("finish_reason"), wc.at("finish_reason"));
    EXPECT_EQ(last.at("usage"), whole.at("usage"));
    EXPECT_EQ(last.at("retroinfer").at("attention"), "full");
  }
}

TEST(Server, ChatUsesTheTemplate) {
  TINY_HANDLER(h, AttentionKind::kFull);
  const json a = post(*h, "/v1/chat/completions",
                      {{"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Hi"}}}}}}},
                       {"max_tokens", 2}});
  // ChatML, one byte per token: "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n" (no special
  // tokens in the byte vocabulary, so the markers are bytes too).
  const std::string rendered = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(a.at("usage").at("prompt_tokens"), static_cast<int64_t>(rendered.size()));
  EXPECT_EQ(a.at("object"), "chat.completion");
  EXPECT_EQ(a.at("id").get<std::string>().rfind("chatcmpl-", 0), 0u);
}

TEST(Server, StopStringCutsTheText) {
  TINY_HANDLER(h, AttentionKind::kFull);
  const json base = {{"prompt", "The quick brown fox"}, {"max_tokens", 16}, {"temperature", 0}};
  const std::string text = post(*h, "/v1/completions", base).at("choices")[0].at("text");
  // A stop string from the middle of the greedy output: the same run stops right before it.
  size_t k = 1;
  while (k < text.size() && (static_cast<unsigned char>(text[k]) >= 0x80 || text.find(text[k]) != k)) ++k;
  ASSERT_LT(k, text.size()) << "the greedy output has no usable stop character: " << json(text).dump();
  json req = base;
  req["stop"] = {"\x01\x02 never", std::string(1, text[k])};
  const json a = post(*h, "/v1/completions", req);
  EXPECT_EQ(a.at("choices")[0].at("text"), text.substr(0, k)) << "stop " << json(text.substr(k, 1)).dump();
  EXPECT_EQ(a.at("choices")[0].at("finish_reason"), "stop");
  EXPECT_EQ(a.at("retroinfer").at("stop_reason"), "stop_string");
  req["stop"] = std::string(1, text[k]);  // a plain string works as well
  EXPECT_EQ(post(*h, "/v1/completions", req).at("choices")[0].at("text"), text.substr(0, k));
}

TEST(Server, ClientGoneStopsGeneration) {
  TINY_HANDLER(h, AttentionKind::kFull);
  const auto before = h->stats();
  const HttpReply r = h->handle("POST", "/v1/completions",
                                json{{"prompt", "abc"}, {"max_tokens", 200}, {"stream", true}, {"temperature", 0}}.dump());
  ASSERT_TRUE(r.stream);
  int writes = 0;
  r.stream([&](std::string_view) { return ++writes < 2; });  // the client leaves during the second chunk
  EXPECT_EQ(writes, 2);
  const auto after = h->stats();
  EXPECT_EQ(after.cancelled_streams, before.cancelled_streams + 1);
  EXPECT_EQ(after.generations, before.generations + 1);
  EXPECT_LT(after.generated_tokens - before.generated_tokens, 200);
  // The server goes on serving.
  EXPECT_EQ(h->handle("POST", "/v1/completions", json{{"prompt", "x"}, {"max_tokens", 1}}.dump()).status, 200);
}

TEST(Server, ConcurrentCompletionsMatchTheirSequentialOutputs) {
  TINY_HANDLER(h, AttentionKind::kFull);
  const json a_req = {{"prompt", "The quick brown fox"}, {"max_tokens", 48}, {"temperature", 0}};
  const json b_req = {{"prompt", "Once upon a time, far away"}, {"max_tokens", 32}, {"temperature", 0.7}, {"seed", 5}};
  json b_stream_req = b_req;
  b_stream_req["stream"] = true;
  const std::string a_alone = post(*h, "/v1/completions", a_req).at("choices")[0].at("text");
  const std::string b_alone = post(*h, "/v1/completions", b_req).at("choices")[0].at("text");
  // Both at once (the scheduler batches them when they overlap): a plain and a streamed one.
  std::string a_text, b_text;
  int a_status = 0;
  std::thread ta([&] {
    const HttpReply r = h->handle("POST", "/v1/completions", a_req.dump());
    a_status = r.status;
    a_text = json::parse(r.body).at("choices")[0].at("text");
  });
  std::thread tb([&] {
    const HttpReply r = h->handle("POST", "/v1/completions", b_stream_req.dump());
    std::string body;
    if (r.stream) r.stream([&](std::string_view c) {
      body += c;
      return true;
    });
    for (const std::string& e : test::sse_events(body)) {
      if (e == "[DONE]") continue;
      const json j = json::parse(e);
      if (j.contains("choices") && !j.at("choices").empty()) b_text += j.at("choices")[0].value("text", "");
    }
  });
  ta.join();
  tb.join();
  EXPECT_EQ(a_status, 200);
  EXPECT_EQ(a_text, a_alone);
  EXPECT_EQ(b_text, b_alone);
  std::printf("[server] concurrent completions: most sequences in one decode step so far %d\n",
              h->stats().max_batch_seen);
}

TEST(Server, BadRequestsAre400) {
  TINY_HANDLER(h, AttentionKind::kFull);
  auto completion = [&](const std::string& body) { return h->handle("POST", "/v1/completions", body); };
  auto chat = [&](const json& body) { return h->handle("POST", "/v1/chat/completions", body.dump()); };
  expect_error(completion("{\"prompt\": \"abc\""), 400, "", "not valid JSON");
  expect_error(completion(""), 400, "", "not valid JSON");
  expect_error(completion("{\"prompt\": \"a\xff\xfe b\"}"), 400, "", "UTF-8");
  expect_error(completion("{\"prompt\": \"\xc0\xaf\"}"), 400, "", "UTF-8");  // an overlong '/'
  expect_error(completion("[1, 2]"), 400, "", "JSON object");
  expect_error(completion("{}"), 400, "prompt", "required");
  expect_error(completion("{\"prompt\": 5}"), 400, "prompt", "string");
  expect_error(completion("{\"prompt\": [\"a\", \"b\"]}"), 400, "prompt");
  expect_error(completion("{\"prompt\": \"\"}"), 400, "prompt", "no tokens");
  expect_error(completion("{\"prompt\": \"a\", \"max_tokens\": -3}"), 400, "max_tokens", "-3");
  expect_error(completion("{\"prompt\": \"a\", \"max_tokens\": 0}"), 400, "max_tokens");
  expect_error(completion("{\"prompt\": \"a\", \"max_tokens\": 2.5}"), 400, "max_tokens", "integer");
  expect_error(completion("{\"prompt\": \"a\", \"max_tokens\": \"10\"}"), 400, "max_tokens", "integer");
  expect_error(completion("{\"prompt\": \"a\", \"max_tokens\": 100000000000}"), 400, "max_tokens", "512");
  expect_error(completion("{\"prompt\": \"a\", \"max_tokens\": 18446744073709551615}"), 400, "max_tokens");
  expect_error(completion("{\"prompt\": \"a\", \"temperature\": \"hot\"}"), 400, "temperature", "number");
  expect_error(completion("{\"prompt\": \"a\", \"temperature\": 2.5}"), 400, "temperature");
  expect_error(completion("{\"prompt\": \"a\", \"top_p\": 0}"), 400, "top_p");
  expect_error(completion("{\"prompt\": \"a\", \"seed\": 1.5}"), 400, "seed");
  expect_error(completion("{\"prompt\": \"a\", \"n\": 9}"), 400, "n", "--max-batch");  // the fixture's 8
  expect_error(completion("{\"prompt\": \"a\", \"n\": 0}"), 400, "n");
  expect_error(completion("{\"prompt\": \"a\", \"stream\": \"yes\"}"), 400, "stream", "boolean");
  expect_error(completion("{\"prompt\": \"a\", \"stop\": 7}"), 400, "stop");
  expect_error(completion("{\"prompt\": \"a\", \"stop\": [\"x\", 1]}"), 400, "stop[1]");
  expect_error(completion("{\"prompt\": \"a\", \"stop\": [\"a\",\"b\",\"c\",\"d\",\"e\"]}"), 400, "stop", "at most 4");
  expect_error(completion("{\"prompt\": \"a\", \"max_completion_tokens\": -1}"), 400, "max_completion_tokens");
  EXPECT_EQ(json::parse(completion("{\"prompt\": \"a\", \"max_completion_tokens\": 1}").body)
                .at("usage").at("completion_tokens"), 1);
  // Null means "default": accepted.
  EXPECT_EQ(completion("{\"prompt\": \"a\", \"max_tokens\": 1, \"stop\": null, \"n\": 1, \"seed\": null}").status, 200);

  // The context (512 tokens): the prompt alone, and prompt + max_tokens, with both numbers in the message.
  expect_error(completion(json{{"prompt", std::string(600, 'a')}}.dump()), 400, "prompt", "600 tokens");
  expect_error(completion(json{{"prompt", std::string(512, 'a')}}.dump()), 400, "prompt", "512");
  expect_error(completion(json{{"prompt", std::string(500, 'a')}, {"max_tokens", 20}}.dump()), 400, "max_tokens",
               "at most 12");
  const HttpReply fits = completion(json{{"prompt", std::string(500, 'a')}, {"max_tokens", 12}}.dump());
  EXPECT_EQ(fits.status, 200) << fits.body;

  expect_error(chat(json::object()), 400, "messages", "required");
  expect_error(chat({{"messages", json::array()}}), 400, "messages");
  expect_error(chat({{"messages", "hi"}}), 400, "messages");
  expect_error(chat({{"messages", {5}}}), 400, "messages[0]");
  expect_error(chat({{"messages", {{{"content", "hi"}}}}}), 400, "messages[0].role", "required");
  expect_error(chat({{"messages", {{{"role", "user"}, {"content", "hi"}}, {{"role", "tool"}, {"content", "x"}}}}}), 400,
               "messages[1].role", "tool");
  expect_error(chat({{"messages", {{{"role", 3}, {"content", "hi"}}}}}), 400, "messages[0].role", "string");
  expect_error(chat({{"messages", {{{"role", "user"}}}}}), 400, "messages[0].content", "required");
  expect_error(chat({{"messages", {{{"role", "user"}, {"content", 5}}}}}), 400, "messages[0].content");
  expect_error(chat({{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}}), 400,
               "messages[0].content[0]", "only text");
  expect_error(chat({{"messages", {{{"role", "user"}, {"content", std::string(600, 'a')}}}}}), 400, "messages",
               "512");
}

TEST(Server, ChatWithoutATemplateIs400) {
  const Model* m = test::server_tiny_model();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  const EngineModel engine(*m);
  const auto tok = test::byte_tokenizer();
  tok->set_chat_format(ChatFormat::kNone);
  ServerHandler h(engine, *tok, {});
  expect_error(h.handle("POST", "/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}}.dump()),
               400, "messages", "/v1/completions");
}

TEST(Server, Utf8Validation) {
  EXPECT_TRUE(server::is_valid_utf8(""));
  EXPECT_TRUE(server::is_valid_utf8("plain ascii"));
  EXPECT_TRUE(server::is_valid_utf8("h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80"));  // é € 😀
  EXPECT_FALSE(server::is_valid_utf8("\x80"));                                      // lone continuation
  EXPECT_FALSE(server::is_valid_utf8("\xc3"));                                      // truncated
  EXPECT_FALSE(server::is_valid_utf8("\xe0\x80\xaf"));                              // overlong
  EXPECT_FALSE(server::is_valid_utf8("\xed\xa0\x80"));                              // surrogate U+D800
  EXPECT_FALSE(server::is_valid_utf8("\xf4\x90\x80\x80"));                          // above U+10FFFF
  EXPECT_FALSE(server::is_valid_utf8("\xff"));
}

}  // namespace
}  // namespace retroinfer

namespace retroinfer {
namespace {

TEST(Server, NegativePrefillStepIsRefused) {
  const Model* m = test::server_tiny_model();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  const EngineModel engine(*m);
  const auto tok = test::byte_tokenizer();
  server::ServerOptions o;
  o.prefill_step_tokens = -5;
  EXPECT_NE(test::error_of([&] { server::ServerHandler h(engine, *tok, o); }).find("--prefill-step"),
            std::string::npos);
}

}  // namespace
}  // namespace retroinfer
