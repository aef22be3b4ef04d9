// Synthetic decode-attention data for one layer, from a seed: post-RoPE keys and values of a long prompt
// written into a KvCache, then a stream of decode steps (one new K/V token and one query per step).
//
// The generator imitates what is known of real long-context attention, so that sparse-attention methods
// can be compared without a model:
//   - RoPE (rotate-half convention, theta 500000 by default) is applied to keys and queries at their
//     positions, so q·k depends on relative position as in a real model. Semantic content (topics, words,
//     needles, the sink) lives mostly in the low-frequency RoPE pairs, which rotate little over long
//     distances (as measured in trained models); a "local" component lives in mid-frequency pairs and
//     gives the usual recency bias that fades over ~1000 tokens.
//   - Attention sinks: the first tokens have large keys in a direction every query shares (the slowest
//     RoPE pair, reserved for it), so they attract a large share of the mass whatever the content.
//   - Topics: the text is a sequence of segments (geometric lengths); each segment is about one topic of a
//     pool (topics recur). A token's key = shared key bias + topic centre + word prototype (Zipf
//     vocabulary, so keys repeat) + recency part + noise. Topic centres drift slowly with position (an
//     Ornstein-Uhlenbeck walk per KV head), so the same topic far apart is similar but not identical.
//   - Needles: a few tokens at random positions with distinctive keys and values that the queries target
//     strongly (retrieval heads). Their values are distinctive, so missing them costs output accuracy.
//     Needle directions are orthonormal and projected out of every other key direction, so that ordinary
//     tokens do not match a query's needle part by accident.
//   - Values correlate with the keys' topic and word (plus noise); sink values are small.
//   - Queries: each decode step's query mixes the sink direction, the current topic (the topic at the
//     decode position), a few earlier topics the answer refers back to, the needle directions, the recency
//     direction and noise. The noise and the needle weights follow AR(1) processes from step to step
//     (temporal locality). Query heads of one GQA group share the components with per-head gains.
// Strengths are given in logit units (the contribution to q·k·scale at distance 0 with scale 1/sqrt(d))
// so that the knobs read as attention sharpness, independent of head_dim.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "retroinfer/kv_cache.h"

namespace retroinfer::eval {

struct SyntheticConfig {
  // Shape of the generated layer (the KV heads generated; each is independent of the others).
  int num_heads_q = 8;           // query heads; a multiple of num_heads_kv (GQA)
  int num_heads_kv = 2;          // KV heads
  int head_dim = 128;            // even (RoPE pairs dims i and i + head_dim/2)
  int64_t context_tokens = 8192; // prompt tokens written into the cache before decoding
  int decode_steps = 16;         // decode steps: one new K/V token and one query each
  uint64_t seed = 1;             // everything below is a deterministic function of the seed
  double rope_theta = 500000.0;  // RoPE base (Llama-3)
  // Llama-3.1 long-context frequency scaling (factor, low_freq_factor 1, high_freq_factor 4, original
  // context 8192): pairs with wavelength > 8192 tokens rotate 8x slower, a smooth blend down to wavelength
  // 2048. This is what lets a 128K Llama-3.1 keep semantic matches across the whole context; 1 disables.
  double rope_llama3_factor = 8.0;

  // Frequency profile. RoPE pair i (dims i, i + d/2) rotates by theta^(-2i/d) radians per token (before
  // scaling); i = d/2-1 is the slowest. Semantic directions put energy exp(-(d/2-1-i)/semantic_pairs) on
  // pair i: most of it on the ~2*semantic_pairs slowest pairs. With the defaults (d = 128, llama3 scaling)
  // a semantic match keeps 0.97 of its logit at distance 8K, 0.93 at 32K and 0.83 at 128K.
  double semantic_pairs = 8.0;
  // The recency direction uses pairs [d/16, d/4) (rotation 0.19 .. 0.0014 rad/token at d = 128), so its
  // logit boost is local_logit at distance 0 and fades to noise beyond ~1000 tokens.
  double local_logit = 4.0;

