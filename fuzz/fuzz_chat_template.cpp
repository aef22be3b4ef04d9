// libFuzzer target: chat template rendering with arbitrary messages, and the template-name and Jinja-template
// detection that pick the format. Input: byte 0 picks the format (of the 6 known) and add_generation_prompt;
// the rest is split at NUL bytes into role, content, role, content, ... Any outcome other than a rendered
// string or retroinfer::Error is a bug; a rendered conversation must contain every message's content (up to
// surrounding whitespace).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "retroinfer/error.h"
#include "retroinfer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace retroinfer;
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  // The detectors see the raw text (a GGUF tokenizer.chat_template, a --chat-template name).
  (void)detect_chat_format_from_template(rest);
  try {
    (void)parse_chat_format(rest);
  } catch (const Error&) {
  }
  static const ChatFormat kFormats[] = {ChatFormat::kLlama3, ChatFormat::kChatML, ChatFormat::kQwen2,
                                        ChatFormat::kQwen25, ChatFormat::kQwen3,  ChatFormat::kSmolLM2};
  const ChatFormat format = kFormats[(data[0] & 0x7f) % 6];
  const bool add_generation_prompt = (data[0] & 0x80) != 0;
  std::vector<ChatMessage> messages;
  std::vector<std::string_view> fields;
  for (size_t b = 0; b <= rest.size();) {
    size_t e = rest.find('\0', b);
    if (e == std::string_view::npos) e = rest.size();
    fields.push_back(rest.substr(b, e - b));
    b = e + 1;
  }
  for (size_t i = 0; i + 1 < fields.size(); i += 2)
    messages.push_back({std::string(fields[i]), std::string(fields[i + 1])});
  try {
    const std::string out = apply_chat_template(format, messages, add_generation_prompt);
    // Llama 3 trims each content (Jinja's trim) and Qwen3 drops the leading newlines of a final assistant
    // turn: what remains between the ASCII whitespace must appear verbatim.
    constexpr std::string_view kSpace = " \t\n\r\f\v";
    for (const ChatMessage& m : messages) {
      const std::string_view c = m.content;
      const size_t b = c.find_first_not_of(kSpace);
      if (b == std::string_view::npos) continue;
      if (out.find(c.substr(b, c.find_last_not_of(kSpace) - b + 1)) == std::string::npos) std::abort();
    }
  } catch (const Error&) {
  }
  return 0;
}
