// The OpenAI request parameters of `retroinfer serve` beyond the basics, each against its definition, on
// the tiny model fixture (byte tokenizer: token id = byte value; 256 = <|end|>; ids 257..511 have no text):
// logprobs, penalties, logit_bias, stop_token_ids, n, stream_options.include_usage, response_format
// json_object, the refusal of unsupported fields, and unknown model names.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "engine/json_constraint.h"
#include "server/server_handler.h"
#include "test_server_util.h"

namespace retroinfer {
namespace {

using nlohmann::json;
using server::HttpReply;
using server::ServerHandler;

#define TINY_HANDLER(h)                                                   \
  ServerHandler* h = test::tiny_handler(AttentionKind::kFull);            \
  if (!h) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found"

json post(ServerHandler& h, const std::string& path, const json& body) {
  const HttpReply r = h.handle("POST", path, body.dump());
  EXPECT_EQ(r.status, 200) << body.dump() << " -> " << r.body;
  EXPECT_FALSE(r.stream);
  return r.status == 200 ? json::parse(r.body) : json::object();
}

// The events of a streamed request, parsed ([DONE] last, as a string).
std::vector<json> stream(ServerHandler& h, const std::string& path, json body) {
  body["stream"] = true;
  const HttpReply r = h.handle("POST", path, body.dump());
  EXPECT_EQ(r.status, 200) << r.body;
  std::vector<json> out;
  if (!r.stream) return out;
  std::string all;
  r.stream([&](std::string_view c) {
    all += c;
    return true;
  });
  for (const std::string& e : test::sse_events(all)) out.push_back(e == "[DONE]" ? json(e) : json::parse(e));
  return out;
}

// The id of a token from its name (the byte tokenizer: one byte per token): the byte itself,
// "bytes:\\xNN" (not valid UTF-8 alone) or "token_id:N" (ids past the tokenizer's 257).
int token_id(const std::string& name) {
  if (name.size() == 1) return static_cast<uint8_t>(name[0]);
  if (name.rfind("token_id:", 0) == 0) return std::stoi(name.substr(9));
  EXPECT_EQ(name.rfind("bytes:\\x", 0), 0u) << name;
  return name.size() == 10 ? std::stoi(name.substr(8), nullptr, 16) : -1;
}

void expect_error(const HttpReply& r, int status, const std::string& param, const std::string& part = "") {
  EXPECT_EQ(r.status, status) << r.body;
  const json e = json::parse(r.body).at("error");
  EXPECT_EQ(e.at("param"), param) << r.body;
  if (!part.empty()) {
    EXPECT_NE(e.at("message").get<std::string>().find(part), std::string::npos) << r.body;
  }
}

TEST(ServerParams, CompletionLogprobs) {
  TINY_HANDLER(h);
  const json req = {{"prompt", "Hello there"}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 3},
                    {"ignore_eos", true}};
  const json a = post(*h, "/v1/completions", req);
  const json& lp = a.at("choices")[0].at("logprobs");
  ASSERT_EQ(lp.at("tokens").size(), 6u);
  size_t offset = 0;
  for (size_t i = 0; i < 6; ++i) {
    const float sampled = lp.at("token_logprobs")[i].get<float>();
    EXPECT_LE(sampled, 0.0f);
    const json& top = lp.at("top_logprobs")[i];
    ASSERT_EQ(top.size(), 3u);
    double mass = 0.0, best = -1e9;
    for (const auto& [tok, v] : top.items()) {
      mass += std::exp(v.get<double>());
      best = std::max(best, v.get<double>());
    }
    EXPECT_LE(mass, 1.0 + 1e-6);
    // Greedy: the sampled token is the most likely one, so it heads the list.
    EXPECT_TRUE(top.contains(lp.at("tokens")[i].get<std::string>())) << top.dump();
    EXPECT_NEAR(sampled, best, 1e-6);
    EXPECT_EQ(lp.at("text_offset")[i], offset);
    const int id = token_id(lp.at("tokens")[i]);
    EXPECT_GE(id, 0);
    offset += id < 256 ? 1 : 0;  // a byte, or no text
  }
  // The log-probabilities do not depend on the temperature (they are taken before it).
  json hot = req;
  hot["temperature"] = 1.5;
  hot["seed"] = 3;
  const json b = post(*h, "/v1/completions", hot);
  const json& lpb = b.at("choices")[0].at("logprobs");
  EXPECT_EQ(lpb.at("top_logprobs")[0], lp.at("top_logprobs")[0]);  // the same prompt: the same first distribution
  const std::string tok0 = lpb.at("tokens")[0];
  if (lpb.at("top_logprobs")[0].contains(tok0)) {
    EXPECT_NEAR(lpb.at("token_logprobs")[0].get<double>(), lpb.at("top_logprobs")[0].at(tok0).get<double>(), 1e-6);
  }
  EXPECT_TRUE(post(*h, "/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 2}}).at("choices")[0].at("logprobs").is_null());
}

TEST(ServerParams, ChatLogprobsStreamEqualsNonStream) {
  TINY_HANDLER(h);
  const json req = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 8}, {"temperature", 0.8},
                    {"seed", 5}, {"logprobs", true}, {"top_logprobs", 2}};
  const json a = post(*h, "/v1/chat/completions", req);
  const json& content = a.at("choices")[0].at("logprobs").at("content");
  ASSERT_GE(content.size(), 1u);
  for (const json& t : content) {
    EXPECT_LE(t.at("logprob").get<double>(), 0.0);
    EXPECT_EQ(t.at("top_logprobs").size(), 2u);
    double mass = 0;
    for (const json& x : t.at("top_logprobs")) mass += std::exp(x.at("logprob").get<double>());
    EXPECT_LE(mass, 1.0 + 1e-6);
    const int id = token_id(t.at("token"));
    EXPECT_EQ(t.at("bytes").size(), id < 256 ? 1u : 0u) << t.dump();  // a byte, or no text
    if (id < 256) {
      EXPECT_EQ(t.at("bytes")[0].get<int>(), id);
    }
  }
  json streamed = json::array();
  for (const json& e : stream(*h, "/v1/chat/completions", req)) {
    if (!e.is_object() || e.at("choices").empty()) continue;
    const json& c = e.at("choices")[0];
    if (c.contains("logprobs") && c.at("logprobs").is_object())
      for (const json& t : c.at("logprobs").at("content")) streamed.push_back(t);
  }
  EXPECT_EQ(streamed, content);
  // logprobs: false (or absent) gives null; top_logprobs without logprobs is refused.
  json off = req;
  off["logprobs"] = false;
  off.erase("top_logprobs");
  EXPECT_TRUE(post(*h, "/v1/chat/completions", off).at("choices")[0].at("logprobs").is_null());
}

TEST(ServerParams, LogitBiasBansAndForces) {
  TINY_HANDLER(h);
  const json base = {{"prompt", "Hello there"}, {"max_tokens", 4}, {"temperature", 0}, {"ignore_eos", true},
                     {"logprobs", 0}};
  const json a = post(*h, "/v1/completions", base);
  const std::string first = a.at("choices")[0].at("logprobs").at("tokens")[0];
  json ban = base;
  ban["logit_bias"] = {{std::to_string(token_id(first)), -100}};
  const json b = post(*h, "/v1/completions", ban);
  for (const json& t : b.at("choices")[0].at("logprobs").at("tokens")) EXPECT_NE(t, first);
  json force = base;
  force["temperature"] = 1.0;
  force["logit_bias"] = {{"65", 100}};  // 'A'
  EXPECT_EQ(post(*h, "/v1/completions", force).at("choices")[0].at("text"), "AAAA");
  // stop_token_ids: the forced 'A' ends the generation at once (not in the text, finish_reason stop), even
  // with ignore_eos.
  force["stop_token_ids"] = {65};
  const json s = post(*h, "/v1/completions", force);
  EXPECT_EQ(s.at("choices")[0].at("text"), "");
  EXPECT_EQ(s.at("choices")[0].at("finish_reason"), "stop");
  EXPECT_EQ(s.at("usage").at("completion_tokens"), 1);
}

TEST(ServerParams, PenaltiesChangeGreedyRepeats) {
  TINY_HANDLER(h);
  // Greedy with a strong frequency penalty: no byte repeats more often than the penalty allows to win.
  const json base = {{"prompt", "aaaa"}, {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}};
  const std::string plain = post(*h, "/v1/completions", base).at("choices")[0].at("text");
  json pen = base;
  pen["presence_penalty"] = 2.0;
  pen["frequency_penalty"] = 2.0;
  pen["repetition_penalty"] = 1.3;
  const json r = post(*h, "/v1/completions", pen);
  EXPECT_EQ(r.at("usage").at("completion_tokens"), 24);
  std::set<char> distinct_plain(plain.begin(), plain.end());
  const std::string text = r.at("choices")[0].at("text");
  std::set<char> distinct(text.begin(), text.end());
  EXPECT_GE(distinct.size(), distinct_plain.size()) << "'" << plain << "' vs '" << text << "'";
}

TEST(ServerParams, NChoicesAndIncludeUsage) {
  TINY_HANDLER(h);
  const json req = {{"prompt", "Once"}, {"max_tokens", 5}, {"temperature", 1.0}, {"seed", 9}, {"n", 3}};
  const json a = post(*h, "/v1/completions", req);
  ASSERT_EQ(a.at("choices").size(), 3u);
  int64_t generated = 0;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a.at("choices")[i].at("index"), i);
  // Choice i samples with seed + i: choice 1 of seed 9 is choice 0 of seed 10.
  json one = req;
  one["n"] = 1;
  one["seed"] = 10;
  EXPECT_EQ(post(*h, "/v1/completions", one).at("choices")[0].at("text"), a.at("choices")[1].at("text"));
  for (const json& c : a.at("choices")) generated += static_cast<int64_t>(c.at("text").get<std::string>().size());
  EXPECT_EQ(a.at("usage").at("prompt_tokens"), 4);
  EXPECT_GE(a.at("usage").at("completion_tokens").get<int64_t>(), 3);
  // Streamed with include_usage: every chunk has usage null but the last one, whose choices are empty.
  json s = req;
  s["stream_options"] = {{"include_usage", true}};
  const std::vector<json> ev = stream(*h, "/v1/completions", s);
  ASSERT_GE(ev.size(), 3u);
  EXPECT_EQ(ev.back(), json("[DONE]"));
  const json& usage_chunk = ev[ev.size() - 2];
  EXPECT_TRUE(usage_chunk.at("choices").empty());
  EXPECT_EQ(usage_chunk.at("usage"), a.at("usage"));
  std::string texts[3];
  for (size_t k = 0; k + 2 < ev.size(); ++k) {
    EXPECT_TRUE(ev[k].at("usage").is_null()) << ev[k].dump();
    const json& c = ev[k].at("choices")[0];
    texts[c.at("index").get<int>()] += c.at("text").get<std::string>();
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(texts[i], a.at("choices")[i].at("text")) << "choice " << i;
}

TEST(ServerParams, JsonObjectModeAlwaysParses) {
  TINY_HANDLER(h);
  int completed = 0;
  for (int seed = 0; seed < 6; ++seed) {
    // Random weights: closing bytes get a bias, as a real model's JSON would close.
    const json req = {{"messages", {{{"role", "user"}, {"content", "Give me JSON"}}}},
                      {"max_tokens", seed == 5 ? 3 : 160},
                      {"temperature", 1.0},
                      {"seed", seed},
                      {"response_format", {{"type", "json_object"}}},
                      {"logit_bias", {{"34", 4}, {"125", 4}, {"93", 3}, {"44", 2}}}};
    const json a = post(*h, "/v1/chat/completions", req);
    const json& c = a.at("choices")[0];
    const std::string text = c.at("message").at("content");
    JsonPrefixState st;
    EXPECT_TRUE(st.feed(text)) << "seed " << seed << ": " << text;
    if (c.at("finish_reason") == "stop") {
      ++completed;
      EXPECT_EQ(a.at("retroinfer").at("stop_reason"), "constraint_complete");
      json parsed;
      ASSERT_NO_THROW(parsed = json::parse(text)) << "seed " << seed << ": " << text;
      EXPECT_TRUE(parsed.is_object());
    } else {
      // max_tokens cut it: finish_reason length, the text a JSON prefix (not parseable in general).
      EXPECT_EQ(c.at("finish_reason"), "length");
    }
  }
  EXPECT_GE(completed, 3);
  expect_error(h->handle("POST", "/v1/chat/completions",
                         json{{"messages", {{{"role", "user"}, {"content", "x"}}}},
                              {"response_format", {{"type", "json_schema"}, {"json_schema", json::object()}}}}
                             .dump()),
               400, "response_format", "json_schema");
}

TEST(ServerParams, UnsupportedFieldsAre400NamingThem) {
  TINY_HANDLER(h);
  auto completion = [&](json extra) {
    json body = {{"prompt", "a"}, {"max_tokens", 1}};
    body.update(extra);
    return h->handle("POST", "/v1/completions", body.dump());
  };
  auto chat = [&](json extra) {
    json body = {{"messages", {{{"role", "user"}, {"content", "a"}}}}, {"max_tokens", 1}};
    body.update(extra);
    return h->handle("POST", "/v1/chat/completions", body.dump());
  };
  expect_error(chat({{"tools", {{{"type", "function"}}}}}), 400, "tools", "not supported");
  expect_error(chat({{"tool_choice", "auto"}}), 400, "tool_choice");
  expect_error(chat({{"functions", {json::object()}}}), 400, "functions");
  expect_error(chat({{"audio", json::object()}}), 400, "audio");
  expect_error(chat({{"reasoning_effort", "low"}}), 400, "reasoning_effort");
  expect_error(chat({{"frobnicate", 1}}), 400, "frobnicate");
  expect_error(completion({{"echo", true}}), 400, "echo");
  expect_error(completion({{"best_of", 2}}), 400, "best_of");
  expect_error(completion({{"suffix", "x"}}), 400, "suffix");
  expect_error(completion({{"top_logprobs", 2}}), 400, "top_logprobs");
  expect_error(completion({{"logprobs", 6}}), 400, "logprobs");
  expect_error(chat({{"logprobs", true}, {"top_logprobs", 21}}), 400, "top_logprobs");
  expect_error(chat({{"top_logprobs", 2}}), 400, "top_logprobs", "logprobs");
  expect_error(completion({{"presence_penalty", 2.5}}), 400, "presence_penalty", "[-2, 2]");
  expect_error(completion({{"frequency_penalty", -3}}), 400, "frequency_penalty");
  expect_error(completion({{"repetition_penalty", 0}}), 400, "repetition_penalty");
  expect_error(completion({{"logit_bias", {{"abc", 1}}}}), 400, "logit_bias");
  expect_error(completion({{"logit_bias", {{"5", 101}}}}), 400, "logit_bias");
  expect_error(completion({{"logit_bias", {{"512", 1}}}}), 400, "logit_bias", "512");
  expect_error(completion({{"stop_token_ids", {600}}}), 400, "stop_token_ids");
  expect_error(completion({{"stream_options", {{"include_usage", true}}}}), 400, "stream_options", "stream");
  expect_error(completion({{"stream", true}, {"stream_options", {{"bogus", 1}}}}), 400, "stream_options.bogus");
  expect_error(chat({{"response_format", {{"type", "yaml"}}}}), 400, "response_format");
  // Accepted: fields without an effect on the output, and the neutral values of unsupported ones.
  for (const json& ok : {json{{"user", "u1"}}, json{{"echo", false}}, json{{"best_of", 1}}, json{{"suffix", nullptr}},
                         json{{"tools", json::array()}}, json{{"tool_choice", "none"}}})
    EXPECT_EQ(completion(ok).status, 200) << ok.dump();
  for (const json& ok : {json{{"user", "u1"}}, json{{"metadata", {{"k", "v"}}}}, json{{"tools", json::array()}},
                         json{{"tool_choice", "none"}}, json{{"response_format", {{"type", "text"}}}},
                         json{{"store", false}}, json{{"parallel_tool_calls", true}}}) {
    const HttpReply r = chat(ok);
    EXPECT_EQ(r.status, 200) << ok.dump() << " -> " << r.body;
  }
}

TEST(ServerParams, UnknownModelIs404) {
  TINY_HANDLER(h);
  const HttpReply r = h->handle("POST", "/v1/completions", json{{"prompt", "a"}, {"model", "gpt-4o"}}.dump());
  expect_error(r, 404, "model", "gpt-4o");
  EXPECT_EQ(json::parse(r.body).at("error").at("code"), "model_not_found");
  EXPECT_EQ(h->handle("GET", "/v1/models/tiny", "").status, 200);
  expect_error(h->handle("GET", "/v1/models/other", ""), 404, "model");
  EXPECT_EQ(post(*h, "/v1/completions", {{"prompt", "a"}, {"model", "tiny"}, {"max_tokens", 1}}).at("model"), "tiny");
}

}  // namespace
}  // namespace retroinfer
