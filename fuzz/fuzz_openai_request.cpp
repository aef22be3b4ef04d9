// libFuzzer target: the OpenAI request parser and validator of `retroinfer serve` (parse_completion_request,
// through its public entry point only). The first byte picks /v1/completions or /v1/chat/completions; the
// rest is the body. Any outcome other than a parsed request or ApiError (another exception type, a crash, a
// sanitizer report) is a bug; a parsed request must satisfy the validation it promises.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/openai_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace retroinfer::server;
  if (size == 0) return 0;
  const bool chat = (data[0] & 1) != 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    const CompletionRequest r = parse_completion_request(body, chat);
    // What a request that parses promises the handler (openai_api.h).
    bool ok = r.chat == chat && (!r.max_tokens || *r.max_tokens >= 1) && r.temperature >= 0.0f &&
              r.temperature <= 2.0f && r.top_p > 0.0f && r.top_p <= 1.0f &&
              r.stop.size() <= static_cast<size_t>(kMaxStopStrings) && is_valid_utf8(r.prompt) && is_valid_utf8(r.model);
    if (chat) ok = ok && !r.messages.empty();
    for (const auto& m : r.messages)
      ok = ok && (m.role == "system" || m.role == "user" || m.role == "assistant") && is_valid_utf8(m.content);
    for (const auto& s : r.stop) ok = ok && is_valid_utf8(s);
    if (!ok) std::abort();
  } catch (const ApiError& e) {
    if (e.status() != 400) std::abort();
    // The error object must serialise as the server sends it (invalid UTF-8 the message quotes is replaced).
    (void)error_json(e).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  return 0;
}
