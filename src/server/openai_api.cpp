#include "server/openai_api.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>
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

bool bool_field(const json& v, const std::string& name) {
  if (!v.is_boolean()) throw bad("'" + name + "' must be a boolean", name, "invalid_type");
  return v.get<bool>();
}

ApiError unsupported(const std::string& name, const std::string& why) {
  return ApiError(400, "'" + name + "' is not supported by this server: " + why, name, "unsupported_parameter");
}

// A number field within [lo, hi].
double ranged_field(const json& j, const char* name, double lo, double hi, double dflt) {
  const json* v = field(j, name);
  if (!v) return dflt;
  const double x = number_field(*v, name);
  if (x < lo || x > hi) {
    std::ostringstream m;
    m << "'" << name << "' is " << x << "; it must be in [" << lo << ", " << hi << "]";
    throw bad(m.str(), name);
  }
  return x;
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

// Every field of the body is one this server implements, one without an effect on the output, or one
// given its neutral value; anything else is a 400 naming it (as OpenAI does for unrecognised arguments).
void check_fields(const json& j, bool chat, const CompletionRequest& r) {
  static const std::set<std::string> common = {
      "model", "max_tokens", "temperature", "top_p", "seed", "n", "stream", "stream_options", "stop",
      "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "user",
      // extensions (as vLLM)
      "top_k", "repetition_penalty", "stop_token_ids", "ignore_eos"};
  static const std::set<std::string> chat_only = {
      "messages", "max_completion_tokens", "top_logprobs", "response_format",
      // no effect on the output: accepted and ignored
      "metadata", "service_tier", "safety_identifier", "prompt_cache_key", "parallel_tool_calls"};
  static const std::set<std::string> completions_only = {"prompt", "max_completion_tokens"};
  for (const auto& [key, value] : j.items()) {
    if (common.count(key) || (chat ? chat_only : completions_only).count(key) || value.is_null()) continue;
    // Fields accepted at their neutral value only.
    const bool empty_array = value.is_array() && value.empty();
    if ((key == "tools" || key == "functions") && empty_array) continue;
    if ((key == "tool_choice" || key == "function_call") && value == json("none")) continue;
    if (key == "tools" || key == "functions" || key == "tool_choice" || key == "function_call")
      throw unsupported(key, "tool and function calling are not implemented");
    if (chat && key == "modalities" && value == json::array({"text"})) continue;
    if (chat && key == "store" && value == json(false)) continue;
    if (chat && key == "store") throw unsupported(key, "completions are not stored");
    if (!chat && key == "echo") {
      if (value == json(false)) continue;
      throw unsupported(key, "the prompt is not echoed back");
    }
    if (!chat && key == "suffix") {
      if (value == json("")) continue;
      throw unsupported(key, "insertion (text after the completion) is not implemented");
    }
    if (!chat && key == "best_of") {
      if (value.is_number_integer() && value.get<int64_t>() == r.n) continue;
      throw unsupported(key, "server-side best-of selection is not implemented (best_of must equal n)");
    }
    if (chat && (key == "audio" || key == "modalities"))
      throw unsupported(key, "this server produces text only");
    if (chat && (key == "reasoning_effort" || key == "verbosity"))
      throw unsupported(key, "the model has no reasoning or verbosity control");
    if (chat && key == "prediction") throw unsupported(key, "predicted outputs are not implemented");
    if (chat && key == "web_search_options") throw unsupported(key, "web search is not available");
    if (!chat && (key == "top_logprobs" || key == "response_format"))
      throw unsupported(key, "it is a chat completions field; completions take 'logprobs' (an integer)");
    throw unsupported(key, std::string("it is not a field of the OpenAI ") +
                               (chat ? "chat completions" : "completions") + " API that this server implements");
  }
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
  if (const json* v = field(j, "stream")) r.stream = bool_field(*v, "stream");
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
  if (const json* v = field(j, "top_k")) {
    const int64_t k = integer_field(*v, "top_k");
    if (k < -1) throw bad("'top_k' must be >= 0 (0 or -1: all tokens)", "top_k");
    r.top_k = k < 0 ? 0 : static_cast<int>(std::min<int64_t>(k, INT32_MAX));
  }
  if (const json* v = field(j, "n")) {
    const int64_t n = integer_field(*v, "n");
    if (n < 1 || n > kMaxChoices)
      throw bad("'n' is " + std::to_string(n) + "; it must be in [1, " + std::to_string(kMaxChoices) + "]", "n");
    r.n = static_cast<int>(n);
  }
  if (const json* v = field(j, "stream_options")) {
    if (!v->is_object()) throw bad("'stream_options' must be an object", "stream_options", "invalid_type");
    if (!r.stream) throw bad("'stream_options' is only allowed with 'stream': true", "stream_options");
    for (const auto& [key, value] : v->items()) {
      const std::string name = "stream_options." + key;
      if (key == "include_usage") {
        if (!value.is_null()) r.include_usage = bool_field(value, name);
      } else if (key != "include_obfuscation") {  // obfuscation pads chunks against side channels: not needed here
        throw unsupported(name, "the stream options are include_usage and include_obfuscation");
      }
    }
  }
  r.presence_penalty = static_cast<float>(ranged_field(j, "presence_penalty", -kMaxPenalty, kMaxPenalty, 0.0));
  r.frequency_penalty = static_cast<float>(ranged_field(j, "frequency_penalty", -kMaxPenalty, kMaxPenalty, 0.0));
  if (const json* v = field(j, "repetition_penalty")) {
    const double x = number_field(*v, "repetition_penalty");
    if (!(x > 0.0)) throw bad("'repetition_penalty' must be > 0 (1: off)", "repetition_penalty");
    r.repetition_penalty = static_cast<float>(x);
  }
  if (const json* v = field(j, "logit_bias")) {
    if (!v->is_object())
      throw bad("'logit_bias' must be an object mapping token ids (as strings) to biases in [-100, 100]",
                "logit_bias", "invalid_type");
    for (const auto& [key, value] : v->items()) {
      const std::string name = "logit_bias." + key;
      const bool digits = !key.empty() && key.size() <= 9 &&
                          key.find_first_not_of("0123456789") == std::string::npos;
      if (!digits) throw bad("'logit_bias' key '" + key + "' is not a token id (a decimal integer >= 0)", "logit_bias");
      const double b = number_field(value, name.c_str());
      if (b < -kMaxLogitBias || b > kMaxLogitBias)
        throw bad("'" + name + "' must be in [-100, 100]", "logit_bias");
      r.logit_bias.emplace_back(std::stoi(key), static_cast<float>(b));
    }
  }
  if (const json* v = field(j, "stop_token_ids")) {
    if (!v->is_array()) throw bad("'stop_token_ids' must be an array of token ids", "stop_token_ids", "invalid_type");
    for (size_t i = 0; i < v->size(); ++i) {
      const std::string name = "stop_token_ids[" + std::to_string(i) + "]";
      const int64_t id = integer_field((*v)[i], name.c_str());
      if (id < 0 || id > INT32_MAX) throw bad("'" + name + "' must be a token id >= 0", "stop_token_ids");
      r.stop_token_ids.push_back(static_cast<int32_t>(id));
    }
  }
  if (const json* v = field(j, "ignore_eos")) r.ignore_eos = bool_field(*v, "ignore_eos");
  if (chat) {
    const bool want = field(j, "logprobs") && bool_field(*field(j, "logprobs"), "logprobs");
    if (const json* v = field(j, "top_logprobs")) {
      const int64_t k = integer_field(*v, "top_logprobs");
      if (k < 0 || k > kMaxChatTopLogprobs)
        throw bad("'top_logprobs' must be in [0, " + std::to_string(kMaxChatTopLogprobs) + "]", "top_logprobs");
      if (!want) throw bad("'top_logprobs' needs 'logprobs': true", "top_logprobs");
      r.logprobs = static_cast<int>(k);
    } else if (want) {
      r.logprobs = 0;
    }
  } else if (const json* v = field(j, "logprobs")) {
    const int64_t k = integer_field(*v, "logprobs");
    if (k < 0 || k > kMaxCompletionLogprobs)
      throw bad("'logprobs' must be in [0, " + std::to_string(kMaxCompletionLogprobs) + "]", "logprobs");
    r.logprobs = static_cast<int>(k);
  }
  if (const json* v = field(j, "response_format")) {
    const json* type = v->is_object() ? field(*v, "type") : nullptr;
    if (!type || !type->is_string())
      throw bad("'response_format' must be an object with a 'type' (text or json_object)", "response_format",
                "invalid_type");
    const std::string t = type->get<std::string>();
    if (t == "json_object") {
      r.json_object = true;
    } else if (t == "json_schema") {
      throw unsupported("response_format", "type json_schema (constrained decoding to a schema) is not implemented; "
                                           "use {\"type\": \"json_object\"} for any valid JSON object");
    } else if (t != "text") {
      throw bad("'response_format.type' is '" + t + "'; expected text, json_object or json_schema",
                "response_format");
    }
  }
  check_fields(j, chat, r);
  return r;
}

}  // namespace retroinfer::server
