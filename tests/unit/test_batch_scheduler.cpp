// BatchScheduler (continuous batching) on the tiny model fixture: each request's tokens equal what
// generate() gives it alone, requests join mid-flight, cancellation, per-request errors, max_batch,
// shutdown. Skips when the fixture is absent.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "retroinfer/batch_scheduler.h"
#include "retroinfer/error.h"
#include "retroinfer/generate.h"

#include "tiny_model_util.h"

#include "error_of.h"

namespace retroinfer {
namespace {


const EngineModel* tiny_engine() {
  const Model* m = test::tiny_llama3();
  static const std::unique_ptr<EngineModel> e = m ? std::make_unique<EngineModel>(*m) : nullptr;
  return e.get();
}

#define TINY_ENGINE(e)           \
  const EngineModel* e = tiny_engine(); \
  if (!e) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found"

BatchSchedulerOptions sched_options(int max_batch, AttentionKind kind = AttentionKind::kRetro) {
  BatchSchedulerOptions o;
  o.max_batch = max_batch;
  o.session.attention.kind = kind;
  o.session.attention.window_tokens = 16;  // a steady zone under the prompts: retro does select clusters
  o.session.prefill_chunk = 32;
  return o;
}

GenerateOptions gen_options(int max_new_tokens, float temperature = 0.0f, uint64_t seed = 0) {
  GenerateOptions g;
  g.max_new_tokens = max_new_tokens;
  g.sampler.temperature = temperature;
  g.sampler.seed = seed;
  g.ignore_eos = true;  // the random fixture may sample its EOS id anywhere: fixed lengths are clearer
  return g;
}

BatchRequest request(std::vector<int32_t> prompt, GenerateOptions g, GenerateCallbacks cb = {}) {
  BatchRequest r;
  r.prompt = std::move(prompt);
  r.options = std::move(g);
  r.callbacks = std::move(cb);
  return r;
}

TEST(BatchScheduler, ConcurrentRequestsGiveTheirAloneTokens) {
  TINY_ENGINE(e);
  const BatchSchedulerOptions so = sched_options(4);
  const std::vector<int> prompt_len = {20, 45, 80, 33};
  const std::vector<int> max_tokens = {12, 5, 20, 9};
  std::vector<std::vector<int32_t>> prompts;
  std::vector<GenerateOptions> gens;
  for (size_t i = 0; i < prompt_len.size(); ++i) {
    prompts.push_back(test::token_stream(prompt_len[i], 100 + static_cast<uint32_t>(i)));
    // Request 3 samples (temperature, its own seed): each request keeps its own Sampler.
    gens.push_back(gen_options(max_tokens[i], i == 3 ? 0.8f : 0.0f, 42));
  }
  std::vector<std::vector<int32_t>> streamed(prompts.size());
  std::vector<BatchHandle> handles;
  {
    BatchScheduler sched(*e, so);
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerateCallbacks cb;
      cb.on_token = [&streamed, i](int32_t t, std::string_view) {
        streamed[i].push_back(t);
        return true;
      };
      handles.push_back(sched.submit(request(prompts[i], gens[i], cb)));
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      const GenerateSummary got = handles[i].result.get();
      const GenerateSummary want = generate(*e, so.session, prompts[i], gens[i]);
      EXPECT_EQ(got.tokens, want.tokens) << "request " << i;
      EXPECT_EQ(got.stop_reason, StopReason::kMaxTokens) << "request " << i;
      EXPECT_EQ(got.prompt_tokens, prompt_len[i]);
      EXPECT_EQ(got.decode_steps, want.decode_steps);
      EXPECT_EQ(got.exact_tokens, want.exact_tokens) << "request " << i << ": the same attention reads";
      EXPECT_EQ(streamed[i], got.tokens) << "request " << i;
    }
    const BatchScheduler::Stats st = sched.stats();
    EXPECT_EQ(st.submitted, 4);
    EXPECT_EQ(st.completed, 4);
    EXPECT_EQ(st.failed, 0);
    EXPECT_LE(st.max_running, 4);
    EXPECT_GE(st.max_running, 2) << "no step decoded two sequences at once";
    std::printf("[batch_scheduler] 4 requests: %lld steps, %lld tokens, max batch %d\n",
                static_cast<long long>(st.decode_steps), static_cast<long long>(st.decoded_tokens),
                st.max_running);
  }
}

TEST(BatchScheduler, LateRequestJoinsMidFlight) {
  TINY_ENGINE(e);
  const BatchSchedulerOptions so = sched_options(4, AttentionKind::kFull);
  BatchScheduler sched(*e, so);
  std::atomic<int> clock{0};  // orders token events across requests
  std::promise<void> a_at_5, b_submitted;
  std::shared_future<void> b_in = b_submitted.get_future().share();
  int a_count = 0, a_last = -1, b_first = -1;
  GenerateCallbacks ca;
  ca.on_token = [&](int32_t, std::string_view) {
    a_last = clock.fetch_add(1);
    if (++a_count == 5) {
      a_at_5.set_value();
      b_in.wait();  // holds the worker until B is queued: B must then join while A still has 25 tokens to go
    }
    return true;
  };
  GenerateCallbacks cbb;
  cbb.on_token = [&](int32_t, std::string_view) {
    if (b_first < 0) b_first = clock.fetch_add(1);
    return true;
  };
  const auto pa = test::token_stream(30, 1), pb = test::token_stream(50, 2);
  BatchHandle a = sched.submit(request(pa, gen_options(30), ca));
  a_at_5.get_future().wait();
  BatchHandle b = sched.submit(request(pb, gen_options(6), cbb));
  b_submitted.set_value();
  const GenerateSummary sa = a.result.get(), sb = b.result.get();
  ASSERT_GE(b_first, 0);
  EXPECT_LT(b_first, a_last) << "B started only after A had finished";
  EXPECT_EQ(sa.tokens, generate(*e, so.session, pa, gen_options(30)).tokens);
  EXPECT_EQ(sb.tokens, generate(*e, so.session, pb, gen_options(6)).tokens);
}

TEST(BatchScheduler, CancelAndCallbackStop) {
  TINY_ENGINE(e);
  BatchScheduler sched(*e, sched_options(2, AttentionKind::kFull));
  std::promise<void> at_3, cancelled;
  std::shared_future<void> cancel_done = cancelled.get_future().share();
  int n = 0;
  GenerateCallbacks ca;
  ca.on_token = [&](int32_t, std::string_view) {
    if (++n == 3) {
      at_3.set_value();
      cancel_done.wait();  // the cancel lands before the next iteration
    }
    return true;
  };
  BatchHandle a = sched.submit(request(test::token_stream(20, 5), gen_options(100), ca));
  // A callback that returns false stops its own request after its 4th token.
  int m = 0;
  GenerateCallbacks cb;
  cb.on_token = [&](int32_t, std::string_view) { return ++m < 4; };
  BatchHandle b = sched.submit(request(test::token_stream(25, 6), gen_options(100), cb));
  at_3.get_future().wait();
  a.cancel();
  cancelled.set_value();
  const GenerateSummary sa = a.result.get();
  EXPECT_EQ(sa.stop_reason, StopReason::kCallback);
  EXPECT_EQ(sa.tokens.size(), 3u);
  const GenerateSummary sb = b.result.get();
  EXPECT_EQ(sb.stop_reason, StopReason::kCallback);
  EXPECT_EQ(sb.tokens.size(), 4u);
}

TEST(BatchScheduler, CancelWhileWaitingFailsAtOnce) {
  TINY_ENGINE(e);
  BatchScheduler sched(*e, sched_options(1, AttentionKind::kFull));  // B must wait behind A
  std::promise<void> at_2, b_cancelled;
  std::shared_future<void> go = b_cancelled.get_future().share();
  int n = 0;
  bool b_done_while_a_ran = false;
  std::shared_ptr<std::atomic<bool>> b_finished = std::make_shared<std::atomic<bool>>(false);
  GenerateCallbacks ca;
  ca.on_token = [&](int32_t, std::string_view) {
    if (++n == 2) {
      at_2.set_value();
      go.wait();
    }
    if (n == 20) b_done_while_a_ran = b_finished->load();  // B left the queue while A still decoded
    return true;
  };
  BatchHandle a = sched.submit(request(test::token_stream(20, 1), gen_options(30), ca));
  BatchRequest rb = request(test::token_stream(20, 2), gen_options(5));
  rb.on_done = [b_finished] { b_finished->store(true); };
  BatchHandle b = sched.submit(std::move(rb));
  at_2.get_future().wait();
  b.cancel();
  b_cancelled.set_value();
  EXPECT_NE(test::error_of([&] { b.result.get(); }).find("cancelled before it started"), std::string::npos);
  EXPECT_EQ(a.result.get().tokens.size(), 30u);
  EXPECT_TRUE(b_done_while_a_ran);
}

TEST(BatchScheduler, ErrorsReachOnlyTheirRequest) {
  TINY_ENGINE(e);
  EXPECT_NE(test::error_of([&] { BatchScheduler s(*e, sched_options(0)); }).find("max_batch"), std::string::npos);
  BatchScheduler sched(*e, sched_options(4, AttentionKind::kFull));
  const auto good_prompt = test::token_stream(20, 9);
  BatchHandle good = sched.submit(request(good_prompt, gen_options(10)));
  // 500 prompt tokens + 100 new ones exceed the fixture's 512 positions.
  BatchHandle too_long = sched.submit(request(test::token_stream(500, 3), gen_options(100)));
  BatchHandle empty = sched.submit(request({}, gen_options(4)));
  GenerateCallbacks throwing;
  throwing.on_token = [](int32_t, std::string_view) -> bool { throw Error("callback failed on purpose"); };
  BatchHandle thrower = sched.submit(request(test::token_stream(15, 4), gen_options(8), throwing));
  EXPECT_NE(test::error_of([&] { too_long.result.get(); }).find("maximum context"), std::string::npos);
  EXPECT_NE(test::error_of([&] { empty.result.get(); }).find("empty prompt"), std::string::npos);
  EXPECT_NE(test::error_of([&] { thrower.result.get(); }).find("on purpose"), std::string::npos);
  EXPECT_EQ(good.result.get().tokens, generate(*e, sched.options().session, good_prompt, gen_options(10)).tokens);
  const BatchScheduler::Stats st = sched.stats();
  EXPECT_EQ(st.completed, 1);
  EXPECT_EQ(st.failed, 3);
}

TEST(BatchScheduler, MaxBatchIsRespected) {
  TINY_ENGINE(e);
  BatchScheduler sched(*e, sched_options(2, AttentionKind::kStreaming));
  std::atomic<int> live{0}, most{0};  // requests between their first and last token
  std::vector<BatchHandle> hs;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) {
    prompts.push_back(test::token_stream(20 + 7 * i, 50 + i));
    auto seen = std::make_shared<int>(0);
    GenerateCallbacks cb;
    cb.on_token = [&live, &most, seen](int32_t, std::string_view) {
      if ((*seen)++ == 0) most.store(std::max(most.load(), live.fetch_add(1) + 1));
      if (*seen == 12) live.fetch_sub(1);
      return true;
    };
    hs.push_back(sched.submit(request(prompts.back(), gen_options(12), cb)));
  }
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(hs[i].result.get().tokens, generate(*e, sched.options().session, prompts[i], gen_options(12)).tokens);
  EXPECT_LE(most.load(), 2);
  EXPECT_EQ(sched.stats().max_running, 2);
}

