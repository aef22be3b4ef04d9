// Built-in model shapes by name (benchmarks with random weights: no file needed). The figures are those
// of the public Hugging Face config.json of each model.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "retroinfer/model_config.h"

namespace retroinfer {

// "llama3-8b" (Llama-3.1-8B: 32 layers, hidden 4096, 32 q / 8 KV heads of 128, FFN 14336, vocab 128256,
// RoPE theta 500000 with llama3 scaling factor 8 over an original 8192, 131072 positions),
// "qwen2.5-7b" (28 layers, hidden 3584, 28 q / 4 KV heads of 128, FFN 18944, vocab 152064, theta 1e6, QKV
// bias, 32768 positions), "qwen2.5-0.5b" (Qwen2.5-Coder-0.5B: 24 layers, hidden 896, 14 q / 2 KV heads of 64,
// FFN 4864, vocab 151936, otherwise as qwen2.5-7b), "smollm2-135m" (30 layers, hidden 576, 9 q / 3 KV heads of
// 64, FFN 1536, vocab 49152, theta 100000, tied embeddings, 8192 positions). Case-insensitive. Throws Error naming the known
// shapes for any other name. The result passes validate(ModelConfig).
ModelConfig model_shape(std::string_view name);
// The names model_shape() accepts, in a fixed order.
std::vector<std::string> model_shape_names();

// A shape whose max_position_embeddings is raised to at least `tokens`, for throughput benchmarks of
// random-weight shapes beyond the trained context (e.g. Llama-3 at 1M tokens). RoPE is unchanged: the
// default, linear and llama3 frequency tables do not depend on max_position_embeddings (llama3 and yarn
// use rope_scaling.original_max_position, which is kept; this function pins it first when it was 0).
// Throws Error for "dynamic" RoPE, whose frequencies depend on it, and for tokens < 1.
ModelConfig with_max_context(ModelConfig cfg, int64_t tokens);

}  // namespace retroinfer
