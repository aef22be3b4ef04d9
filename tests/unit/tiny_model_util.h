// The tiny random-weight Llama-3 fixture shared by the CPU model tests (tests/data/models/tiny-llama3: 512
// positions, vocabulary 512; tests/data/README.md says how it was made), loaded once per test binary, session
// options sized for its short prompts, and a deterministic token stream inside its vocabulary.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "retroinfer/model.h"

namespace retroinfer::test {

// nullptr when the fixture is absent (the callers skip).
inline const Model* tiny_llama3() {
  static const std::unique_ptr<Model> m = [] {
    const std::filesystem::path p = std::filesystem::path(RETROINFER_TEST_DATA) / "models" / "tiny-llama3";
    return std::filesystem::exists(p / "model.safetensors") ? Model::load(p.string()) : nullptr;
  }();
  return m.get();
}

// n token ids in [0, 512) from a linear congruential generator.
inline std::vector<int32_t> token_stream(int n, uint32_t seed) {
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>((seed = seed * 1664525u + 1013904223u) >> 23);
  return t;
}

// Session options for the fixture's short prompts: a steady zone of 16 tokens, retro clusters of 4 tokens, a
// baseline budget of 24 tokens, prefill chunks of 32.
inline SessionOptions tiny_session_options(AttentionKind kind, DType kv_dtype = DType::kF32) {
  SessionOptions so;
  so.attention.kind = kind;
  so.attention.window_tokens = 16;
  so.attention.tokens_per_cluster = 4;
  so.attention.budget_tokens = 24;
  so.prefill_chunk = 32;
  so.kv_dtype = kv_dtype;
  return so;
}

}  // namespace retroinfer::test
