// Text in, text out, on top of generate.h: a model file loaded with its tokenizer onto a device, the
// session defaults of a device and model, prompts encoded as `retroinfer generate` encodes them (plain with
// the tokenizer's special prefix, or wrapped in the chat template), the end-of-generation ids, and
// generation streamed through a detokenizer. The CLI (`retroinfer generate`) and the Python bindings
// (python/) both call these, so the same request gives the same tokens and text in both.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "retroinfer/engine_model.h"
#include "retroinfer/generate.h"
#include "retroinfer/model.h"
#include "retroinfer/model_file.h"
#include "retroinfer/tokenizer.h"

namespace retroinfer {

struct LoadOptions {
  EngineOptions engine;  // device (resolved, not "auto") and its weight type
  WeightStorage cpu_weights = WeightStorage::kBlocks;  // how the CPU model keeps block-type weights (model.h)
  // The tokenizer: unset = the model's own (tokenizer.json beside the weights, or the GGUF vocabulary);
  // a path = that tokenizer.json; "" = none (token ids only).
  std::optional<std::string> tokenizer;
  // Host bytes kept out of the model's memory budget (Model::memory_limit_bytes): a prefix cache's capacity
  // (prefix_cache.h), so that every session's memory check counts it. Error when it leaves nothing.
  int64_t reserved_host_bytes = 0;
};

// A model file, its CPU weights, its tokenizer and its runner on one device, owned together. Members are
// declared in dependency order (engine borrows model; destroyed first).
struct LoadedModel {
  std::unique_ptr<ModelFile> file;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;  // null when LoadOptions::tokenizer is ""
  std::unique_ptr<EngineModel> engine;   // the model on the device (cuda: weights uploaded once)
  double load_seconds = 0.0;             // file + CPU weights + tokenizer + upload to the device
};
// Opens `path` (a HF directory, a .safetensors or .gguf file: ModelFile::open), loads the weights and the
// tokenizer, and puts the model on opt.engine.device (check_device first, so a device that cannot run
// fails before the file is read). Throws Error on any failure.
LoadedModel load_model(const std::string& path, const LoadOptions& opt = {});

// Session options with the defaults that depend on the device and the model: the KV dtype
// (default_kv_dtype), the prefill block (default_prefill_chunk) and, for head_dim > 0, the cluster size
// (default_tokens_per_cluster); every other AttentionConfig field keeps its default.
SessionOptions default_session_options(Device device, AttentionKind kind, int head_dim = 0);

// Token ids that end a generation: the tokenizer's end-of-generation ids (Tokenizer::eog_ids), then the
// model config's eos ids not already listed; {-1} when neither names one (only max tokens and stop
// strings end it then). tok may be null (config ids only).
std::vector<int32_t> end_of_generation_ids(const ModelConfig& config, const Tokenizer* tok);

// The prompt's token ids as `retroinfer generate` makes them: plain text gets the tokenizer's special
// prefix/suffix (add_special) and special tokens written in the text are recognised; chat wraps the text
// in the tokenizer's chat template as one user turn (after `system`, when non-empty), with the assistant
// header appended. Throws Error when chat is asked of a tokenizer without a known template.
std::vector<int32_t> encode_prompt(const Tokenizer& tok, std::string_view prompt, bool chat = false,
                                   std::string_view system = {});

// Called with the text that may be shown now (possibly empty) for every generated token, and once more
// with the last token for the detokenizer's tail at the end; return false to stop.
using TextCallback = std::function<bool(int32_t token, std::string_view text)>;

struct TextGenerateCallbacks {
  TextCallback on_text;        // optional
  PrefillProgress on_prefill;  // optional
};

// generate() (generate.h) with a streaming detokenizer (skip_special) for the text and the stop strings.
// opt.eos_token_ids empty => end_of_generation_ids(model config, &tok). The summary's text ends with the
// detokenizer's flushed tail (an incomplete UTF-8 sequence at the end becomes U+FFFD) unless a stop string
// ended the generation; every text passed to on_text and the summary's text are valid UTF-8. Ids of
// model rows beyond the tokenizer's vocabulary (padded embeddings) give no text.
// context: optional, a prefilled context the prompt starts with (a snapshot's; generate()'s `context`).
GenerateSummary generate_text(const EngineModel& model, const Tokenizer& tok, const SessionOptions& session,
                              std::span<const int32_t> prompt, GenerateOptions opt,
                              const TextGenerateCallbacks& cb = {}, const KvPrefix* context = nullptr);

}  // namespace retroinfer
