// Faults injected on demand (retroinfer/fault_injection.h): the registry's counting, and what a failure at
// each CPU point gives — the KV cache growth failing (host memory exhausted mid-session) and a decode step
// failing — through the server: that request alone fails with a 500 / an error event, its session is released
// and the next request is served as if nothing happened. The CUDA points (device and pinned host allocations,
// the CUDA decode step) are tested in tests/gpu (label gpu).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "retroinfer/error.h"
#include "retroinfer/fault_injection.h"
#include "retroinfer/kv_cache.h"
#include "server/server_handler.h"
#include "test_server_util.h"

namespace retroinfer {
namespace {

using fault::Point;
using nlohmann::json;

#define TINY_HANDLER(h)                                                             \
  server::ServerHandler* h = test::tiny_handler(AttentionKind::kFull);             \
  if (!h) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found"

// Disarms every point after each test, also when an assertion failed half-way.
class FaultInjection : public ::testing::Test {
 protected:
  void TearDown() override { fault::disarm_all(); }
};

TEST_F(FaultInjection, SkipTimesFiredAndPasses) {
  EXPECT_FALSE(fault::should_fail(Point::kDecodeStep));  // disarmed: never fails
  fault::arm(Point::kDecodeStep, /*skip=*/2, /*times=*/2);
  std::vector<bool> got;
  for (int i = 0; i < 6; ++i) got.push_back(fault::should_fail(Point::kDecodeStep));
  EXPECT_EQ(got, (std::vector<bool>{false, false, true, true, false, false}));
  EXPECT_EQ(fault::fired(Point::kDecodeStep), 2);
  EXPECT_EQ(fault::passes(Point::kDecodeStep), 6);
  EXPECT_FALSE(fault::should_fail(Point::kHostKvAppend));  // another point is not affected
  fault::disarm(Point::kDecodeStep);
  EXPECT_FALSE(fault::should_fail(Point::kDecodeStep));
  {
    fault::ScopedFault f(Point::kDeviceAlloc, 0, -1);  // every pass until disarmed
    for (int i = 0; i < 5; ++i) EXPECT_TRUE(fault::should_fail(Point::kDeviceAlloc));
    EXPECT_EQ(f.fired(), 5);
  }
  EXPECT_FALSE(fault::should_fail(Point::kDeviceAlloc));
  EXPECT_THROW(fault::arm(Point::kDecodeStep, -1), Error);
  EXPECT_EQ(fault::point_name(Point::kPinnedHostAlloc), "pinned_host_alloc");
}

TEST_F(FaultInjection, KvCacheAppendFailsCleanly) {
  KvCache kv(2, 4, DType::kF32);
  const std::vector<float> k(2 * 4 * 3, 1.0f), v(2 * 4 * 3, 2.0f);  // [3 tokens, 2 heads, 4]
  kv.append(k.data(), v.data(), 3);
  fault::ScopedFault f(Point::kHostKvAppend);
  try {
    kv.append(k.data(), v.data(), 3);
    ADD_FAILURE() << "the injected failure did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of host memory"), std::string::npos) << e.what();
  }
  EXPECT_EQ(kv.size(), 3);  // nothing half-appended
  kv.append(k.data(), v.data(), 3);  // fired once: the next append works
  EXPECT_EQ(kv.size(), 6);
}

json completion(server::ServerHandler& h, int expect_status, bool stream = false) {
  const json req = {{"prompt", "Faults are injected here."}, {"max_tokens", 6}, {"temperature", 0}, {"stream", stream}};
  const server::HttpReply r = h.handle("POST", "/v1/completions", req.dump());
  EXPECT_EQ(r.status, expect_status) << r.body;
  return r.stream ? json() : json::parse(r.body);
}

// The SSE body of a streamed completion.
std::string stream_body(server::ServerHandler& h) {
  const json req = {{"prompt", "Faults are injected here."}, {"max_tokens", 6}, {"temperature", 0}, {"stream", true}};
  const server::HttpReply r = h.handle("POST", "/v1/completions", req.dump());
  EXPECT_EQ(r.status, 200) << r.body;
  std::string body;
  if (r.stream) r.stream([&](std::string_view c) {
      body += c;
      return true;
    });
  return body;
}

void expect_generation_failed(const json& reply, const std::string& what) {
  ASSERT_TRUE(reply.contains("error")) << reply.dump();
  EXPECT_EQ(reply.at("error").at("type"), "server_error");
  EXPECT_EQ(reply.at("error").at("code"), "generation_failed");
  const std::string m = reply.at("error").at("message").get<std::string>();
  EXPECT_NE(m.find(what), std::string::npos) << m;
}

// Host memory exhausted in the middle of a generation (the last KV append of the request): that request gets
// a 500 naming the failure; the next one is served and equals the reference.
TEST_F(FaultInjection, HostMemoryExhaustedMidSessionFailsThatRequestOnly) {
  TINY_HANDLER(h);
  const json ref = completion(*h, 200);
  fault::arm(Point::kHostKvAppend, 0, 0);  // count the request's appends, fail none
  EXPECT_EQ(completion(*h, 200).at("choices")[0].at("text"), ref.at("choices")[0].at("text"));
  const int64_t appends = fault::passes(Point::kHostKvAppend);
  ASSERT_GT(appends, 2);
  fault::arm(Point::kHostKvAppend, appends - 1, 1);  // fails the last append: after prefill, while decoding
  expect_generation_failed(completion(*h, 500), "out of host memory");
  EXPECT_EQ(fault::fired(Point::kHostKvAppend), 1);
  const json after = completion(*h, 200);
  EXPECT_EQ(after.at("choices")[0].at("text"), ref.at("choices")[0].at("text"));
}

// A decode step failing on the third step: a 500 for a plain request, an error event then [DONE] for a
// stream (after the tokens already sent); the server goes on serving.
TEST_F(FaultInjection, DecodeStepFailureIsAnErrorOfThatRequest) {
  TINY_HANDLER(h);
  const json ref = completion(*h, 200);
  fault::arm(Point::kDecodeStep, /*skip=*/2, /*times=*/1);
  expect_generation_failed(completion(*h, 500), "injected fault decode_step");
  EXPECT_EQ(completion(*h, 200).at("choices")[0].at("text"), ref.at("choices")[0].at("text"));

  fault::arm(Point::kDecodeStep, 2, 1);
  const std::vector<std::string> events = test::sse_events(stream_body(*h));
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json err = json::parse(events[events.size() - 2]);
  expect_generation_failed(err, "injected fault decode_step");
  EXPECT_EQ(fault::fired(Point::kDecodeStep), 1);
  EXPECT_EQ(completion(*h, 200).at("choices")[0].at("text"), ref.at("choices")[0].at("text"));
}

}  // namespace
}  // namespace retroinfer
