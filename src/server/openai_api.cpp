#include "server/openai_api.h"

#include <cmath>
#include <string>

namespace retroinfer::server {

using nlohmann::json;

ApiError::ApiError(int status, std::string message, std::string param, std::string code, std::string type)
    : std::runtime_error(std::move(message)),
      status_(status),
      param_(std::move(param)),
      code_(std::move(code)),
      type_(std::move(type)) {}

json error_json(const ApiError& e) {
  return {{"error",
           {{"message", e.what()},
            {"type", e.type()},
            {"param", e.param().empty() ? json(nullptr) : json(e.param())},
            {"code", e.code().empty() ? json(nullptr) : json(e.code())}}}};
}

namespace {

ApiError bad(std::string message, std::string param, std::string code = "invalid_value") {
  return ApiError(400, std::move(message), std::move(param), std::move(code));
}

// The field's value, or nullptr when absent or null (both mean "use the default").
const json* field(const json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

double number_field(const json& v, const char* name) {
  if (!v.is_number()) throw bad(std::string("'") + name + "' must be a number", name, "invalid_type");
  const double x = v.get<double>();
  if (!std::isfinite(x)) throw bad(std::string("'") + name + "' must be finite", name);
  return x;
}

int64_t integer_field(const json& v, const char* name) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) throw bad(std::string("'") + name + "' is too large", name);
    return static_cast<int64_t>(u);
  }
  if (!v.is_number_integer()) throw bad(std::string("'") + name + "' must be an integer", name, "invalid_type");
  return v.get<int64_t>();
}

std::string string_field(const json& v, const std::string& name) {
  if (!v.is_string()) throw bad("'" + name + "' must be a string", name, "invalid_type");
  return v.get<std::string>();
}

// Message content: a string, or an array of {"type": "text", "text": ...} parts (concatenated).
std::string message_content(const json& v, const std::string& param) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_array()) {
    std::string out;
    for (size_t k = 0; k < v.size(); ++k) {
      const json& part = v[k];
      const std::string p = param + "[" + std::to_string(k) + "]";
      if (!part.is_object() || part.value("type", json()) != json("text") || !part.contains("text"))
        throw bad("'" + p + "' must be a {\"type\": \"text\", \"text\": ...} part (only text is supported)", p,
                  "invalid_type");
      out += string_field(part.at("text"), p + ".text");
    }
    return out;
  }
  throw bad("'" + param + "' must be a string or an array of text parts", param, "invalid_type");
}

}  // namespace

CompletionRequest parse_completion_request(std::string_view body, bool chat) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    // nlohmann rejects ill-formed UTF-8 inside strings as a parse error: say which it was. A number literal
    // too large for a double is out_of_range (406), not parse_error: invalid JSON for us too.
    if (!is_valid_utf8(body)) throw bad("the request body is not valid UTF-8", "", "invalid_utf8");
    throw bad(std::string("the request body is not valid JSON: ") + e.what(), "", "invalid_json");
  }
  if (!j.is_object()) throw bad("the request body must be a JSON object", "", "invalid_json");

  CompletionRequest r;
  r.chat = chat;
  if (const json* v = field(j, "model")) r.model = string_field(*v, "model");
  if (chat) {
    const json* v = field(j, "messages");
    if (!v) throw bad("'messages' is required", "messages", "missing_field");
    if (!v->is_array() || v->empty())
      throw bad("'messages' must be a non-empty array of {role, content} objects", "messages", "invalid_type");
    for (size_t i = 0; i < v->size(); ++i) {
      const json& m = (*v)[i];
      const std::string p = "messages[" + std::to_string(i) + "]";
      if (!m.is_object()) throw bad("'" + p + "' must be an object", p, "invalid_type");
      const json* role = field(m, "role");
      if (!role) throw bad("'" + p + ".role' is required", p + ".role", "missing_field");
      ChatMessage msg;
      msg.role = string_field(*role, p + ".role");
      if (msg.role != "system" && msg.role != "user" && msg.role != "assistant")
        throw bad("'" + p + ".role' is '" + msg.role + "'; expected system, user or assistant", p + ".role");
      const json* content = field(m, "content");
      if (!content) throw bad("'" + p + ".content' is required", p + ".content", "missing_field");
      msg.content = message_content(*content, p + ".content");
      r.messages.push_back(std::move(msg));
    }
  } else {
    const json* v = field(j, "prompt");
    if (!v) throw bad("'prompt' is required", "prompt", "missing_field");
    if (!v->is_string())
      throw bad("'prompt' must be a string (token arrays and batches are not supported)", "prompt", "invalid_type");
    r.prompt = v->get<std::string>();
  }
  // max_completion_tokens: the newer name of the chat API (max_tokens wins when both are given).
  const char* max_name = field(j, "max_tokens") || !field(j, "max_completion_tokens") ? "max_tokens"
                                                                                     : "max_completion_tokens";
  if (const json* v = field(j, max_name)) {
    const int64_t n = integer_field(*v, max_name);
    if (n < 1)
      throw bad(std::string("'") + max_name + "' is " + std::to_string(n) + "; it must be at least 1", max_name);
    r.max_tokens = n;  // the upper bound is the context (checked once the prompt is tokenised)
  }
  if (const json* v = field(j, "temperature")) {
    const double t = number_field(*v, "temperature");
    if (t < 0.0 || t > 2.0) throw bad("'temperature' must be in [0, 2]", "temperature");
    r.temperature = static_cast<float>(t);
  }
  if (const json* v = field(j, "top_p")) {
    const double p = number_field(*v, "top_p");
    if (!(p > 0.0 && p <= 1.0)) throw bad("'top_p' must be in (0, 1]", "top_p");
    r.top_p = static_cast<float>(p);
  }
  if (const json* v = field(j, "seed")) r.seed = static_cast<uint64_t>(integer_field(*v, "seed"));
  if (const json* v = field(j, "n")) {
    if (integer_field(*v, "n") != 1) throw bad("'n' must be 1: one choice per request", "n", "unsupported_value");
  }
  if (const json* v = field(j, "stream")) {
    if (!v->is_boolean()) throw bad("'stream' must be a boolean", "stream", "invalid_type");
    r.stream = v->get<bool>();
  }
  if (const json* v = field(j, "stop")) {
    if (v->is_string()) {
      r.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      if (v->size() > static_cast<size_t>(kMaxStopStrings))
        throw bad("'stop' has " + std::to_string(v->size()) + " strings; at most " +
                      std::to_string(kMaxStopStrings) + " are allowed",
                  "stop");
      for (size_t i = 0; i < v->size(); ++i) r.stop.push_back(string_field((*v)[i], "stop[" + std::to_string(i) + "]"));
    } else {
      throw bad("'stop' must be a string or an array of strings", "stop", "invalid_type");
    }
  }
  return r;
}

}  // namespace retroinfer::server
