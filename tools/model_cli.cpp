#include "model_cli.h"

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>

#include "retroinfer/model_file.h"

namespace retroinfer::cli {
namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

void add_model_options(CLI::App* cmd, ModelCliOptions& o) {
  cmd->add_option("--model", o.model, "Model: a HF directory, a .safetensors or .gguf file, or 'smollm2'")
      ->capture_default_str();
  cmd->add_option("--device", o.device,
                  "Runner: cpu, cuda (the CUDA runner; needs a CUDA build and a GPU) or auto (cuda when usable)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  cmd->add_option("--weights", o.weights, "cuda: weight type on the GPU, bf16 or f32 (exactness checks)")
      ->capture_default_str()
      ->check(CLI::IsMember({"bf16", "f32"}));
  cmd->add_option("--threads", o.threads, "CPU threads (OpenMP + OpenBLAS); 0 = all cores")->check(CLI::NonNegativeNumber);
  cmd->add_option("--kv-dtype", o.kv_dtype, "KV cache storage: f32, bf16 or auto (cpu: f32; cuda: bf16, its only one)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16", "auto"}));
  cmd->add_option("--prefill-chunk", o.prefill_chunk, "Tokens per prefill block; 0 = the device's default (cpu 512, cuda 2048)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--retrieval-fraction", o.retrieval_fraction, "retro: share of clusters attended exactly (0.018)");
  cmd->add_option("--estimation-fraction", o.estimation_fraction, "retro: share of clusters estimated (0.232)");
  cmd->add_option("--outlier-fraction", o.outlier_fraction,
                  "retro: share of indexed tokens kept out of the clusters and read exactly (0.001)");
  cmd->add_option("--kmeans-iters", o.kmeans_segment_iters, "retro: spherical k-means iterations per segment (1)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--segment-tokens", o.segment_tokens, "retro: k-means segment length in tokens (8192)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--sink", o.sink_tokens, "Steady zone: first tokens always attended (4)");
  cmd->add_option("--window", o.window_tokens, "Steady zone: last prompt tokens always attended (64)");
  cmd->add_option("--tokens-per-cluster", o.tokens_per_cluster, "retro: average cluster size (default: 16 from head_dim 128 on, 2 below)");
  cmd->add_option("--budget-tokens", o.budget_tokens,
                  "quest/streaming/oracle: exact tokens beyond the steady zone (-1: retrieval_fraction of the context)");
  cmd->add_flag("--no-estimation", o.no_estimation, "retro: ignore the estimation zone");
}

Device cli_device(const ModelCliOptions& o) {
  const Device d = resolve_device(o.device);
  check_device(d);
  return d;
}

SessionOptions make_session_options(const ModelCliOptions& o, AttentionKind kind, int head_dim) {
  const Device device = resolve_device(o.device);
  SessionOptions so = default_session_options(device, kind, head_dim);
  if (o.kv_dtype != "auto") so.kv_dtype = parse_dtype(o.kv_dtype);
  if (o.prefill_chunk > 0) so.prefill_chunk = o.prefill_chunk;
  AttentionConfig& a = so.attention;
  if (o.retrieval_fraction >= 0) a.retrieval_fraction = o.retrieval_fraction;
  if (o.estimation_fraction >= 0) a.estimation_fraction = o.estimation_fraction;
  if (o.outlier_fraction >= 0) a.outlier_fraction = o.outlier_fraction;
  if (o.kmeans_segment_iters >= 0) a.kmeans_segment_iters = o.kmeans_segment_iters;
  if (o.segment_tokens > 0) a.segment_tokens = o.segment_tokens;
  if (o.sink_tokens >= 0) a.sink_tokens = o.sink_tokens;
  if (o.window_tokens >= 0) a.window_tokens = o.window_tokens;
  if (o.tokens_per_cluster > 0) a.tokens_per_cluster = o.tokens_per_cluster;
  if (o.budget_tokens >= -1) a.budget_tokens = o.budget_tokens;
  if (o.no_estimation) a.estimation = false;
  validate(a);
  return so;
}

LoadedModel load_model(const ModelCliOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  LoadOptions lo;
  lo.engine.device = cli_device(o);  // a device that cannot run fails here, before the model is read
  lo.engine.weights = parse_device_weights(o.weights);
  return retroinfer::load_model(locate_model(o.model), lo);
}

ProgressBar::ProgressBar(std::string label) : label_(std::move(label)), t0_(now_s()) {}

void ProgressBar::update(int64_t done, int64_t total) {
  constexpr int kWidth = 30;
  const int fill = total > 0 ? static_cast<int>(kWidth * done / total) : kWidth;
  const double dt = now_s() - t0_;
  std::string bar(fill, '#');
  bar.resize(kWidth, '.');
  std::fprintf(stderr, "\r%s [%s] %lld/%lld tokens, %.0f tok/s", label_.c_str(), bar.c_str(),
               static_cast<long long>(done), static_cast<long long>(total), dt > 0 ? done / dt : 0.0);
  std::fflush(stderr);
  active_ = true;
}

void ProgressBar::finish() {
  if (active_) std::fprintf(stderr, "\n");
  active_ = false;
}

}  // namespace retroinfer::cli