  // Keys (norms of the pre-RoPE components; a real key has norm ~10-20 at d = 128).
  double key_bias_norm = 6.0;   // per-head shared offset of every key (real keys have a large mean)
  double topic_key_norm = 6.0;  // topic centre component (times a per-token relevance in [0.5, 1.5])
  double word_key_norm = 4.0;   // word prototype component
  double local_key_norm = 3.0;  // recency component
  double key_noise = 0.4;       // per-dimension std of isotropic key noise
  int num_words = 2048;         // vocabulary of word prototypes per KV head
  double word_zipf = 1.1;       // Zipf exponent of word frequencies

  // Topics.
  int num_topics = 48;             // pool of topic centres per KV head; segments draw from it uniformly
  double topic_span = 768.0;       // mean segment length in tokens (geometric)
  double topic_drift = 0.5;        // stationary norm of the drift added to a (unit) topic centre
  double topic_drift_tokens = 4096.0;  // correlation length of the drift in tokens

  // Sinks: the first sink_tokens tokens. Token 0 scores sink_logit times the head's gain (sink_key_norm
  // along the sink direction), the others half of it. Their values have norm sink_value_norm.
  int sink_tokens = 4;
  double sink_logit = 10.0;
  double sink_key_norm = 30.0;
  double sink_value_norm = 0.2;

  // Needles: num_needles spans of needle_span consecutive tokens at uniform random positions in
  // [sink_tokens, context - 256). Key: key bias + needle_key_norm along needle direction j + a word
  // component + key noise; value: needle_value_norm along needle value j + a word component. A query head
  // with needle gain 1 scores a needle token at needle_logit when its AR weight for that needle is 1.
  // needle_span 1: isolated tokens (a single fact token); > 1: a needle sentence whose tokens share the fact.
  int num_needles = 4;
  int needle_span = 1;
  double needle_logit = 12.0;
  double needle_key_norm = 12.0;
  double needle_value_norm = 3.0;

  // Queries (logit units at distance 0).
  double topic_logit = 3.0;        // a token at the centre of the query's current topic
  int recall_topics = 2;           // earlier topics (from the first 90% of the prompt) the query refers to
  double recall_logit = 3.0;       // a token at the centre of a recalled topic
  double query_noise_logit = 1.0;  // std of the logit noise that the query's random part adds to a key
  double query_drift = 0.1;        // AR(1) innovation per step: correlation 1 - query_drift between steps
  double head_spread = 0.5;        // per-head log-normal spread of the component gains inside a group

  // Values (norms of the components; value directions are isotropic, no RoPE).
  double value_topic_norm = 1.0;
  double value_word_norm = 0.5;
  double value_noise = 0.05;  // per-dimension std
};
// Sets one knob by its field name (e.g. "needle_span", "topic_logit") from a decimal value; the shape,
// context, steps and seed fields are not settable this way. Throws Error naming the knobs on a bad name.
void set_synthetic_knob(SyntheticConfig& c, std::string_view name, double value);

// Throws Error on out-of-range knobs (non-positive sizes, odd head_dim, context shorter than needs, ...).
void validate(const SyntheticConfig& c);

struct SyntheticData {
  int64_t context_tokens = 0;
  int decode_steps = 0;
  // Decode stream: before step s, append k_step/v_step row s to the cache, then attend with query s.
  std::vector<float> k_step;   // [decode_steps, num_heads_kv, head_dim] f32, post-RoPE (position context+s)
  std::vector<float> v_step;   // [decode_steps, num_heads_kv, head_dim] f32
  std::vector<float> queries;  // [decode_steps, num_heads_q, head_dim] f32, post-RoPE (position context+s)
  std::vector<int64_t> needle_positions;  // [num_needles * needle_span], ascending token positions
  std::vector<int> token_topic;           // [context_tokens + decode_steps]: topic id of every token
  std::vector<int> recall_topic_ids;      // [recall_topics]: the earlier topics the queries refer to
};

// Generates the data: writes the prompt's context_tokens tokens into kv (which must be empty and have
// num_heads_kv heads of head_dim; any storage dtype) and returns the decode stream.
SyntheticData generate_synthetic(const SyntheticConfig& cfg, KvCache& kv);

}  // namespace retroinfer::eval
