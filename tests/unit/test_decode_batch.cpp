// Session::decode_batch (one decode step of several sequences, the weights read once) against each
// session's own decode(), on the tiny model fixture; and its refusals. Skips when the fixture is absent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <vector>

#include "retroinfer/error.h"
#include "retroinfer/model.h"
#include "retroinfer/sampler.h"

#include "tiny_model_util.h"

namespace retroinfer {
namespace {


SessionOptions options(AttentionKind kind, int64_t max_context) {
  SessionOptions so;
  so.attention.kind = kind;
  so.attention.window_tokens = 16;  // a steady zone well under the prompts: the sparse methods do select
  so.prefill_chunk = 64;
  so.max_context = max_context;
  return so;
}

// Tolerance of a batched logit against the single decode's: both paths multiply through the same per-row
// dot products (matvec_rows), so they agree exactly today; the bound admits a future GEMM for the batch:
// f32 sums of <= 128 products reordered differ by <= 128 * 2^-24 ~ 8e-6 of the summed magnitudes per
// matmul, ~7 matmuls deep -> 1e-4 of the largest |logit| leaves margin.
constexpr double kRelTol = 1e-4;

TEST(DecodeBatch, MatchesSingleDecodeAcrossPositionsAndMethods) {
  const Model* m = test::tiny_llama3();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  const int64_t vocab = m->config().vocab_size;
  const std::vector<int> prompt_len = {37, 90, 150};
  const std::vector<AttentionKind> kinds = {AttentionKind::kFull, AttentionKind::kRetro, AttentionKind::kStreaming};
  constexpr int kSteps = 8;
  std::vector<std::unique_ptr<Session>> batched, alone;
  std::vector<int32_t> next_b, next_a;
  for (size_t i = 0; i < prompt_len.size(); ++i) {
    const auto prompt = test::token_stream(prompt_len[i], 7 + static_cast<uint32_t>(i));
    for (auto* set : {&batched, &alone}) {
      set->push_back(std::make_unique<Session>(*m, options(kinds[i], 200)));
      const auto logits = set->back()->prefill(prompt);
      (set == &batched ? next_b : next_a).push_back(argmax(logits));
    }
  }
  std::vector<Session*> ptrs;
  for (auto& s : batched) ptrs.push_back(s.get());
  std::vector<float> lb(ptrs.size() * vocab), la(vocab);
  double worst = 0.0;
  for (int step = 0; step < kSteps; ++step) {
    ASSERT_EQ(next_b, next_a) << "greedy continuations diverge at step " << step;
    Session::decode_batch(ptrs, next_b, lb);
    for (size_t i = 0; i < ptrs.size(); ++i) {
      alone[i]->decode(next_a[i], la);
      EXPECT_EQ(batched[i]->position(), alone[i]->position());
      EXPECT_EQ(batched[i]->last_stats().exact_tokens, alone[i]->last_stats().exact_tokens) << "session " << i;
      EXPECT_EQ(batched[i]->last_stats().context_tokens, alone[i]->last_stats().context_tokens) << "session " << i;
      const float* row = lb.data() + i * vocab;
      double max_abs = 0.0, max_diff = 0.0;
      for (int64_t v = 0; v < vocab; ++v) {
        max_abs = std::max(max_abs, std::abs(static_cast<double>(la[v])));
        max_diff = std::max(max_diff, std::abs(static_cast<double>(row[v]) - la[v]));
      }
      ASSERT_GT(max_abs, 0.0);
      worst = std::max(worst, max_diff / max_abs);
      EXPECT_LE(max_diff / max_abs, kRelTol) << "session " << i << " step " << step;
      next_b[i] = argmax(std::span<const float>(row, vocab));
      next_a[i] = argmax(la);
    }
  }
  EXPECT_EQ(next_b, next_a);
  // Streaming reads part of the context only: the batch ran each session's own method, not full attention.
  EXPECT_LT(batched[2]->last_stats().exact_tokens, batched[2]->last_stats().context_tokens);
  std::printf("[decode_batch] 3 sessions (prompts 37/90/150; full/retro/streaming) x %d steps: max rel diff %.3g\n",
              kSteps, worst);
}

TEST(DecodeBatch, ObserverSeesEveryLayerOfEverySession) {
  const Model* m = test::tiny_llama3();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  Session a(*m, options(AttentionKind::kFull, 64)), b(*m, options(AttentionKind::kFull, 64));
  a.prefill(test::token_stream(10, 1));
  b.prefill(test::token_stream(20, 2));
  int calls_a = 0, calls_b = 0;
  a.set_attention_observer([&](int, const KvCache& kv, const float*, const float*) {
    EXPECT_EQ(kv.size(), 11);
    ++calls_a;
  });
  b.set_attention_observer([&](int, const KvCache& kv, const float*, const float*) {
    EXPECT_EQ(kv.size(), 21);
    ++calls_b;
  });
  Session* s[] = {&a, &b};
  const int32_t t[] = {3, 4};
  std::vector<float> logits(2 * m->config().vocab_size);
  Session::decode_batch(s, t, logits);
  EXPECT_EQ(calls_a, m->config().num_layers);
  EXPECT_EQ(calls_b, m->config().num_layers);
}

TEST(DecodeBatch, RefusesBadInputBeforeChangingAnySession) {
  const Model* m = test::tiny_llama3();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  const int64_t vocab = m->config().vocab_size;
  Session a(*m, options(AttentionKind::kFull, 12)), b(*m, options(AttentionKind::kFull, 64));
  a.prefill(test::token_stream(10, 1));
  b.prefill(test::token_stream(10, 2));
  std::vector<float> logits(2 * vocab);
  auto expect_error = [&](std::span<Session* const> s, std::span<const int32_t> t, std::span<float> l,
                          const char* part) {
    try {
      Session::decode_batch(s, t, l);
      ADD_FAILURE() << "no error; expected one mentioning '" << part << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
    EXPECT_EQ(a.position(), 10);
    EXPECT_EQ(b.position(), 10);
  };
  Session* ab[] = {&a, &b};
  Session* aa[] = {&a, &a};
  Session* an[] = {&a, nullptr};
  const int32_t ok[] = {1, 2};
  const int32_t bad[] = {1, static_cast<int32_t>(vocab)};
  const int32_t neg[] = {-1, 2};
  expect_error({}, {}, {}, "at least one session");
  expect_error(ab, std::span<const int32_t>(ok).first(1), logits, "tokens");
  expect_error(ab, ok, std::span<float>(logits).first(vocab), "logits buffer");
  expect_error(aa, ok, logits, "same object");
  expect_error(an, ok, logits, "null");
  expect_error(ab, bad, logits, "outside the vocabulary");
  expect_error(ab, neg, logits, "outside the vocabulary");
  // Another Model object (same files): refused, the batch shares one set of weights.
  const std::unique_ptr<Model> other = Model::load(m->path());
  Session c(*other, options(AttentionKind::kFull, 64));
  c.prefill(test::token_stream(10, 3));
  Session* ac[] = {&a, &c};
  expect_error(ac, ok, logits, "another model");
  // A full context: a holds 12 tokens; two steps fill it, the third is refused.
  Session::decode_batch(ab, ok, logits);
  Session::decode_batch(ab, ok, logits);
  EXPECT_EQ(a.position(), 12);
  try {
    Session::decode_batch(ab, ok, logits);
    ADD_FAILURE() << "a full context was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is full"), std::string::npos) << e.what();
  }
  EXPECT_EQ(b.position(), 12);  // b untouched by the refused step
}

}  // namespace
}  // namespace retroinfer