TEST(BatchScheduler, ShutdownFailsUnfinishedRequests) {
  TINY_ENGINE(e);
  auto sched = std::make_unique<BatchScheduler>(*e, sched_options(1, AttentionKind::kFull));
  std::promise<void> started, stopping;
  std::shared_future<void> stop_now = stopping.get_future().share();
  int n = 0;
  GenerateCallbacks ca;
  ca.on_token = [&](int32_t, std::string_view) {
    if (++n == 2) {
      started.set_value();
      stop_now.wait();
    }
    // After the release, ~1 ms per token: A's 198 remaining tokens outlast the main thread's shutdown call
    // by far, so A is still running (and B waiting) when the worker sees the stop.
    if (n > 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return true;
  };
  BatchHandle a = sched->submit(request(test::token_stream(20, 1), gen_options(200), ca));
  BatchHandle b = sched->submit(request(test::token_stream(20, 2), gen_options(5)));  // waits: max_batch 1
  started.get_future().wait();
  stopping.set_value();
  sched->shutdown();
  EXPECT_NE(test::error_of([&] { a.result.get(); }).find("shut down"), std::string::npos);
  EXPECT_NE(test::error_of([&] { b.result.get(); }).find("shut down"), std::string::npos);
  BatchHandle c = sched->submit(request(test::token_stream(20, 3), gen_options(5)));
  EXPECT_NE(test::error_of([&] { c.result.get(); }).find("accepts no new requests"), std::string::npos);
  sched.reset();  // the destructor after shutdown: nothing left to join
}

}  // namespace
}  // namespace retroinfer

