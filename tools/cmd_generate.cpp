// `retroinfer generate`: runs one prompt through a model on the CPU or the GPU (--device), streams the
// output to stdout, shows prefill progress and a summary on stderr.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "command.h"
#include "engine/kv_placement_json.h"
#include "model_cli.h"
#include "retroinfer/cluster_trace.h"
#include "retroinfer/error.h"
#include "retroinfer/generate.h"
#include "retroinfer/snapshot.h"
#include "retroinfer/text_generate.h"

namespace retroinfer::cli {
namespace {

struct GenerateCliOptions {
  ModelCliOptions model;
  std::string prompt, prompt_file, system, attention = "retro", json_path;
  std::string record_trace;  // --record-trace: cluster trace file (retro only)
  std::string snapshot;      // --snapshot: a saved context the prompt continues
  bool chat = false, ignore_eos = false;
  int max_new_tokens = 128;
  float temperature = 0.0f, top_p = 1.0f;
  int top_k = 0;
  uint64_t seed = 0;
  std::vector<std::string> stops;
};

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

nlohmann::json summary_json(const GenerateSummary& s, const std::string& model, const EngineModel& engine,
                            double load_s) {
  nlohmann::json j = {{"model", model},
          {"device", std::string(device_name(engine.device()))},
          {"device_description", engine.description()},
          {"attention", s.attention},
          {"prompt_tokens", s.prompt_tokens},
          {"generated_tokens", s.generated_tokens},
          {"decode_steps", s.decode_steps},
          {"load_s", load_s},
          {"prefill_s", s.prefill_seconds},
          {"decode_s", s.decode_seconds},
          {"ttft_s", s.time_to_first_token_s},
          {"prefill_tok_s", s.prefill_tokens_per_s},
          {"decode_tok_s", s.decode_tokens_per_s},
          {"kv_read_share", s.kv_read_share},
          {"mean_exact_tokens_per_head", s.mean_exact_tokens_per_head},
          {"stop_reason", std::string(stop_reason_name(s.stop_reason))},
          {"threads", num_threads()},
          {"text", s.text},
          {"tokens", s.tokens}};
  add_kv_placement_json(j, s.kv_placement);
  return j;
}

// --record-trace: a cluster trace of every decode step's retrieval selections (retro only).
std::shared_ptr<ClusterTraceWriter> open_cluster_trace(const GenerateCliOptions& o, const LoadedModel& m,
                                                       size_t prompt_tokens) {
  const ModelConfig& c = m.model->config();
  ClusterTraceHeader h;
  h.num_layers = c.num_layers;
  h.num_heads_kv = c.num_heads_kv;
  h.head_dim = c.head_dim;
  h.source = "model=" + m.model->path() + " device=" + m.engine->description() +
             " prompt_tokens=" + std::to_string(prompt_tokens) + " max_new_tokens=" + std::to_string(o.max_new_tokens);
  return std::make_shared<ClusterTraceWriter>(o.record_trace, h);
}

void run_generate(const GenerateCliOptions& o) {
  RETROINFER_CHECK(!(!o.prompt.empty() && !o.prompt_file.empty()) && (o.prompt.empty() != o.prompt_file.empty() ||
                                                                     !o.snapshot.empty()),
                   "generate: give exactly one of --prompt and --prompt-file (or neither, with --snapshot)");
  RETROINFER_CHECK(o.snapshot.empty() || !o.chat, "generate: --chat wraps the whole prompt in the chat template; with "
                   "--snapshot the prompt continues the saved context as plain text (save the context with --chat)");
  std::string prompt = o.prompt;
  if (!o.prompt_file.empty()) {
    std::ifstream f(o.prompt_file, std::ios::binary);
    RETROINFER_CHECK(f.good(), "generate: cannot read --prompt-file '", o.prompt_file, "'");
    std::stringstream ss;
    ss << f.rdbuf();
    prompt = ss.str();
  }
  const AttentionKind kind = parse_attention_kind(o.attention);
  make_session_options(o.model, kind);  // bad attention flags fail before the model is read
  RETROINFER_CHECK(o.record_trace.empty() || kind == AttentionKind::kRetro, "generate: --record-trace records retro's "
                   "cluster selections; use --attention retro (got '", o.attention, "')");
  LoadedModel m = load_model(o.model);
  const SessionOptions so = make_session_options(o.model, kind, m.model->config().head_dim);
  calibrate_kv_keys(m, so, "generate");
  const Tokenizer& tok = *m.tokenizer;

  std::vector<int32_t> ids;
  std::optional<Snapshot> snap;
  double snapshot_load_s = 0.0;
  if (!o.snapshot.empty()) {
    const double t0 = now_seconds();
    snap = load_snapshot(o.snapshot);
    check_snapshot(*snap, model_identity(*m.model, &tok), so.kv_dtype, so.attention, o.snapshot);
    snapshot_load_s = now_seconds() - t0;
    // The continuation: plain text without the tokenizer's special prefix (the context has it).
    ids = snap->context.tokens;
    for (int32_t t : tok.encode(prompt, /*add_special=*/false, /*parse_special=*/true)) ids.push_back(t);
  } else {
    ids = encode_prompt(tok, prompt, o.chat, o.system);
  }
  RETROINFER_CHECK(!ids.empty(), "generate: the prompt encodes to no tokens");
  SessionOptions session_opt = so;
  if (!o.record_trace.empty()) session_opt.cluster_trace = open_cluster_trace(o, m, ids.size());

  GenerateOptions go;
  go.max_new_tokens = o.max_new_tokens;
  go.sampler.temperature = o.temperature;
  go.sampler.top_k = o.top_k;
  go.sampler.top_p = o.top_p;
  go.sampler.seed = o.seed;
  go.stop_strings = o.stops;
  go.ignore_eos = o.ignore_eos;
  go.eos_token_ids = end_of_generation_ids(m.model->config(), &tok);

  ProgressBar bar("prefill");
  TextGenerateCallbacks cb;
  cb.on_text = [&](int32_t, std::string_view text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return true;
  };
  cb.on_prefill = [&](int64_t done, int64_t total) {
    bar.update(done, total);
    if (done == total) bar.finish();
  };
  const GenerateSummary s = generate_text(*m.engine, tok, session_opt, ids, go, cb, snap ? &snap->context : nullptr);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  std::fprintf(stderr,
               "--- %s attention, %s | prompt %lld tokens: prefill %.2f s (%.1f tok/s) | generated %lld "
               "tokens (%s): decode %.2f s (%.2f tok/s) | TTFT %.2f s\n"
               "--- KV read per decode step: %.2f%% of the cached tokens (mean %.1f tokens per layer and KV head)\n",
               s.attention.c_str(), m.engine->description().c_str(), static_cast<long long>(s.prompt_tokens), s.prefill_seconds,
               s.prefill_tokens_per_s, static_cast<long long>(s.generated_tokens),
               std::string(stop_reason_name(s.stop_reason)).c_str(), s.decode_seconds, s.decode_tokens_per_s,
               s.time_to_first_token_s, 100.0 * s.kv_read_share, s.mean_exact_tokens_per_head);
  if (s.kv_placement) std::fprintf(stderr, "--- %s\n", kv_placement_line(*s.kv_placement).c_str());
  if (snap)
    std::fprintf(stderr, "--- snapshot %s: %lld context tokens loaded in %.2f s, %lld prompt tokens reused\n",
                 o.snapshot.c_str(), static_cast<long long>(snap->context.size()), snapshot_load_s,
                 static_cast<long long>(s.reused_tokens));
  if (session_opt.cluster_trace) {
    session_opt.cluster_trace->flush();
    std::fprintf(stderr, "--- cluster trace: %s (%lld records; replay: retroinfer trace replay --trace %s)\n",
                 o.record_trace.c_str(), static_cast<long long>(session_opt.cluster_trace->records_written()),
                 o.record_trace.c_str());
  }
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    RETROINFER_CHECK(f.good(), "generate: cannot write --json '", o.json_path, "'");
    nlohmann::json j = summary_json(s, m.model->path(), *m.engine, m.load_seconds);
    if (!o.record_trace.empty()) j["cluster_trace"] = o.record_trace;
    if (snap) {
      j["snapshot"] = o.snapshot;
      j["snapshot_load_s"] = snapshot_load_s;
    }
    j["reused_tokens"] = s.reused_tokens;
    f << j.dump(2) << "\n";
  }
}

void setup_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateCliOptions>();
  auto* cmd = app.add_subcommand("generate", "Generate text from a prompt (on the CPU or the GPU: --device)");
  o->model.device = "auto";  // this engine's defaults: the GPU when usable, retro attention
  add_model_options(cmd, o->model);
  cmd->add_option("--prompt", o->prompt, "Prompt text");
  cmd->add_option("--prompt-file", o->prompt_file, "Read the prompt from a file");
  cmd->add_flag("--chat", o->chat, "Wrap the prompt in the model's chat template as a user turn");
  cmd->add_option("--system", o->system, "System message (with --chat)");
  cmd->add_option("--attention", o->attention, "Decode attention: full, retro, quest, streaming, oracle")
      ->capture_default_str();
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "Tokens to generate at most")->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--temperature", o->temperature, "Sampling temperature; 0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "Keep the k most likely tokens (0 = all)")->capture_default_str();
  cmd->add_option("--top-p", o->top_p, "Nucleus sampling mass")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--stop", o->stops, "Stop string (repeatable); not printed");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Do not stop at end-of-sequence tokens");
  cmd->add_option("--json", o->json_path, "Write the summary as JSON to this file");
  cmd->add_option("--record-trace", o->record_trace,
                  "Record retro's retrieval clusters per decode step, layer and KV head to this file "
                  "(replay: retroinfer trace replay)");
  cmd->add_option("--snapshot", o->snapshot,
                  "A context saved by `retroinfer snapshot save`: the prompt (plain text, may be empty) continues it "
                  "and only the prompt is prefilled (CPU runner)");
  cmd->callback([o] { run_generate(*o); });
}
RETROINFER_COMMAND(setup_generate);

}  // namespace
}  // namespace retroinfer::cli
