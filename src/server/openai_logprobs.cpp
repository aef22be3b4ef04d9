#include "server/openai_logprobs.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "retroinfer/error.h"
#include "server/openai_api.h"

namespace retroinfer::server {

using nlohmann::json;

namespace {

// The bytes of token `id` as text ("" past the tokenizer's vocabulary).
std::string piece(const Tokenizer& tok, int32_t id) {
  if (id < 0 || id >= tok.vocab_size()) return {};
  try {
    return tok.token_to_piece(id);
  } catch (const Error&) {
    return {};
  }
}

// A log-probability as JSON: a number, or the most negative float for a banned token (JSON has no -inf).
json logprob_json(float lp) { return std::isfinite(lp) ? json(lp) : json(-9999.0); }

// A token's name for the "token" fields: its bytes when they are valid UTF-8, else (part of a character)
// "bytes:\\xNN..." as OpenAI writes them, and "token_id:N" for a token without text (an id past the
// tokenizer's vocabulary), so that distinct tokens keep distinct names.
std::string token_name(const std::string& bytes, int32_t id) {
  if (bytes.empty()) return "token_id:" + std::to_string(id);
  if (is_valid_utf8(bytes)) return bytes;
  static const char* kHex = "0123456789abcdef";
  std::string out = "bytes:";
  for (const char c : bytes) {
    const auto b = static_cast<uint8_t>(c);
    out += "\\x";
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

json token_json(const Tokenizer& tok, const TokenLogprob& t) {
  const std::string text = piece(tok, t.token);
  json bytes = json::array();
  for (const char c : text) bytes.push_back(static_cast<int>(static_cast<uint8_t>(c)));
  return {{"token", token_name(text, t.token)}, {"logprob", logprob_json(t.logprob)}, {"bytes", std::move(bytes)}};
}

}  // namespace

json chat_logprobs_json(const Tokenizer& tok, const std::vector<TokenLogprobs>& lps) {
  json content = json::array();
  for (const TokenLogprobs& lp : lps) {
    json t = token_json(tok, lp.sampled);
    json top = json::array();
    for (const TokenLogprob& x : lp.top) top.push_back(token_json(tok, x));
    t["top_logprobs"] = std::move(top);
    content.push_back(std::move(t));
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

json completion_logprobs_json(const Tokenizer& tok, const std::vector<TokenLogprobs>& lps, size_t& offset) {
  json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenLogprobs& lp : lps) {
    const std::string text = piece(tok, lp.sampled.token);
    tokens.push_back(token_name(text, lp.sampled.token));
    token_lps.push_back(logprob_json(lp.sampled.logprob));
    json top = json::object();
    for (const TokenLogprob& x : lp.top) top[token_name(piece(tok, x.token), x.token)] = logprob_json(x.logprob);
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += text.size();
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_lps)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

}  // namespace retroinfer::server