namespace retroinfer {
namespace {

// prefill_step_tokens: a long prompt prefilled one chunk (32 tokens) per iteration while another request
// decodes; the running request gets tokens between the long prompt's parts (the order of the events on one
// clock), and both requests' tokens equal generate() alone; the prefill progress reaches the prompt length.
TEST(BatchScheduler, SteppedPrefillInterleavesWithDecode) {
  TINY_ENGINE(e);
  BatchSchedulerOptions so = sched_options(4, AttentionKind::kRetro);
  so.prefill_step_tokens = 32;
  BatchScheduler sched(*e, so);
  std::atomic<int> clock{0};
  std::promise<void> a_at_3, b_submitted;
  std::shared_future<void> b_in = b_submitted.get_future().share();
  std::vector<int> a_events, b_progress_events;
  std::vector<int64_t> b_progress;
  int b_first = -1, a_count = 0;
  GenerateCallbacks ca;
  ca.on_token = [&](int32_t, std::string_view) {
    a_events.push_back(clock.fetch_add(1));
    if (++a_count == 3) {
      a_at_3.set_value();
      b_in.wait();  // B is queued before A's next step
    }
    return true;
  };
  GenerateCallbacks cb;
  cb.on_prefill = [&](int64_t done, int64_t total) {
    EXPECT_EQ(total, 300);
    b_progress.push_back(done);
    b_progress_events.push_back(clock.fetch_add(1));
  };
  cb.on_token = [&](int32_t, std::string_view) {
    if (b_first < 0) b_first = clock.fetch_add(1);
    return true;
  };
  const auto pa = test::token_stream(20, 31), pb = test::token_stream(300, 32);
  BatchHandle a = sched.submit(request(pa, gen_options(40), ca));
  a_at_3.get_future().wait();
  BatchHandle b = sched.submit(request(pb, gen_options(5), cb));
  b_submitted.set_value();
  const GenerateSummary sa = a.result.get(), sb = b.result.get();
  EXPECT_EQ(sa.tokens, generate(*e, so.session, pa, gen_options(40)).tokens);
  EXPECT_EQ(sb.tokens, generate(*e, so.session, pb, gen_options(5)).tokens);
  EXPECT_EQ(sb.prompt_tokens, 300);
  // 300 tokens in chunks of 32: 10 parts, each reported once.
  ASSERT_EQ(b_progress.size(), 10u);
  EXPECT_EQ(b_progress.back(), 300);
  ASSERT_GE(b_first, 0);
  // A decoded between B's first and last prefill parts.
  int between = 0;
  for (int t : a_events) between += t > b_progress_events.front() && t < b_progress_events.back();
  EXPECT_GE(between, 8) << "A did not decode while B's prompt was prefilled";
  EXPECT_GT(b_first, b_progress_events.back());
}

TEST(BatchScheduler, CancelDuringSteppedPrefillFails) {
  TINY_ENGINE(e);
  BatchSchedulerOptions so = sched_options(2, AttentionKind::kFull);
  so.prefill_step_tokens = 32;
  EXPECT_NE(test::error_of([&] {
              BatchSchedulerOptions bad = so;
              bad.prefill_step_tokens = -1;
              BatchScheduler s(*e, bad);
            }).find("prefill_step_tokens"),
            std::string::npos);
  BatchScheduler sched(*e, so);
  std::shared_ptr<BatchHandle> hb;
  std::promise<void> assigned;
  std::shared_future<void> ready = assigned.get_future().share();
  GenerateCallbacks cb;
  cb.on_prefill = [&hb, ready](int64_t done, int64_t) {
    if (done == 32) ready.wait();  // hb is set before the second part
    if (done == 64) hb->cancel();  // the second part: cancel; the third never runs
  };
  hb = std::make_shared<BatchHandle>(sched.submit(request(test::token_stream(300, 41), gen_options(5), cb)));
  assigned.set_value();
  EXPECT_NE(test::error_of([&] { hb->result.get(); }).find("cancelled before it started"), std::string::npos);
  // The scheduler goes on with the next request.
  const auto p = test::token_stream(30, 42);
  EXPECT_EQ(sched.submit(request(p, gen_options(6))).result.get().tokens,
            generate(*e, so.session, p, gen_options(6)).tokens);
  const BatchScheduler::Stats st = sched.stats();
  EXPECT_EQ(st.failed, 1);
  EXPECT_EQ(st.completed, 1);
}

}  // namespace
}  // namespace retroinfer
