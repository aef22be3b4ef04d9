// The OpenAI log-probability objects of a reply (logprobs / top_logprobs): a choice's sampled tokens with
// their log-probabilities and top alternatives, in the chat API's and the completions API's shapes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "retroinfer/sampler.h"
#include "retroinfer/tokenizer.h"

namespace retroinfer::server {

// The chat API's choice.logprobs: {"content": [{token, logprob, bytes, top_logprobs: [...]}], "refusal": null}.
nlohmann::json chat_logprobs_json(const Tokenizer& tok, const std::vector<TokenLogprobs>& lps);

// The completions API's choice.logprobs: {tokens, token_logprobs, top_logprobs: [{token: logprob}],
// text_offset}; `offset` (bytes of the completion text before these tokens) advances.
nlohmann::json completion_logprobs_json(const Tokenizer& tok, const std::vector<TokenLogprobs>& lps, size_t& offset);

}  // namespace retroinfer::server
