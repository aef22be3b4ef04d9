// Next-token sampling: greedy, temperature, top-k, top-p (nucleus), with a seeded generator so that a
// run is reproducible (same seed + same logits => same tokens, on every platform: the generator is
// std::mt19937_64 and uniforms are built from its bits, not from a library distribution).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace retroinfer {

struct SamplerConfig {
  float temperature = 0.0f;  // 0: greedy (argmax; ties go to the lowest id); > 0 divides the logits
  int top_k = 0;             // keep the k most likely tokens; 0: all
  float top_p = 1.0f;        // keep the smallest prefix of the sorted distribution with mass >= top_p
  uint64_t seed = 0;         // generator seed
};
// Throws Error on temperature < 0, top_k < 0, top_p outside (0, 1], or non-finite values.
void validate(const SamplerConfig& c);

class Sampler {
 public:
  explicit Sampler(const SamplerConfig& cfg);
  // Picks the next token. logits: [vocab] f32. Throws Error when logits are empty or all NaN.
  int32_t sample(std::span<const float> logits);
  // The distribution sample() draws from (after temperature, top-k, top-p; renormalised), sorted by
  // probability descending (ties by id). Greedy returns one entry with probability 1.
  std::vector<std::pair<int32_t, float>> distribution(std::span<const float> logits) const;
  const SamplerConfig& config() const { return cfg_; }

 private:
  SamplerConfig cfg_;
  std::mt19937_64 rng_;
};

// Index of the largest logit (lowest index on ties; NaNs are skipped). logits must be non-empty.
int32_t argmax(std::span<const float> logits);

}  // namespace retroinfer
