// The CUDA model runner's API contract: bad input gives a clear Error, the memory plan refuses what does not
// fit, random weights of a Llama-3-8B shape run, step timing, the prefill timeline and the CudaSequenceSession
// adapter.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "cuda_model_test_util.h"
#include "gpu_test_util.h"
#include "retroinfer/cuda_model.h"
#include "retroinfer/model_shapes.h"
#include "retroinfer/error.h"

namespace retroinfer {
namespace {

using cuda::CudaModel;
using cuda::CudaSession;
using cuda::CudaSessionOptions;

CudaSessionOptions full_options(int64_t max_context, int chunk) {
  CudaSessionOptions o;
  o.attention.kind = AttentionKind::kFull;
  o.max_context = max_context;
  o.prefill_chunk = chunk;
  return o;
}

TEST(CudaModelApi, BadInputThrowsClearErrors) {
  RETROINFER_REQUIRE_GPU();
  const ModelConfig c = gputest::synthetic_config(64);
  gputest::MemoryModelFile f(c, 5);
  auto m = Model::load(f);
  auto gm = CudaModel::upload(*m, cuda::WeightType::kBf16);
  const int64_t vocab = c.vocab_size;
  gputest::expect_error([&] { CudaSession s(*gm, full_options(64, 16), 0); }, "num_seqs", "num_seqs 0");
  gputest::expect_error([&] { CudaSession s(*gm, full_options(c.max_position_embeddings + 1, 16), 1); },
                        "exceeds the model's",
                        "max_context beyond the model");
  CudaSession s(*gm, full_options(64, 16), 2);
  std::vector<float> logits(2 * vocab);
  std::vector<int32_t> two{1, 2}, next(2);
  gputest::expect_error([&] { s.decode(two, logits); }, "before prefill", "decode before prefill");
  gputest::expect_error([&] { s.fork(s.options().attention); }, "prefilled", "fork before prefill");
  gputest::expect_error([&] { s.prefill({{1, 2, 3}}); }, "prompts", "one prompt for two sequences");
  gputest::expect_error([&] { s.prefill({{1, 2, 3}, {}}); }, "empty", "empty prompt");
  gputest::expect_error([&] { s.prefill({{1, 2, 3}, std::vector<int32_t>(65, 1)}); }, "at most 64", "prompt too long");
  gputest::expect_error([&] { s.prefill({{1, 2, 3}, {4, static_cast<int32_t>(vocab)}}); },
                        "vocabulary", "token == vocab");
  gputest::expect_error([&] { s.prefill({{-1}, {4}}); }, "vocabulary", "negative token");
  gputest::expect_error([&] { s.prefill({{1, 2}, {3, 4}}, true); }, "all_logits", "all_logits with two sequences");
  const auto first = s.prefill({{1, 2, 3}, {4, 5}});
  ASSERT_EQ(static_cast<int64_t>(first.size()), 2 * vocab);
  gputest::expect_error([&] { s.prefill({{1}, {2}}); }, "only once", "second prefill");
  std::vector<int32_t> one{1};
  gputest::expect_error([&] { s.decode(one, logits); }, "one token per sequence", "one token for two sequences");
  std::vector<float> short_logits(vocab);
  gputest::expect_error([&] { s.decode(two, short_logits); }, "logits span", "logits span too short");
  std::vector<int32_t> bad{1, static_cast<int32_t>(vocab) + 5};
  gputest::expect_error([&] { s.decode(bad, logits); }, "vocabulary", "decode token out of vocab");
  std::vector<int32_t> one_next(1);
  gputest::expect_error([&] { s.decode_greedy(two, one_next); }, "next span", "next span too short");
  // The session still works after the rejected calls; a full sequence is refused.
  for (int i = 0; i < 61; ++i) s.decode_greedy(two, next);
  EXPECT_EQ(s.positions(), (std::vector<int64_t>{64, 63}));
  gputest::expect_error([&] { s.decode_greedy(two, next); }, "is full", "context full");
  // Host-tier layers are retro only; a second fill is refused; synthetic K/V needs its minimum length.
  CudaSessionOptions host = full_options(64, 16);
  host.placement = KvPlacement::kHost;
  gputest::expect_error([&] { CudaSession h(*gm, host, 1); },
                        "only the retro method", "host placement with full attention");
  gputest::expect_error([&] { s.fill_synthetic(16, 1); }, "already holds tokens", "fill_synthetic after prefill");
  CudaSession fresh(*gm, full_options(64, 16), 1);
  gputest::expect_error([&] { fresh.fill_synthetic(65, 1); }, "do not fit", "fill_synthetic beyond max_context");
  gputest::expect_error([&] { fresh.fill_synthetic(16, 1); },
                        "context_tokens must be", "fill_synthetic shorter than the generator's minimum");
  std::printf("[cuda_model api] errors: 20 bad calls rejected with clear messages\n");
}

TEST(CudaModelApi, PlanRefusesWhatDoesNotFit) {
  RETROINFER_REQUIRE_GPU();
  const ModelConfig c = gputest::synthetic_config(128);
  gputest::MemoryModelFile f(c, 6);
  auto m = Model::load(f);
  auto gm = CudaModel::upload(*m, cuda::WeightType::kF32);
  // f32 weights: every matrix 4 bytes per element, norms + biases f32.
  const int64_t h = c.hidden_size, qkv = (c.num_heads_q + 2 * c.num_heads_kv) * c.head_dim;
  const int64_t per_layer = qkv * h + h * c.num_heads_q * c.head_dim + 3 * int64_t{c.intermediate_size} * h + 2 * h + qkv;
  EXPECT_EQ(gm->weight_bytes(), 4 * (int64_t{c.vocab_size} * h + h + c.num_layers * per_layer));  // tied
  CudaSessionOptions o = full_options(4096, 256);
  o.gpu_memory_limit = 1 << 20;  // 1 MiB: the KV alone needs 2 * 2 layers * 2 heads * 4096 * 128 * 2 B = 8 MiB
  gputest::expect_error([&] { CudaSession s(*gm, o, 1); }, "GiB of GPU memory", "1 MiB limit");
  o.gpu_memory_limit = int64_t{1} << 30;
  CudaSession s(*gm, o, 3);
  const auto& p = s.memory_plan();
  EXPECT_EQ(p.gpu_layers, c.num_layers);
  EXPECT_GE(p.gpu_bytes - gm->weight_bytes(), 3 * int64_t{8} << 20);
  EXPECT_LE(p.gpu_bytes, p.gpu_free_bytes);
  std::printf("[cuda_model plan] synthetic-d128 f32, 3 x 4096 tokens: %.1f MiB planned of %.1f MiB\n",
              p.gpu_bytes / 1048576.0, p.gpu_free_bytes / 1048576.0);
}

// A Llama-3-8B-shaped model with random bf16 weights (16 GB), generated on the device: two sequences, a
// 512-token prefill each (chunks of 256), 8 greedy steps with step timing.
TEST(CudaModelApi, RandomLlama3_8B) {
  RETROINFER_REQUIRE_GPU();
  const ModelConfig c = model_shape("llama3-8b");
  const auto t0 = std::chrono::steady_clock::now();
  auto gm = CudaModel::random(c, 1234);
  const auto t1 = std::chrono::steady_clock::now();
  // 8,030,261,248 parameters (Llama-3-8B): matrices in bf16, the 65 norm vectors in f32.
  const int64_t norms = (2 * int64_t{c.num_layers} + 1) * c.hidden_size;
  EXPECT_EQ(gm->weight_bytes(), 2 * (int64_t{8030261248} - norms) + 4 * norms);
  CudaSession s(*gm, full_options(1024, 256), 2);
  const auto prompts = std::vector<std::vector<int32_t>>{gputest::random_tokens(512, c.vocab_size, 1),
                                                         gputest::random_tokens(512, c.vocab_size, 2)};
  const auto logits = s.prefill(prompts);
  const auto t2 = std::chrono::steady_clock::now();
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  s.set_step_timing(true);
  std::vector<int32_t> tok{argmax(std::span<const float>(logits.data(), c.vocab_size)),
                           argmax(std::span<const float>(logits.data() + c.vocab_size, c.vocab_size))};
  std::vector<int32_t> next(2);
  float att = 0, other = 0;
  for (int i = 0; i < 8; ++i) {
    s.decode_greedy(tok, next);
    for (int32_t t : next) ASSERT_TRUE(t >= 0 && t < c.vocab_size);
    tok = next;
    const auto ms = s.last_step_ms();
    ASSERT_EQ(ms.size(), 2u);
    EXPECT_EQ(ms[0].first, "attention");
    EXPECT_GE(ms[0].second, 0.0f);
    EXPECT_GE(ms[1].second, 0.0f);
    att = ms[0].second;
    other = ms[1].second;
  }
  EXPECT_EQ(s.last_stats().context_tokens, 2 * 520 * 8 * 32);
  std::printf("[cuda_model llama3-8b random] weights %.1f GiB in %.1f s; prefill 2 x 512 in %.2f s; decode step "
              "(batch 2, 520 tokens): attention %.3f ms, other %.3f ms\n",
              gm->weight_bytes() / 1073741824.0, std::chrono::duration<double>(t1 - t0).count(),
              std::chrono::duration<double>(t2 - t1).count(), att, other);
}

// The prefill timeline (set_prefill_timing): three chunks of a bf16 model, the parts in their order, each >= 0,
// attention and the layers' work > 0, and the parts tile the chunks' span (every interval between consecutive
// events is counted once: start + attention + layers + end per chunk, and the gaps between chunks, make
// gpu_total up to the elapsed times' rounding). Timing changes no result: the logits equal an untimed
// session's bitwise. Off, or a layer-major prefill (host-tier layers): empty.
TEST(CudaModelApi, PrefillTimeline) {
  RETROINFER_REQUIRE_GPU();
  const ModelConfig c = gputest::synthetic_config(128);
  gputest::MemoryModelFile f(c, 21);
  auto m = Model::load(f);
  auto gm = CudaModel::upload(*m, cuda::WeightType::kBf16);
  const std::vector<std::vector<int32_t>> prompt{gputest::random_tokens(600, c.vocab_size, 22)};
  CudaSession timed(*gm, full_options(1024, 256), 1), plain(*gm, full_options(1024, 256), 1);
  timed.set_prefill_timing(true);
  const auto a = timed.prefill(prompt), b = plain.prefill(prompt);
  EXPECT_EQ(a, b) << "prefill timing changed the logits";
  EXPECT_TRUE(plain.last_prefill_ms().empty());
  const auto ms = timed.last_prefill_ms();
  const char* names[] = {"attention", "layers", "chunk_start", "chunk_end", "between_chunks", "gpu_total"};
  ASSERT_EQ(ms.size(), std::size(names));
  double parts = 0.0;
  for (size_t i = 0; i < ms.size(); ++i) {
    EXPECT_EQ(ms[i].first, names[i]);
    EXPECT_GE(ms[i].second, 0.0f) << names[i];
    if (i + 1 < ms.size()) parts += ms[i].second;
  }
  EXPECT_GT(ms[0].second, 0.0f);
  if (c.num_layers > 1) EXPECT_GT(ms[1].second, 0.0f);
  const double total = ms.back().second;
  EXPECT_NEAR(parts, total, 0.05 + 1e-3 * total) << "the parts must tile the chunks' span";
  std::printf("[cuda_model prefill timeline] 600 tokens in chunks of 256, %d layers: attention %.3f, layers %.3f, "
              "chunk start %.3f, chunk end %.3f, between chunks %.3f, total %.3f ms\n",
              c.num_layers, ms[0].second, ms[1].second, ms[2].second, ms[3].second, ms[4].second, total);

  CudaSessionOptions host = full_options(1024, 256);
  host.attention.kind = AttentionKind::kRetro;
  host.placement = KvPlacement::kHost;
  CudaSession layer_major(*gm, host, 1);
  layer_major.set_prefill_timing(true);
  layer_major.prefill(prompt);
  EXPECT_TRUE(layer_major.last_prefill_ms().empty()) << "a layer-major prefill records no timeline";
}

TEST(CudaModelApi, SequenceSessionAdapter) {
  RETROINFER_REQUIRE_GPU();
  const ModelConfig c = gputest::synthetic_config(64);
  gputest::MemoryModelFile f(c, 9);
  auto m = Model::load(f);
  auto gm = CudaModel::upload(*m, cuda::WeightType::kF32);
  const auto prompt = gputest::random_tokens(100, c.vocab_size, 4);
  cuda::CudaSequenceSession a(*gm, full_options(128, 32));
  auto la = a.prefill(prompt);
  EXPECT_EQ(a.position(), 100);
  EXPECT_EQ(a.max_context(), 128);
  EXPECT_EQ(a.attention_config().kind, AttentionKind::kFull);
  EXPECT_EQ(a.model_config().vocab_size, c.vocab_size);
  auto b = a.fork_session(a.attention_config());
  std::vector<float> lb(c.vocab_size);
  const int32_t t = argmax(la);
  a.decode(t, la);
  b->decode(t, lb);
  // Same KV, same kernels, same batch size: bitwise equal.
  EXPECT_EQ(la, lb);
  EXPECT_EQ(b->position(), 101);
  EXPECT_EQ(a.last_stats().exact_tokens, 101 * c.num_heads_kv * c.num_layers);
  EXPECT_THROW(cuda::CudaSequenceSession(std::make_unique<CudaSession>(*gm, full_options(128, 32), 2)), Error);
  std::printf("[cuda_model adapter] prefill 100 + fork + 1 step: fork bitwise equal\n");
}

}  // namespace
}  // namespace retroinfer
