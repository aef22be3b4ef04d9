// The OpenAI request and response shapes of `retroinfer serve`: parsing + validation of /v1/completions
// and /v1/chat/completions bodies, the error object, and UTF-8 validation. No sockets, no model.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "retroinfer/tokenizer.h"

namespace retroinfer::server {

// A request the server refuses: HTTP status + the OpenAI error fields.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string code = {},
           std::string type = "invalid_request_error");
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  const std::string& type() const { return type_; }

 private:
  int status_;
  std::string param_, code_, type_;
};

// {"error": {"message", "type", "param", "code"}} (param and code are null when empty).
nlohmann::json error_json(const ApiError& e);

// True when `s` is well-formed UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF): the tokenizer's check.
using tokenizer::is_valid_utf8;

// Limits on a request's fields: the largest stop-string list (OpenAI allows 4 stop strings), the top
// alternatives of completions' `logprobs` (OpenAI: 5) and the chat API's `top_logprobs` (OpenAI: 20).
constexpr int kMaxStopStrings = 4;
constexpr int kMaxCompletionLogprobs = 5;
constexpr int kMaxChatTopLogprobs = 20;
constexpr int kMaxChoices = 128;       // n (OpenAI's limit; the server also caps it by --max-batch)
constexpr double kMaxPenalty = 2.0;     // |presence_penalty|, |frequency_penalty| (OpenAI's range)
constexpr double kMaxLogitBias = 100.0; // |logit_bias| values (OpenAI's range)

struct CompletionRequest {
  bool chat = false;                  // /v1/chat/completions
  std::string model;                  // the name asked for; "" = the served model's
  std::string prompt;                 // completions: the prompt text
  std::vector<ChatMessage> messages;  // chat: the conversation
  std::optional<int64_t> max_tokens;  // absent: the server's default (capped by the context)
  float temperature = 1.0f;           // OpenAI's default; 0 = greedy
  float top_p = 1.0f;
  int top_k = 0;                      // extension (as vLLM): 0 = all tokens
  uint64_t seed = 0;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;  // extension (as vLLM): ids that end generation (checked against the vocabulary later)
  bool ignore_eos = false;              // extension (as vLLM): generate max_tokens whatever comes
  bool stream = false;
  bool include_usage = false;           // stream_options.include_usage: a last chunk with the usage
  int n = 1;                            // choices (checked against --max-batch later)
  float presence_penalty = 0.0f;        // [-2, 2]
  float frequency_penalty = 0.0f;       // [-2, 2]
  float repetition_penalty = 1.0f;      // extension (HF / llama.cpp / vLLM): > 0, 1 = off
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias in [-100, 100]) (ids checked later)
  // -1: no logprobs; k >= 0: the sampled tokens' log-probabilities and k alternatives each (chat:
  // logprobs true + top_logprobs k; completions: logprobs k).
  int logprobs = -1;
  bool json_object = false;  // response_format {"type": "json_object"}
};

// Parses and validates a request body; throws ApiError (400) naming the field on invalid JSON, invalid
// UTF-8, a missing or mistyped field, an out-of-range value, an unknown role, or a field this server does
// not support (OpenAI fields such as tools, echo or json_schema, and unrecognised names), code
// "unsupported_parameter". Fields without an effect on the output (user, metadata, ...) are accepted.
CompletionRequest parse_completion_request(std::string_view body, bool chat);

}  // namespace retroinfer::server
