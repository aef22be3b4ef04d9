// Next-token sampling: greedy, temperature, top-k, top-p (nucleus), with a seeded generator so that a
// run is reproducible (same seed + same logits => same tokens, on every platform: the generator is
// std::mt19937_64 and uniforms are built from its bits, not from a library distribution).
//
// Before the draw the logits may be changed, in this order (each step only when asked for):
//   1. repetition_penalty r (the CTRL / Hugging Face / llama.cpp definition): every token id present in the
//      prompt or the generated tokens has its logit l replaced by l / r when l > 0, by l * r otherwise;
//   2. frequency_penalty f and presence_penalty p (OpenAI's definition): l -= c * f + (c > 0 ? p : 0) where c
//      counts the id among the generated tokens (the prompt is not counted);
//   3. logit_bias: l += bias[id];
//   4. a TokenConstraint (constrained decoding) sets l = -inf for the tokens that may not come next.
// Temperature, top-k and top-p then act on the result. Log-probabilities (logprobs >= 0) are those of the
// changed logits at temperature 1, before temperature, top-k and top-p: log_softmax(l) (docs/server.md
// says why). With none of 1-4 asked for, sampling reads the logits as given (greedy stays argmax of the
// model's logits, bit for bit).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace retroinfer {

// A rule on which tokens may come next (e.g. "the text stays a prefix of valid JSON"), for constrained
// decoding. One object per generation: it holds the state of the text generated so far. Not thread-safe.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets logits[t] = -inf for every token t that may not come next. logits: [vocab] f32.
  virtual void mask(std::span<float> logits) const = 0;
  // The token chosen; it was allowed by the last mask().
  virtual void accept(int32_t token) = 0;
  // True when the text is complete (generation must end now).
  virtual bool complete() const = 0;
};

constexpr int kMaxTopLogprobs = 20;  // OpenAI's limit on top_logprobs

struct SamplerConfig {
  float temperature = 0.0f;  // 0: greedy (argmax; ties go to the lowest id); > 0 divides the logits
  int top_k = 0;             // keep the k most likely tokens; 0: all
  float top_p = 1.0f;        // keep the smallest prefix of the sorted distribution with mass >= top_p
  uint64_t seed = 0;         // generator seed
  float repetition_penalty = 1.0f;  // > 0; 1: off (see the header comment, step 1)
  float frequency_penalty = 0.0f;   // 0: off (step 2)
  float presence_penalty = 0.0f;    // 0: off (step 2)
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id >= 0, finite bias) (step 3)
  // -1: no log-probabilities; k in [0, kMaxTopLogprobs]: the sampled token's log-probability and the k most
  // likely tokens' (Sampler::last_logprobs).
  int logprobs = -1;
  std::shared_ptr<TokenConstraint> constraint;  // step 4; null: none. Used by one generation only.
};
// Throws Error on temperature < 0, top_k < 0, top_p outside (0, 1], repetition_penalty <= 0, a negative
// logit_bias id, logprobs outside [-1, kMaxTopLogprobs], or non-finite values.
void validate(const SamplerConfig& c);

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;  // natural log, <= 0; -inf for a banned token
};
// The log-probabilities at one step: the sampled token's, and the most likely tokens' (probability
// descending, ties by id; tokens of probability 0 are left out).
struct TokenLogprobs {
  TokenLogprob sampled;
  std::vector<TokenLogprob> top;
};

class Sampler {
 public:
  explicit Sampler(const SamplerConfig& cfg);
  // The prompt's tokens (for repetition_penalty); call before the first sample(). Adds to earlier calls.
  void add_prompt(std::span<const int32_t> tokens);
  // Picks the next token and records it (penalties, the constraint, last_logprobs). logits: [vocab] f32.
  // Throws Error when logits are empty or all NaN, a logit_bias id is outside the vocabulary, or the
  // constraint leaves no token.
  int32_t sample(std::span<const float> logits);
  // The distribution sample() draws from now (after steps 1-4, temperature, top-k, top-p; renormalised),
  // sorted by probability descending (ties by id). Greedy returns one entry with probability 1.
  std::vector<std::pair<int32_t, float>> distribution(std::span<const float> logits) const;
  // The log-probabilities of the last sample() (config().logprobs >= 0 only; else empty).
  const TokenLogprobs& last_logprobs() const { return last_logprobs_; }
  const SamplerConfig& config() const { return cfg_; }

 private:
  bool changes_logits() const;
  // Steps 1-4 applied to a copy of `logits` in `out`; throws when no token is left.
  void apply(std::span<const float> logits, std::vector<float>& out) const;

  SamplerConfig cfg_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int32_t> generated_counts_;  // id -> times sampled
  std::unordered_set<int32_t> seen_;                       // ids of the prompt and the generated tokens
  std::vector<float> work_;                                // [vocab]: the changed logits of the last step
  TokenLogprobs last_logprobs_;
};

// Index of the largest logit (lowest index on ties; NaNs are skipped). logits must be non-empty.
int32_t argmax(std::span<const float> logits);

// log_softmax(logits)[i] for the listed ids and the k largest (TokenLogprobs; NaN logits count as -inf).
TokenLogprobs token_logprobs(std::span<const float> logits, int32_t sampled, int k);

}  // namespace retroinfer
