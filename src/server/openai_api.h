// The OpenAI request and response shapes of `retroinfer serve`: parsing + validation of /v1/completions
// and /v1/chat/completions bodies, the error object, and UTF-8 validation. No sockets, no model.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
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

// Limits on a request's fields: the largest stop-string list and max_tokens accepted before the context
// check (OpenAI allows 4 stop strings).
constexpr int kMaxStopStrings = 4;

struct CompletionRequest {
  bool chat = false;                  // /v1/chat/completions
  std::string model;                  // echoed back; "" = the served model's name
  std::string prompt;                 // completions: the prompt text
  std::vector<ChatMessage> messages;  // chat: the conversation
  std::optional<int64_t> max_tokens;  // absent: the server's default (capped by the context)
  float temperature = 1.0f;           // OpenAI's default; 0 = greedy
  float top_p = 1.0f;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  bool stream = false;
};

// Parses and validates a request body; throws ApiError (400) naming the field on invalid JSON, invalid
// UTF-8, a missing or mistyped field, an out-of-range value, n != 1 or an unknown role. Unknown fields are
// ignored (clients send many optional ones).
CompletionRequest parse_completion_request(std::string_view body, bool chat);

}  // namespace retroinfer::server
