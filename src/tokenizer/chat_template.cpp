// Hard-coded chat templates (no Jinja engine): each reproduces the model family's Jinja template for
// plain system/user/assistant messages (no tools). Goldens rendered by jinja2 are in tests/data/tokenizer/.
#include <array>

#include "retroinfer/error.h"
#include "retroinfer/tokenizer.h"

namespace retroinfer {
namespace {

struct FormatName {
  ChatFormat format;
  std::string_view name;
};
constexpr std::array<FormatName, 7> kFormatNames{{{ChatFormat::kNone, "none"},
                                                  {ChatFormat::kLlama3, "llama3"},
                                                  {ChatFormat::kChatML, "chatml"},
                                                  {ChatFormat::kQwen2, "qwen2"},
                                                  {ChatFormat::kQwen25, "qwen2.5"},
                                                  {ChatFormat::kQwen3, "qwen3"},
                                                  {ChatFormat::kSmolLM2, "smollm2"}}};

constexpr std::string_view kQwen2System = "You are a helpful assistant.";
constexpr std::string_view kQwen25System = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
constexpr std::string_view kSmolLM2System = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

// Jinja's `trim` filter (Python str.strip()), restricted to ASCII whitespace.
std::string_view trim(std::string_view s) {
  constexpr std::string_view kSpace = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(kSpace);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(kSpace) - b + 1);
}

// Appends a message's content to the rendering and records where it lies.
void add_content(ChatRendering& r, std::string_view content) {
  r.content_spans.emplace_back(r.text.size(), r.text.size() + content.size());
  r.text += content;
}

ChatRendering render_llama3(std::span<const ChatMessage> messages, bool add_generation_prompt) {
  ChatRendering r;
  std::string& out = r.text;
  out = "<|begin_of_text|>";
  for (const ChatMessage& m : messages) {
    out += "<|start_header_id|>";
    out += m.role;
    out += "<|end_header_id|>\n\n";
    add_content(r, trim(m.content));
    out += "<|eot_id|>";
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return r;
}

ChatRendering render_chatml(std::span<const ChatMessage> messages, bool add_generation_prompt,
                          std::string_view default_system, bool qwen3_think) {
  ChatRendering r;
  std::string& out = r.text;
  if (!default_system.empty() && (messages.empty() || messages.front().role != "system")) {
    out += "<|im_start|>system\n";
    out += default_system;
    out += "<|im_end|>\n";
  }
  // Qwen3: the last assistant message after the last user message carries an (empty) think block.
  size_t last_user = messages.size();
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role == "user") last_user = i;
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    out += "<|im_start|>";
    out += m.role;
    out += "\n";
    if (qwen3_think && m.role == "assistant" && last_user < messages.size() && i > last_user &&
        i + 1 == messages.size() && m.content.find("</think>") == std::string::npos) {
      out += "<think>\n\n</think>\n\n";
      const size_t b = m.content.find_first_not_of('\n');
      add_content(r, b == std::string::npos ? std::string_view() : std::string_view(m.content).substr(b));
    } else {
      add_content(r, m.content);
    }
    out += "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return r;
}

}  // namespace

ChatFormat parse_chat_format(std::string_view name) {
  for (const auto& f : kFormatNames) {
    if (f.name == name && f.format != ChatFormat::kNone) return f.format;
  }
  RETROINFER_FAIL("unknown chat template '", name, "'; use one of llama3, chatml, qwen2, qwen2.5, qwen3, smollm2");
}

std::string_view chat_format_name(ChatFormat format) {
  for (const auto& f : kFormatNames) {
    if (f.format == format) return f.name;
  }
  return "none";
}

ChatFormat detect_chat_format_from_template(std::string_view t) {
  auto has = [&](std::string_view s) { return t.find(s) != std::string_view::npos; };
  if (t.empty()) return ChatFormat::kNone;
  if (has("<|start_header_id|>")) return ChatFormat::kLlama3;
  if (!has("<|im_start|>")) return ChatFormat::kNone;
  if (has("SmolLM")) return ChatFormat::kSmolLM2;
  if (has(kQwen25System)) return ChatFormat::kQwen25;
  if (has(kQwen2System)) return ChatFormat::kQwen2;
  if (has("<think>")) return ChatFormat::kQwen3;
  return ChatFormat::kChatML;
}

std::string apply_chat_template(ChatFormat format, std::span<const ChatMessage> messages,
                                bool add_generation_prompt) {
  return render_chat_template(format, messages, add_generation_prompt).text;
}

ChatRendering render_chat_template(ChatFormat format, std::span<const ChatMessage> messages,
                                   bool add_generation_prompt) {
  switch (format) {
    case ChatFormat::kLlama3: return render_llama3(messages, add_generation_prompt);
    case ChatFormat::kChatML: return render_chatml(messages, add_generation_prompt, {}, false);
    case ChatFormat::kQwen2: return render_chatml(messages, add_generation_prompt, kQwen2System, false);
    case ChatFormat::kQwen25: return render_chatml(messages, add_generation_prompt, kQwen25System, false);
    case ChatFormat::kQwen3: return render_chatml(messages, add_generation_prompt, {}, true);
    case ChatFormat::kSmolLM2: return render_chatml(messages, add_generation_prompt, kSmolLM2System, false);
    case ChatFormat::kNone: break;
  }
  RETROINFER_FAIL("apply_chat_template: no chat template known for this model; choose one with "
                  "--chat-template (llama3, chatml, qwen2, qwen2.5, qwen3, smollm2)");
}

}  // namespace retroinfer
