// Hugging Face config.json parsing (llama, qwen2, mistral; every rope_scaling variant) and validation.
#include <gtest/gtest.h>

#include "io_test_files.h"
#include "retroinfer/error.h"
#include "retroinfer/model_config.h"

using namespace retroinfer;
using namespace retroinfer::testing;
using nlohmann::json;

namespace {

json llama_json() {
  return json::parse(TinyLlama{}.config_json());
}

ModelConfig parse_json(const TempDir& d, const json& j) {
  const std::string p = d.file("config.json");
  write_text(p, j.dump());
  return parse_hf_config(p);
}

void expect_config_error(const TempDir& d, const json& j, std::initializer_list<const char*> needles) {
  try {
    parse_json(d, j);
    ADD_FAILURE() << "no error for " << j.dump();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
    for (const char* n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "missing '" << n << "' in: " << msg;
  }
}

}  // namespace

TEST(ModelConfig, LlamaDefaultsAndFields) {
  TempDir d;
  json j = llama_json();
  const ModelConfig c = parse_json(d, j);
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.vocab_size, 32);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 96);
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.num_heads_q, 4);
  EXPECT_EQ(c.num_heads_kv, 2);
  EXPECT_EQ(c.head_dim, 16);  // hidden / heads
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.max_position_embeddings, 256);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{2});
  EXPECT_EQ(c.rope_scaling.type, "default");

  j["head_dim"] = 32;  // explicit head_dim wins over hidden / heads
  j["eos_token_id"] = {2, 5, 7};
  j["tie_word_embeddings"] = true;
  j.erase("num_key_value_heads");  // defaults to the query heads
  j["bos_token_id"] = nullptr;
  j["rope_scaling"] = nullptr;
  const ModelConfig c2 = parse_json(d, j);
  EXPECT_EQ(c2.head_dim, 32);
  EXPECT_EQ(c2.eos_token_ids, (std::vector<int>{2, 5, 7}));
  EXPECT_TRUE(c2.tie_word_embeddings);
  EXPECT_EQ(c2.num_heads_kv, 4);
  EXPECT_EQ(c2.bos_token_id, -1);
  j["eos_token_id"] = nullptr;
  EXPECT_TRUE(parse_json(d, j).eos_token_ids.empty());
}

TEST(ModelConfig, Qwen2AndMistral) {
  TempDir d;
  json j = llama_json();
  j["model_type"] = "qwen2";
  j["use_sliding_window"] = false;
  j["sliding_window"] = 4096;
  const ModelConfig q = parse_json(d, j);
  EXPECT_EQ(q.architecture, "qwen2");
  EXPECT_TRUE(q.attention_bias);  // Qwen2 always has QKV bias
  EXPECT_EQ(q.sliding_window, 0);
  j["model_type"] = "mistral";
  const ModelConfig m = parse_json(d, j);
  EXPECT_EQ(m.architecture, "mistral");
  EXPECT_FALSE(m.attention_bias);
  EXPECT_EQ(m.sliding_window, 4096);
}

TEST(ModelConfig, RopeScalingVariants) {
  TempDir d;
  json j = llama_json();
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  RopeScaling r = parse_json(d, j).rope_scaling;
  EXPECT_EQ(r.type, "llama3");
  EXPECT_EQ(r.factor, 8.0f);
  EXPECT_EQ(r.low_freq_factor, 1.0f);
  EXPECT_EQ(r.high_freq_factor, 4.0f);
  EXPECT_EQ(r.original_max_position, 8192);

  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};  // older key name
  r = parse_json(d, j).rope_scaling;
  EXPECT_EQ(r.type, "linear");
  EXPECT_EQ(r.factor, 2.0f);

  j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 3.0}};
  r = parse_json(d, j).rope_scaling;
  EXPECT_EQ(r.type, "dynamic");
  EXPECT_EQ(r.original_max_position, 256);  // max_position_embeddings

  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768},
                       {"beta_fast", 16}, {"attention_factor", 1.1}};
  r = parse_json(d, j).rope_scaling;
  EXPECT_EQ(r.type, "yarn");
  EXPECT_EQ(r.factor, 4.0f);
  EXPECT_EQ(r.original_max_position, 32768);
  EXPECT_EQ(r.beta_fast, 16.0f);
  EXPECT_EQ(r.beta_slow, 1.0f);  // default
  EXPECT_FLOAT_EQ(r.attention_factor, 1.1f);

  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(parse_json(d, j).rope_scaling.type, "default");

  // transformers >= 4.5x: rope_parameters holds theta and scaling.
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.5}, {"rope_theta", 500000.0}};
  const ModelConfig c = parse_json(d, j);
  EXPECT_EQ(c.rope_theta, 500000.0f);
  EXPECT_EQ(c.rope_scaling.type, "linear");
  EXPECT_EQ(c.rope_scaling.factor, 2.5f);
}

