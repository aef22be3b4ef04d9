#include "retroinfer/text_generate.h"

#include <algorithm>
#include <chrono>

#include "engine/model_tokenizer.h"
#include "retroinfer/error.h"

namespace retroinfer {

LoadedModel load_model(const std::string& path, const LoadOptions& opt) {
  check_device(opt.engine.device);  // a device that cannot run fails here, before the model is read
  LoadedModel m;
  const auto t0 = std::chrono::steady_clock::now();
  m.file = ModelFile::open(path);
  ModelOptions mo;
  if (opt.reserved_host_bytes > 0) {
    const int64_t available = available_memory_bytes();
    RETROINFER_CHECK(opt.reserved_host_bytes < available, "load: ", opt.reserved_host_bytes >> 20,
                     " MiB reserved (the prefix cache: --prefix-cache-mb) but only ", available >> 20,
                     " MiB of memory are available; reserve less");
    mo.memory_limit_bytes = available - opt.reserved_host_bytes;
  }
  mo.weight_storage = opt.cpu_weights;
  m.model = Model::load(*m.file, mo);
  if (!opt.tokenizer) m.tokenizer = load_model_tokenizer(*m.file);
  else if (!opt.tokenizer->empty()) m.tokenizer = Tokenizer::from_json_file(*opt.tokenizer);
  m.engine = std::make_unique<EngineModel>(*m.model, opt.engine);
  m.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return m;
}

SessionOptions default_session_options(Device device, AttentionKind kind, int head_dim) {
  SessionOptions so;
  so.attention.kind = kind;
  so.kv_dtype = default_kv_dtype(device);
  so.prefill_chunk = default_prefill_chunk(device);
  if (head_dim > 0) so.attention.tokens_per_cluster = default_tokens_per_cluster(head_dim);
  return so;
}

std::vector<int32_t> end_of_generation_ids(const ModelConfig& config, const Tokenizer* tok) {
  std::vector<int32_t> ids;
  if (tok) ids = tok->eog_ids();
  for (int e : config.eos_token_ids)
    if (std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
  if (ids.empty()) ids = {-1};  // matches no sampled token
  return ids;
}

std::vector<int32_t> encode_prompt(const Tokenizer& tok, std::string_view prompt, bool chat, std::string_view system) {
  if (!chat) return tok.encode(prompt, /*add_special=*/true, /*parse_special=*/true);
  std::vector<ChatMessage> msgs;
  if (!system.empty()) msgs.push_back({"system", std::string(system)});
  msgs.push_back({"user", std::string(prompt)});
  // The template writes the special tokens itself (BOS included where the format has one).
  return tok.encode(tok.apply_chat_template(msgs, /*add_generation_prompt=*/true), false, true);
}

GenerateSummary generate_text(const EngineModel& model, const Tokenizer& tok, const SessionOptions& session,
                              std::span<const int32_t> prompt, GenerateOptions opt, const TextGenerateCallbacks& cb,
                              const KvPrefix* context) {
  if (opt.eos_token_ids.empty()) opt.eos_token_ids = end_of_generation_ids(model.config(), &tok);
  StreamingDecoder dec(tok, /*skip_special=*/true);
  const int32_t vocab = tok.vocab_size();
  GenerateCallbacks gc;
  gc.token_text = [&](int32_t t) { return t >= 0 && t < vocab ? dec.push(t) : std::string(); };
  bool stopped_by_callback = false;
  if (cb.on_text)
    gc.on_token = [&](int32_t t, std::string_view text) {
      stopped_by_callback = !cb.on_text(t, text);
      return !stopped_by_callback;
    };
  gc.on_prefill = cb.on_prefill;
  GenerateSummary s = generate(model, session, prompt, opt, gc, nullptr, context);
  const std::string tail = dec.flush();
  if (s.stop_reason != StopReason::kStopString && !tail.empty()) {
    s.text += tail;
    if (cb.on_text && !stopped_by_callback && !s.tokens.empty()) cb.on_text(s.tokens.back(), tail);
  }
  return s;
}

}  // namespace retroinfer
