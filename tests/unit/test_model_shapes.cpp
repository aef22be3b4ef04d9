// Built-in model shapes: the figures of each public config, name handling, and the context extension.
#include <gtest/gtest.h>

#include "retroinfer/error.h"
#include "retroinfer/model.h"
#include "retroinfer/model_shapes.h"

namespace retroinfer {
namespace {

// The dimensions of a config.json, in its order.
struct Dims {
  int layers, hidden, heads_q, heads_kv, head_dim, ffn, vocab;
};

void expect_dims(const ModelConfig& c, const Dims& d) {
  EXPECT_EQ(c.num_layers, d.layers);
  EXPECT_EQ(c.hidden_size, d.hidden);
  EXPECT_EQ(c.num_heads_q, d.heads_q);
  EXPECT_EQ(c.num_heads_kv, d.heads_kv);
  EXPECT_EQ(c.head_dim, d.head_dim);
  EXPECT_EQ(c.intermediate_size, d.ffn);
  EXPECT_EQ(c.vocab_size, d.vocab);
}

TEST(ModelShapes, Llama3_8b) {
  const ModelConfig c = model_shape("llama3-8b");
  EXPECT_EQ(c.architecture, "llama");
  expect_dims(c, {32, 4096, 32, 8, 128, 14336, 128256});
  EXPECT_FLOAT_EQ(c.rope_theta, 500000.0f);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_FLOAT_EQ(c.rope_scaling.factor, 8.0f);
  EXPECT_EQ(c.rope_scaling.original_max_position, 8192);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.tie_word_embeddings);
  // KV bytes per token at bf16: 32 layers x 8 heads x 128 x 2 (K, V) x 2 bytes = 128 KiB (docs/design.md §1).
  EXPECT_EQ(int64_t{c.num_layers} * c.num_heads_kv * c.head_dim * 2 * 2, 128 * 1024);
}

TEST(ModelShapes, QwenAndSmolLM2) {
  const ModelConfig q = model_shape("qwen2.5-7b");
  EXPECT_EQ(q.architecture, "qwen2");
  expect_dims(q, {28, 3584, 28, 4, 128, 18944, 152064});
  EXPECT_FLOAT_EQ(q.rope_theta, 1e6f);
  EXPECT_TRUE(q.attention_bias);
  EXPECT_EQ(q.rope_scaling.type, "default");
  const ModelConfig s = model_shape("SmolLM2-135M");  // case-insensitive
  expect_dims(s, {30, 576, 9, 3, 64, 1536, 49152});
  EXPECT_TRUE(s.tie_word_embeddings);
  const ModelConfig c = model_shape("qwen2.5-0.5b");  // Qwen2.5-Coder-0.5B-Instruct's GGUF header
  EXPECT_EQ(c.architecture, "qwen2");
  expect_dims(c, {24, 896, 14, 2, 64, 4864, 151936});
  EXPECT_FLOAT_EQ(c.rope_theta, 1e6f);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.tie_word_embeddings);
}

TEST(ModelShapes, EveryNameValidatesAndUnknownNamesAreListed) {
  ASSERT_EQ(model_shape_names().size(), 4u);
  for (const std::string& n : model_shape_names()) EXPECT_NO_THROW(validate(model_shape(n))) << n;
  try {
    model_shape("llama3-70b");
    FAIL() << "expected Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("llama3-70b"), std::string::npos) << m;
    EXPECT_NE(m.find("llama3-8b, qwen2.5-7b, qwen2.5-0.5b, smollm2-135m"), std::string::npos) << m;
  }
}

TEST(ModelShapes, WithMaxContextAllowsLongBenchmarksWithoutChangingRope) {
  const ModelConfig base = model_shape("llama3-8b");
  const ModelConfig c = with_max_context(base, 1 << 20);
  EXPECT_EQ(c.max_position_embeddings, 1 << 20);
  EXPECT_EQ(model_max_context(c), 1 << 20);
  EXPECT_EQ(c.rope_scaling.original_max_position, 8192);  // llama3 frequencies unchanged
  EXPECT_EQ(with_max_context(base, 4096).max_position_embeddings, 131072);  // never lowered
  ModelConfig dyn = base;
  dyn.rope_scaling.type = "dynamic";
  dyn.rope_scaling.factor = 2.0f;
  EXPECT_THROW(with_max_context(dyn, 1 << 20), Error);
  EXPECT_THROW(with_max_context(base, 0), Error);
}

}  // namespace
}  // namespace retroinfer
