// `retroinfer bench generate`: end-to-end prefill and decode throughput of each attention method on a
// prompt of a requested token length, as JSON lines, on the runner of --device (cpu or cuda).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "command.h"
#include "engine/kv_placement_json.h"
#include "model_cli.h"
#include "retroinfer/error.h"
#include "retroinfer/generate.h"

namespace retroinfer::cli {

// Debian's bible-kjv-text stores the King James Bible compressed; its `bible` program prints it.
constexpr const char* kBibleCommand = "bible 'Ge1:1-Re22:21' 2>/dev/null";

std::string bench_text(const std::string& path) {
  if (!path.empty()) {
    std::ifstream f(path, std::ios::binary);
    RETROINFER_CHECK(f.good(), "bench: cannot read --text '", path, "'");
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  std::string out;
  if (FILE* p = popen(kBibleCommand, "r")) {
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    pclose(p);
  }
  RETROINFER_CHECK(out.size() > 1000, "bench: no prompt text: install bible-kjv (scripts/setup.sh) or pass --text FILE");
  return out;
}

namespace {

struct BenchGenerateOptions {
  ModelCliOptions model;
  int64_t context = 4096;
  int new_tokens = 32;
  std::string attention = "full,retro";
  std::string text_path;
  std::string json_path;
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

// Peak resident set of this process so far (VmHWM of /proc/self/status), in MiB; 0 when unreadable.
double peak_rss_mib() {
  std::ifstream f("/proc/self/status");
  std::string key;
  while (f >> key) {
    if (key == "VmHWM:") {
      double kb = 0;
      f >> kb;
      return kb / 1024.0;
    }
    std::getline(f, key);
  }
  return 0.0;
}

double load_average() {
  double l = 0;
  std::ifstream f("/proc/loadavg");
  f >> l;
  return l;
}

void run_bench_generate(const BenchGenerateOptions& o) {
  RETROINFER_CHECK(o.context >= 2, "bench: --context must be >= 2");
  std::vector<AttentionKind> kinds;
  for (const auto& name : split(o.attention, ',')) kinds.push_back(parse_attention_kind(name));
  RETROINFER_CHECK(!kinds.empty(), "bench: --attention lists no method");
  cli_device(o.model);  // an unusable device fails before the text and the model are read
  LoadedModel m = load_model(o.model);
  const Tokenizer& tok = *m.tokenizer;
  // Prompt: the text's tokens (repeated if short) cut to exactly `context` tokens, after the BOS if any.
  // ~4 bytes per token in English; 8 per token leaves room, and keeps tokenizing a long book short.
  std::string text = bench_text(o.text_path);
  if (static_cast<int64_t>(text.size()) > 8 * o.context + 4096) text.resize(8 * o.context + 4096);
  const std::vector<int32_t> text_ids = tok.encode(text, false, false);
  RETROINFER_CHECK(!text_ids.empty(), "bench: the text encodes to no tokens");
  std::vector<int32_t> prompt = tok.special_prefix();
  while (static_cast<int64_t>(prompt.size()) < o.context)
    prompt.insert(prompt.end(), text_ids.begin(),
                  text_ids.begin() + std::min<int64_t>(text_ids.size(), o.context - prompt.size()));
  std::ofstream jf;
  if (!o.json_path.empty()) {
    jf.open(o.json_path, std::ios::app);
    RETROINFER_CHECK(jf.good(), "bench: cannot append to --json '", o.json_path, "'");
  }
  std::fprintf(stderr, "bench generate: %s, %lld-token prompt, %d new tokens, %s, %ld cores online, load %.2f\n",
               std::filesystem::path(m.model->path()).filename().c_str(), static_cast<long long>(o.context),
               o.new_tokens, m.engine->description().c_str(), sysconf(_SC_NPROCESSORS_ONLN), load_average());
  // One dense prefill (identical for every method: prefill attention is exact), then per method a fork of
  // the session (KV copy + the method's on_prefill, timed as index_s) and the decode loop. A single method, and
  // retro with a host or split placement (prefills_alone: a host-tier session cannot be forked), prefill alone
  // instead, so that the process never holds a second copy of the KV (its peak RSS is the method's own); its
  // index_s is then 0 and its prefill_s its own, the index build included.
  SessionOptions base_opt = make_session_options(o.model, AttentionKind::kFull, m.model->config().head_dim);
  base_opt.max_context = o.context + o.new_tokens;
  base_opt.kv_placement = method_kv_placement(base_opt.kv_placement, AttentionKind::kFull);
  const auto timed_prefill = [&](SequenceSession& session, double& seconds) {
    ProgressBar bar("prefill");
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<float> out = session.prefill(prompt, false, [&](int64_t done, int64_t total) {
      bar.update(done, total);
      if (done == total) bar.finish();
    });
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
  };
  std::unique_ptr<SequenceSession> base;
  std::vector<float> logits;
  double shared_prefill_s = 0.0;
  std::vector<int32_t> full_tokens;  // greedy tokens of full attention, when it ran before the others
  for (AttentionKind kind : kinds) {
    SessionOptions so = make_session_options(o.model, kind, m.model->config().head_dim);
    so.max_context = base_opt.max_context;
    const bool alone = prefills_alone(so.kv_placement, kind) || kinds.size() == 1;
    if (!alone && !base) {
      base = make_session(*m.engine, base_opt);
      logits = timed_prefill(*base, shared_prefill_s);
      std::printf("prefill   %8.1f tok/s (%.2f s, %lld tokens, shared by the forked methods)\n",
                  o.context / shared_prefill_s, shared_prefill_s, static_cast<long long>(o.context));
    }
    const double load0 = load_average();
    std::unique_ptr<SequenceSession> session;
    std::vector<float> own_logits;
    double prefill_s = shared_prefill_s, index_s = 0.0;
    if (alone) {
      session = make_session(*m.engine, so);
      own_logits = timed_prefill(*session, prefill_s);
      std::printf("prefill   %8.1f tok/s (%.2f s, %s alone: KV placement %s)\n", o.context / prefill_s, prefill_s,
                  std::string(attention_kind_name(kind)).c_str(),
                  std::string(buffer::kv_placement_name(so.kv_placement.placement)).c_str());
    } else {
      const auto t1 = std::chrono::steady_clock::now();
      session = base->fork_session(so.attention);
      index_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    }
    GenerateOptions go;
    go.max_new_tokens = o.new_tokens;
    go.ignore_eos = true;
    const GenerateSummary s = continue_generation(*session, alone ? own_logits : logits, go);
    session.reset();
    if (kind == AttentionKind::kFull) full_tokens = s.tokens;
    // Leading greedy tokens identical to full attention's (-1: full did not run first).
    int64_t same = -1;
    if (!full_tokens.empty()) {
      same = 0;
      while (same < static_cast<int64_t>(std::min(full_tokens.size(), s.tokens.size())) &&
             full_tokens[same] == s.tokens[same])
        ++same;
    }
    std::printf("%-9s index %6.2f s  decode %7.2f tok/s (%lld steps, %.2f s)  KV read %6.2f%%  same as full: %lld/%d\n",
                s.attention.c_str(), index_s, s.decode_tokens_per_s, static_cast<long long>(s.decode_steps),
                s.decode_seconds, 100.0 * s.kv_read_share, static_cast<long long>(same), o.new_tokens);
    if (s.kv_placement && s.kv_placement->host_layers > 0)
      std::printf("%-9s %s\n", "", kv_placement_line(*s.kv_placement).c_str());
    std::fflush(stdout);
    if (jf.is_open()) {
      nlohmann::json j = {{"bench", "generate"},
                          {"model", std::filesystem::path(m.model->path()).filename().string()},
                          {"attention", s.attention},
                          {"context", o.context},
                          {"new_tokens", o.new_tokens},
                          {"prefill_s", prefill_s},
                          {"prefill_tok_s", o.context / prefill_s},
                          {"index_s", index_s},
                          {"prefilled_alone", alone},
                          {"decode_s", s.decode_seconds},
                          {"decode_steps", s.decode_steps},
                          {"decode_tok_s", s.decode_tokens_per_s},
                          {"ttft_s", prefill_s + index_s + s.time_to_first_token_s},
                          {"kv_read_share", s.kv_read_share},
                          {"same_tokens_as_full", same},
                          {"mean_exact_tokens_per_head", s.mean_exact_tokens_per_head},
                          {"kv_dtype", std::string(dtype_name(base_opt.kv_dtype))},
                          {"device", std::string(device_name(m.engine->device()))},
                          {"device_description", m.engine->description()},
                          {"threads", num_threads()},
                          {"cpu_weights", std::string(weight_storage_name(m.model->weight_storage()))},
                          {"weight_bytes", m.model->weight_bytes()},
                          {"peak_rss_mib", peak_rss_mib()},
                          {"blas_core", blas_core_name()},
                          {"omp_wait_policy", std::getenv("OMP_WAIT_POLICY") ? std::getenv("OMP_WAIT_POLICY") : ""},
                          {"cores_online", sysconf(_SC_NPROCESSORS_ONLN)},
                          {"load_avg_before", load0},
                          {"load_avg_after", load_average()},
                          {"unix_time", static_cast<int64_t>(std::time(nullptr))}};
      add_kv_placement_json(j, s.kv_placement);
      jf << j.dump() << "\n";
      jf.flush();
    }
  }
}


void setup_bench_generate(CLI::App& app) {
  auto o = std::make_shared<BenchGenerateOptions>();
  auto* cmd = bench_command(app)->add_subcommand("generate", "End-to-end prefill and decode tokens/s per method");
  add_model_options(cmd, o->model);
  cmd->add_option("--context", o->context, "Prompt length in tokens")->capture_default_str();
  cmd->add_option("--new-tokens", o->new_tokens, "Tokens to generate per method")->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--attention", o->attention, "Comma-separated methods")->capture_default_str();
  cmd->add_option("--text", o->text_path, "Prompt text file (default: the King James Bible of bible-kjv)");
  cmd->add_option("--json", o->json_path, "Append one JSON line per method to this file");
  cmd->callback([o] { run_bench_generate(*o); });
}
RETROINFER_COMMAND(setup_bench_generate);

}  // namespace
}  // namespace retroinfer::cli
