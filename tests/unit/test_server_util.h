// Helpers shared by the server tests: the tiny model fixture (tests/data/models/tiny-llama3, vocab 512,
// 512 positions) behind a ServerHandler with the byte-level test tokenizer (ChatML template).
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "retroinfer/engine_model.h"
#include "retroinfer/model.h"
#include "server/server_handler.h"
#include "test_eval_util.h"

namespace retroinfer::test {

inline const Model* server_tiny_model() {
  static const std::unique_ptr<Model> m = [] {
    const std::filesystem::path p = std::filesystem::path(RETROINFER_TEST_DATA) / "models" / "tiny-llama3";
    return std::filesystem::exists(p / "model.safetensors") ? Model::load(p.string()) : nullptr;
  }();
  return m.get();
}

inline const EngineModel& server_tiny_engine() {
  static const EngineModel engine(*server_tiny_model());
  return engine;
}

// The byte-level test tokenizer with the ChatML template (<|im_start|>, <|im_end|> are its special tokens).
inline const Tokenizer& server_tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    auto t = byte_tokenizer();
    t->set_chat_format(ChatFormat::kChatML);
    return t;
  }();
  return *tok;
}

// The options of tiny_handler.
inline server::ServerOptions tiny_server_options(AttentionKind kind = AttentionKind::kFull) {
  server::ServerOptions o;
  o.model_name = "tiny";
  o.session.attention.kind = kind;
  o.session.attention.window_tokens = 16;  // a steady zone well under the test prompts' length
  o.session.prefill_chunk = 128;
  o.prefill_step_tokens = 128;  // prompts over 128 tokens prefill over several iterations (as `serve` does)
  o.default_max_tokens = 8;
  return o;
}

// A handler on the tiny model (nullptr when the fixture is absent); one per attention kind.
inline server::ServerHandler* tiny_handler(AttentionKind kind = AttentionKind::kFull) {
  const Model* m = server_tiny_model();
  if (!m) return nullptr;
  const EngineModel& engine = server_tiny_engine();
  const Tokenizer* tok = &server_tokenizer();
  static std::vector<std::unique_ptr<server::ServerHandler>> handlers(8);
  auto& h = handlers.at(static_cast<size_t>(kind));
  if (!h) {
    h = std::make_unique<server::ServerHandler>(engine, *tok, tiny_server_options(kind));
  }
  return h.get();
}

// The events of an SSE body ("data: X\n\n" each), X as text.
inline std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos || body.compare(pos, 6, "data: ") != 0) {
      out.push_back("<malformed: " + body.substr(pos) + ">");
      break;
    }
    out.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end + 2;
  }
  return out;
}

}  // namespace retroinfer::test
