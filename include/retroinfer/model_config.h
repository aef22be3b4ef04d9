// Model hyper-parameters, read from a Hugging Face config.json or from GGUF metadata.
#pragma once

#include <string>
#include <vector>

namespace retroinfer {

// RoPE frequency scaling (Hugging Face `rope_scaling`).
struct RopeScaling {
  std::string type = "default";  // default | linear | dynamic | llama3 | yarn
  float factor = 1.0f;           // context extension factor (linear, dynamic, llama3, yarn)
  float low_freq_factor = 1.0f, high_freq_factor = 4.0f;  // llama3
  int original_max_position = 0;                           // llama3 / yarn / dynamic
  float beta_fast = 32.0f, beta_slow = 1.0f;               // yarn
  float attention_factor = 0.0f;                           // yarn mscale override (0 = derive)
};

struct ModelConfig {
  std::string architecture;  // "llama" | "qwen2" | "mistral" (SmolLM2 is llama)
  int vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_layers = 0;
  int num_heads_q = 0, num_heads_kv = 0, head_dim = 0;  // head_dim: given, else hidden / heads_q
  float rms_norm_eps = 1e-5f, rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  int max_position_embeddings = 0;
  bool tie_word_embeddings = false;  // lm_head shares model.embed_tokens.weight
  bool attention_bias = false;       // QKV bias (Qwen2)
  int bos_token_id = -1;             // -1: none
  std::vector<int> eos_token_ids;    // may be empty
  int sliding_window = 0;            // mistral / qwen2 sliding window (0 = none); informational
};

// Reads a Hugging Face config.json (llama, qwen2, mistral). Throws Error naming the file and the field
// when the file is missing, is not JSON, or a field is missing / mistyped / out of range.
ModelConfig parse_hf_config(const std::string& config_json_path);

// Throws Error unless the config is usable by the model runner: known architecture, positive sizes,
// num_heads_q % num_heads_kv == 0, even head_dim, known rope type with sane parameters.
void validate(const ModelConfig& c);

}  // namespace retroinfer