TEST(ModelConfig, Errors) {
  TempDir d;
  const json base = llama_json();
  auto with = [&](const char* k, json v) {
    json j = base;
    j[k] = std::move(v);
    return j;
  };
  auto without = [&](const char* k) {
    json j = base;
    j.erase(k);
    return j;
  };
  expect_config_error(d, with("model_type", "gpt2"), {"'model_type'", "'gpt2'", "not a supported architecture"});
  expect_config_error(d, without("model_type"), {"'model_type'", "missing"});
  expect_config_error(d, without("hidden_size"), {"'hidden_size'", "missing"});
  expect_config_error(d, with("hidden_size", "64"), {"'hidden_size'", "must be an integer"});
  expect_config_error(d, with("hidden_size", 64.5), {"'hidden_size'", "must be an integer"});
  expect_config_error(d, with("num_hidden_layers", 0), {"num_layers = 0", "out of range"});
  expect_config_error(d, with("num_key_value_heads", 3), {"num_heads_q = 4", "num_heads_kv = 3"});
  expect_config_error(d, with("head_dim", 15), {"head_dim = 15", "even"});
  expect_config_error(d, with("vocab_size", 1ll << 40), {"'vocab_size'", "out of range"});
  expect_config_error(d, with("rms_norm_eps", "tiny"), {"'rms_norm_eps'", "must be a number"});
  expect_config_error(d, with("rms_norm_eps", -1), {"rms_norm_eps"});
  expect_config_error(d, with("rope_theta", 1e300), {"'rope_theta'", "out of a float's range"});
  expect_config_error(d, with("tie_word_embeddings", 1), {"'tie_word_embeddings'", "true or false"});
  expect_config_error(d, with("eos_token_id", {2, "x"}), {"'eos_token_id'[1]"});
  expect_config_error(d, with("eos_token_id", 99), {"eos_token_id 99", "outside the vocabulary"});
  expect_config_error(d, with("hidden_act", "gelu"), {"'hidden_act'", "silu"});
  expect_config_error(d, with("rope_scaling", {{"rope_type", "longrope"}, {"factor", 2}}),
                      {"'rope_scaling.rope_type'", "'longrope'", "not supported"});
  expect_config_error(d, with("rope_scaling", {{"rope_type", "linear"}}), {"'rope_scaling.factor'", "missing"});
  expect_config_error(d, with("rope_scaling", {{"rope_type", "llama3"}, {"factor", 8}}),
                      {"'rope_scaling.low_freq_factor'", "missing"});
  expect_config_error(d,
                      with("rope_scaling", {{"rope_type", "llama3"}, {"factor", 8}, {"low_freq_factor", 4},
                                            {"high_freq_factor", 1}, {"original_max_position_embeddings", 8192}}),
                      {"low_freq_factor < high_freq_factor"});
  expect_config_error(d, with("rope_scaling", {{"rope_type", "linear"}, {"factor", -2}}), {"factor = -2"});
  expect_config_error(d, with("rope_scaling", 3), {"'rope_scaling'", "object or null"});
  {
    const std::string p = d.file("config.json");
    write_text(p, "{\"model_type\": ");
    EXPECT_THROW(parse_hf_config(p), Error);
    write_text(p, "[]");
    EXPECT_THROW(parse_hf_config(p), Error);
    EXPECT_THROW(parse_hf_config(d.file("absent.json")), Error);
  }
}

TEST(ModelConfig, ValidateDirectly) {
  ModelConfig c;
  EXPECT_THROW(validate(c), Error);  // empty architecture
  c.architecture = "llama";
  c.vocab_size = 10;
  c.hidden_size = 8;
  c.intermediate_size = 16;
  c.num_layers = 1;
  c.num_heads_q = 2;
  c.num_heads_kv = 1;
  c.head_dim = 4;
  EXPECT_NO_THROW(validate(c));
  c.rope_scaling.type = "ntk";
  EXPECT_THROW(validate(c), Error);
  c.rope_scaling.type = "yarn";
  c.rope_scaling.factor = 4;
  EXPECT_THROW(validate(c), Error);  // no original context length
  c.rope_scaling.original_max_position = 128;
  EXPECT_NO_THROW(validate(c));
}
