// Rotary position embeddings in the Hugging Face "rotate half" convention, with the scaling types of
// transformers' modeling_rope_utils: default, linear, dynamic (NTK), llama3 and yarn.
//
// For a head vector x of dimension d and position p, with angle a_i = p * inv_freq[i] (i < d/2):
//   y[i]       = x[i] * cos(a_i) * m - x[i + d/2] * sin(a_i) * m
//   y[i + d/2] = x[i + d/2] * cos(a_i) * m + x[i] * sin(a_i) * m
// where m is the attention factor (1 except for yarn: 0.1 ln(factor) + 1 unless given).
#pragma once

#include <cstdint>
#include <vector>

#include "retroinfer/model_config.h"

namespace retroinfer::model {

struct RopeFrequencies {
  std::vector<float> inv_freq;  // [head_dim / 2]
  float attention_factor = 1.0f;  // multiplies cos and sin (yarn)
};

// Frequencies for a forward pass whose largest position is seq_len - 1. Only `dynamic` depends on
// seq_len (Hugging Face recomputes the base once the sequence exceeds max_position_embeddings).
// Throws Error on an unknown type or bad parameters.
RopeFrequencies rope_frequencies(const ModelConfig& cfg, int64_t seq_len);

// cos/sin table for positions [pos0, pos0 + n): cos, sin: [n, head_dim / 2], already multiplied by the
// attention factor. Angles are (float)p * inv_freq[i] in f32 (as transformers computes them), then cos and
// sin in double rounded to f32.
void rope_table(const RopeFrequencies& f, int64_t pos0, int64_t n, float* cos, float* sin);

// Rotates x in place: x [n, heads, head_dim] f32 row-major; cos, sin from rope_table for the same n.
void apply_rope(float* x, int64_t n, int heads, int head_dim, const float* cos, const float* sin);

}  // namespace retroinfer::model
