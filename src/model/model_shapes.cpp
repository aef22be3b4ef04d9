// Built-in model shapes (see model_shapes.h for the figures and their sources).
#include "retroinfer/model_shapes.h"

#include <algorithm>
#include <cctype>
#include <limits>

#include "retroinfer/error.h"

namespace retroinfer {

namespace {

// meta-llama/Llama-3.1-8B config.json.
ModelConfig llama3_8b() {
  ModelConfig c;
  c.architecture = "llama";
  c.vocab_size = 128256;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_layers = 32;
  c.num_heads_q = 32;
  c.num_heads_kv = 8;
  c.head_dim = 128;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 500000.0f;
  c.rope_scaling.type = "llama3";
  c.rope_scaling.factor = 8.0f;
  c.rope_scaling.low_freq_factor = 1.0f;
  c.rope_scaling.high_freq_factor = 4.0f;
  c.rope_scaling.original_max_position = 8192;
  c.max_position_embeddings = 131072;
  c.tie_word_embeddings = false;
  c.attention_bias = false;
  c.bos_token_id = 128000;
  c.eos_token_ids = {128001};
  return c;
}

// Qwen/Qwen2.5-7B config.json (use_sliding_window false: no sliding window).
ModelConfig qwen25_7b() {
  ModelConfig c;
  c.architecture = "qwen2";
  c.vocab_size = 152064;
  c.hidden_size = 3584;
  c.intermediate_size = 18944;
  c.num_layers = 28;
  c.num_heads_q = 28;
  c.num_heads_kv = 4;
  c.head_dim = 128;
  c.rms_norm_eps = 1e-6f;
  c.rope_theta = 1000000.0f;
  c.max_position_embeddings = 32768;
  c.tie_word_embeddings = false;
  c.attention_bias = true;
  c.bos_token_id = -1;
  c.eos_token_ids = {151643};
  return c;
}

// Qwen/Qwen2.5-Coder-0.5B-Instruct config.json (the GGUF `--model qwen2.5-coder-0.5b` loads: untied output).
ModelConfig qwen25_05b() {
  ModelConfig c = qwen25_7b();
  c.vocab_size = 151936;
  c.hidden_size = 896;
  c.intermediate_size = 4864;
  c.num_layers = 24;
  c.num_heads_q = 14;
  c.num_heads_kv = 2;
  c.head_dim = 64;
  return c;
}

// HuggingFaceTB/SmolLM2-135M config.json.
ModelConfig smollm2_135m() {
  ModelConfig c;
  c.architecture = "llama";
  c.vocab_size = 49152;
  c.hidden_size = 576;
  c.intermediate_size = 1536;
  c.num_layers = 30;
  c.num_heads_q = 9;
  c.num_heads_kv = 3;
  c.head_dim = 64;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 100000.0f;
  c.max_position_embeddings = 8192;
  c.tie_word_embeddings = true;
  c.attention_bias = false;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

struct NamedShape {
  const char* name;
  ModelConfig (*make)();
};
constexpr NamedShape kShapes[] = {{"llama3-8b", llama3_8b}, {"qwen2.5-7b", qwen25_7b}, {"qwen2.5-0.5b", qwen25_05b},
                                 {"smollm2-135m", smollm2_135m}};

}  // namespace

std::vector<std::string> model_shape_names() {
  std::vector<std::string> out;
  for (const NamedShape& s : kShapes) out.emplace_back(s.name);
  return out;
}

ModelConfig model_shape(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) { return std::tolower(ch); });
  std::string known;
  for (const NamedShape& s : kShapes) {
    if (lower == s.name) {
      ModelConfig c = s.make();
      validate(c);
      return c;
    }
    known += (known.empty() ? "" : ", ") + std::string(s.name);
  }
  RETROINFER_FAIL("unknown model shape '", name, "'; known shapes: ", known,
                  " (or pass a model file or config.json)");
}

ModelConfig with_max_context(ModelConfig cfg, int64_t tokens) {
  RETROINFER_CHECK(tokens >= 1 && tokens <= std::numeric_limits<int>::max(), "with_max_context: tokens = ", tokens,
                   " is out of range [1, ", std::numeric_limits<int>::max(), "]");
  RETROINFER_CHECK(cfg.rope_scaling.type != "dynamic" || cfg.rope_scaling.factor <= 1.0f,
                   "with_max_context: dynamic RoPE scaling depends on max_position_embeddings; raising it would "
                   "change the model's positions, so this shape cannot be extended");
  if ((cfg.rope_scaling.type == "llama3" || cfg.rope_scaling.type == "yarn") &&
      cfg.rope_scaling.original_max_position <= 0)
    cfg.rope_scaling.original_max_position = cfg.max_position_embeddings;
  cfg.max_position_embeddings = std::max<int>(cfg.max_position_embeddings, static_cast<int>(tokens));
  return cfg;
}

}  // namespace retroinfer
