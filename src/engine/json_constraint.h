// Constrained decoding to valid JSON (the OpenAI API's response_format {"type": "json_object"}): a
// TokenConstraint that allows only the tokens whose bytes keep the generated text a prefix of a JSON object
// (RFC 8259), and reports the text complete as soon as the object is closed.
//
// The recogniser is a byte-level pushdown automaton (JsonPrefixState). A token is allowed when every byte of
// its text is accepted from the current state; tokens without text (control tokens, vocabulary holes, ids
// past the tokenizer's vocabulary) and the end-of-generation tokens are never allowed: generation ends
// because the constraint is complete (StopReason::kConstraintComplete), not through an end token. Inside
// strings the bytes must form valid UTF-8 and \u escapes whole surrogate pairs; outside them runs of
// whitespace are capped at kMaxJsonWhitespaceRun bytes (a model stuck on newlines is made to go on) and
// nesting at kMaxJsonDepth.
// Only trailing whitespace may follow the closing brace inside the token that closes it.
//
// Cost per step: the token texts are decoded once per tokenizer (JsonTokenTable, shared by every request);
// each mask() walks the bytes of the tokens whose first byte is allowed, stopping at the first refused byte,
// except inside strings, where tokens of plain text are allowed without a walk.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "retroinfer/sampler.h"
#include "retroinfer/tokenizer.h"

namespace retroinfer {

constexpr int kMaxJsonDepth = 32;          // nested objects/arrays
constexpr int kMaxJsonWhitespaceRun = 32;  // consecutive whitespace bytes outside strings (indented output fits)

// The state of the recogniser after a prefix of the text. Small and trivially copyable (copied per token).
struct JsonPrefixState {
  uint8_t mode = 0;       // internal: what may come next (json_constraint.cpp)
  uint8_t aux = 0;        // internal: hex digits left, literal position, UTF-8 continuation bytes left
  uint8_t literal = 0;    // internal: which of true/false/null
  uint8_t utf8_lead = 0;  // internal: the lead byte of the UTF-8 sequence in progress
  uint8_t surrogate = 0;  // internal: where a \u escape stands with respect to UTF-16 surrogate pairs
  uint8_t key = 0;        // the string in progress is an object key
  uint8_t ws_run = 0;     // consecutive whitespace bytes so far
  uint8_t depth = 0;      // open containers
  uint64_t objects = 0;   // bit d: the container at depth d + 1 is an object (else an array)

  // Feeds one byte; false when the text with it is no prefix of a JSON object (the state is then undefined).
  bool feed(uint8_t c);
  bool feed(std::string_view bytes);
  // The top-level object is closed.
  bool complete() const;
  // Inside a string, between characters: any text of printable ASCII other than '"' and '\\' continues it.
  bool in_string() const;
};

// The bytes of every token id of a model's vocabulary; an empty text marks a token never allowed.
struct JsonTokenTable {
  std::vector<std::string> texts;  // [model vocab]
  // [model vocab]: 1 when the text is printable ASCII (0x20-0x7E) without '"' or '\\': it continues any
  // string without a walk through its bytes (most of a vocabulary: words).
  std::vector<uint8_t> plain;
  // Builds from the tokenizer (skip_special decoding: control tokens have no text) for a model vocabulary of
  // `model_vocab` ids (ids past the tokenizer's have no text) and bans `end_ids`.
  static std::shared_ptr<const JsonTokenTable> build(const Tokenizer& tok, int64_t model_vocab,
                                                     std::span<const int32_t> end_ids);
};

class JsonConstraint final : public TokenConstraint {
 public:
  explicit JsonConstraint(std::shared_ptr<const JsonTokenTable> table);
  void mask(std::span<float> logits) const override;
  void accept(int32_t token) override;
  bool complete() const override { return state_.complete(); }
  const JsonPrefixState& state() const { return state_; }

 private:
  std::shared_ptr<const JsonTokenTable> table_;
  JsonPrefixState state_;
};

}  // namespace retroinfer
