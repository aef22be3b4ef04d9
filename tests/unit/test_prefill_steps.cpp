// Stepped prefill (SequenceSession::begin_prefill / prefill_step / take_prefill_logits) on the tiny model
// fixture: the CPU session's parts are prefill's own chunks, so the logits, the caches and the decode after it
// equal one prefill() call bit for bit, for every attention method and step size; progress is reported per
// chunk; misuse throws. Skips when the fixture is absent.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "retroinfer/error.h"
#include "retroinfer/model.h"
#include "retroinfer/sampler.h"

#include "error_of.h"
#include "tiny_model_util.h"

namespace retroinfer {
namespace {

SessionOptions options(AttentionKind kind) {
  SessionOptions so;
  so.attention.kind = kind;
  so.attention.window_tokens = 16;  // a steady zone under the prompt: retro does select clusters
  so.prefill_chunk = 32;
  so.max_context = 400;
  return so;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(PrefillSteps, EqualOnePrefillForEveryMethodAndStepSize) {
  const Model* m = test::tiny_llama3();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  const int64_t vocab = m->config().vocab_size;
  const auto prompt = test::token_stream(150, 11);  // 4 full chunks of 32 and a tail of 22
  for (AttentionKind kind : {AttentionKind::kFull, AttentionKind::kRetro, AttentionKind::kQuest}) {
    Session one(*m, options(kind));
    const std::vector<float> want = one.prefill(prompt);
    for (int64_t step : {1, 32, 40, 64, 1000}) {
      SCOPED_TRACE(testing::Message() << "method " << static_cast<int>(kind) << " step " << step);
      Session s(*m, options(kind));
      std::vector<int64_t> progress;
      s.begin_prefill(prompt, [&](int64_t done, int64_t total) {
        EXPECT_EQ(total, 150);
        progress.push_back(done);
      });
      EXPECT_TRUE(s.prefill_stepping());
      int steps = 0;
      while (!s.prefill_step(step)) {
        ++steps;
        ASSERT_LT(steps, 200);
        EXPECT_LT(s.position(), 150) << "the prompt is not done yet";
      }
      ++steps;
      // Whole chunks, at least one per step: 5 chunks in ceil(5 / max(1, step / 32)) steps.
      const int per = step < 32 ? 1 : static_cast<int>(step / 32);
      EXPECT_EQ(steps, (5 + per - 1) / per);
      EXPECT_EQ(progress, (std::vector<int64_t>{32, 64, 96, 128, 150}));
      const std::vector<float> got = s.take_prefill_logits();
      EXPECT_FALSE(s.prefill_stepping());
      EXPECT_TRUE(same_bits(got, want)) << "logits differ from one prefill()";
      EXPECT_EQ(s.position(), 150);
      // The same caches and index: greedy decode continues bit for bit.
      Session ref(*m, options(kind));
      int32_t t = argmax(ref.prefill(prompt));
      ASSERT_EQ(argmax(got), t);
      std::vector<float> la(vocab), lb(vocab);
      for (int i = 0; i < 6; ++i) {
        ref.decode(t, la);
        s.decode(t, lb);
        ASSERT_TRUE(same_bits(la, lb)) << "decode step " << i;
        t = argmax(la);
      }
    }
  }
}

TEST(PrefillSteps, MisuseThrows) {
  const Model* m = test::tiny_llama3();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  const int64_t vocab = m->config().vocab_size;
  const auto prompt = test::token_stream(100, 3);
  Session s(*m, options(AttentionKind::kFull));
  std::vector<float> logits(vocab);
  EXPECT_THROW(s.prefill_step(32), Error);  // nothing begun
  EXPECT_THROW(s.take_prefill_logits(), Error);
  EXPECT_THROW(s.begin_prefill(std::vector<int32_t>{}), Error);  // empty prompt
  EXPECT_THROW(s.begin_prefill(test::token_stream(401, 3)), Error);  // past max_context
  s.begin_prefill(prompt);
  EXPECT_NE(test::error_of([&] { s.begin_prefill(prompt); }).find("in progress"), std::string::npos);
  EXPECT_THROW(s.prefill(prompt), Error);
  EXPECT_THROW(s.prefill_step(0), Error);
  EXPECT_FALSE(s.prefill_step(32));
  EXPECT_THROW(s.take_prefill_logits(), Error);  // not done
  EXPECT_NE(test::error_of([&] { s.decode(1, logits); }).find("stepped prefill"), std::string::npos);
  Session* one[] = {&s};
  const int32_t tok[] = {1};
  EXPECT_THROW(Session::decode_batch(one, tok, logits), Error);
  while (!s.prefill_step(32)) {
  }
  EXPECT_THROW(s.prefill_step(32), Error);  // already done
  EXPECT_EQ(s.take_prefill_logits().size(), static_cast<size_t>(vocab));
  s.decode(argmax(std::vector<float>(logits.size(), 0.0f)), logits);  // decoding is allowed again
  EXPECT_THROW(s.begin_prefill(prompt), Error);  // prefilled: only once per session
}

// A step that throws ends the stepping: prefill() after a refused prompt works (the Python bindings' order).
TEST(PrefillSteps, FailedStepEndsTheStepping) {
  const Model* m = test::tiny_llama3();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  const int64_t vocab = m->config().vocab_size;
  Session s(*m, options(AttentionKind::kFull));
  EXPECT_NE(test::error_of([&] { s.prefill(std::vector<int32_t>{1, static_cast<int32_t>(vocab)}); })
                .find("outside the vocabulary"),
            std::string::npos);
  EXPECT_FALSE(s.prefill_stepping());
  EXPECT_NE(test::error_of([&] { s.prefill(std::vector<int32_t>{}); }).find("empty"), std::string::npos);
  s.begin_prefill(std::vector<int32_t>{1, 2, 3, -1});
  EXPECT_THROW(s.prefill_step(100), Error);
  EXPECT_FALSE(s.prefill_stepping());
  const auto prompt = test::token_stream(40, 5);
  Session ref(*m, options(AttentionKind::kFull));
  EXPECT_TRUE(same_bits(s.prefill(prompt), ref.prefill(prompt)));
}

// The default stepped prefill (the CUDA session's): the whole prompt through prefill() in the first step.
class FakeSession final : public SequenceSession {
 public:
  std::vector<float> prefill(std::span<const int32_t> tokens, bool all_logits, const PrefillProgress& progress) override {
    ++prefills;
    EXPECT_FALSE(all_logits);
    seen.assign(tokens.begin(), tokens.end());
    if (progress) progress(static_cast<int64_t>(tokens.size()), static_cast<int64_t>(tokens.size()));
    return {1.0f, 2.0f, static_cast<float>(tokens.size())};
  }
  void decode(int32_t, std::span<float>) override {}
  std::unique_ptr<SequenceSession> fork_session(const AttentionConfig&) const override { return nullptr; }
  int64_t position() const override { return 0; }
  int64_t max_context() const override { return 100; }
  const ModelConfig& model_config() const override { return cfg; }
  const AttentionConfig& attention_config() const override { return att; }
  const AttentionStats& last_stats() const override { return stats; }
  Device device() const override { return Device::kCuda; }
  int prefills = 0;
  std::vector<int32_t> seen;
  ModelConfig cfg;
  AttentionConfig att;
  AttentionStats stats;
};

TEST(PrefillSteps, DefaultRunsTheWholePromptInTheFirstStep) {
  FakeSession s;
  EXPECT_THROW(s.prefill_step(10), Error);
  EXPECT_THROW(s.begin_prefill(std::vector<int32_t>{}), Error);
  int64_t reported = 0;
  s.begin_prefill(std::vector<int32_t>{5, 6, 7}, [&](int64_t done, int64_t) { reported = done; });
  EXPECT_EQ(s.prefills, 0);  // nothing runs before the first step
  EXPECT_THROW(s.take_prefill_logits(), Error);
  EXPECT_TRUE(s.prefill_step(1));
  EXPECT_EQ(s.prefills, 1);
  EXPECT_EQ(s.seen, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(reported, 3);
  EXPECT_THROW(s.prefill_step(1), Error);
  EXPECT_EQ(s.take_prefill_logits(), (std::vector<float>{1.0f, 2.0f, 3.0f}));
  EXPECT_FALSE(s.prefill_stepping());
}

}  // namespace
}  // namespace retroinfer
