// `retroinfer snapshot save`: prefills a prompt (a long document) once and saves the context — its tokens and
// K/V, with the model identity and the attention configuration — to a file that `generate --snapshot` and
// `serve --preload` load instead of prefilling it again (docs/prefix-cache.md).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "command.h"
#include "model_cli.h"
#include "retroinfer/error.h"
#include "retroinfer/snapshot.h"

namespace retroinfer::cli {
namespace {

struct SnapshotCliOptions {
  ModelCliOptions model;
  std::string prompt, prompt_file, system, attention = "retro", out;
  bool chat = false;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void run_snapshot_save(const SnapshotCliOptions& o) {
  RETROINFER_CHECK(o.prompt.empty() != o.prompt_file.empty(), "snapshot save: give exactly one of --prompt and --prompt-file");
  std::string prompt = o.prompt;
  if (!o.prompt_file.empty()) {
    std::ifstream f(o.prompt_file, std::ios::binary);
    RETROINFER_CHECK(f.good(), "snapshot save: cannot read --prompt-file '", o.prompt_file, "'");
    std::stringstream ss;
    ss << f.rdbuf();
    prompt = ss.str();
  }
  const AttentionKind kind = parse_attention_kind(o.attention);
  make_session_options(o.model, kind);  // bad flags fail before the model is read
  LoadedModel m = load_model(o.model);
  SessionOptions so = make_session_options(o.model, kind, m.model->config().head_dim);
  const std::vector<int32_t> ids = encode_prompt(*m.tokenizer, prompt, o.chat, o.system);
  RETROINFER_CHECK(!ids.empty(), "snapshot save: the prompt encodes to no tokens");
  so.max_context = static_cast<int64_t>(ids.size());
  const std::unique_ptr<SequenceSession> session = make_session(*m.engine, so);
  RETROINFER_CHECK(session->supports_prefix(), "snapshot save: the ", device_name(session->device()),
                   " runner does not export its K/V yet; use --device cpu");
  ProgressBar bar("prefill");
  const auto t0 = std::chrono::steady_clock::now();
  session->prefill(ids, false, [&](int64_t done, int64_t total) {
    bar.update(done, total);
    if (done == total) bar.finish();
  });
  const double prefill_s = seconds_since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  save_snapshot(o.out, make_snapshot(*session, ids, model_identity(*m.model, m.tokenizer.get())));
  const double save_s = seconds_since(t1);
  std::fprintf(stderr, "--- snapshot %s: %lld tokens, %.1f MiB, prefill %.2f s, saved in %.2f s (%s attention, KV %s)\n",
               o.out.c_str(), static_cast<long long>(ids.size()),
               static_cast<double>(std::filesystem::file_size(o.out)) / (1 << 20), prefill_s, save_s, o.attention.c_str(),
               std::string(dtype_name(so.kv_dtype)).c_str());
}

void setup_snapshot(CLI::App& app) {
  auto o = std::make_shared<SnapshotCliOptions>();
  auto* group = app.add_subcommand("snapshot", "Prefilled contexts saved to files (docs/prefix-cache.md)");
  group->require_subcommand(1);
  auto* cmd = group->add_subcommand("save", "Prefill a prompt once and save its context (tokens, K/V) to a file");
  add_model_options(cmd, o->model);
  cmd->add_option("--prompt", o->prompt, "Prompt text (the document)");
  cmd->add_option("--prompt-file", o->prompt_file, "Read the prompt from a file");
  cmd->add_flag("--chat", o->chat, "Wrap the prompt in the model's chat template as a user turn");
  cmd->add_option("--system", o->system, "System message (with --chat)");
  cmd->add_option("--attention", o->attention,
                  "Attention the snapshot is for: full, retro, quest, streaming, oracle (loading checks it)")
      ->capture_default_str();
  cmd->add_option("--out", o->out, "The snapshot file (written to a temporary file beside it, then renamed)")->required();
  cmd->callback([o] { run_snapshot_save(*o); });
}
RETROINFER_COMMAND(setup_snapshot);

}  // namespace
}  // namespace retroinfer::cli
