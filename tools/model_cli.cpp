#include "model_cli.h"

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>

#include "retroinfer/key_calibration_store.h"
#include "retroinfer/model_file.h"

namespace retroinfer::cli {
namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

void add_model_options(CLI::App* cmd, ModelCliOptions& o) {
  cmd->add_option("--model", o.model, "Model: a HF directory, a .safetensors or .gguf file, 'smollm2' or 'qwen2.5-coder-0.5b'")
      ->capture_default_str();
  cmd->add_option("--device", o.device,
                  "Runner: cpu, cuda (the CUDA runner; needs a CUDA build and a GPU) or auto (cuda when usable)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  cmd->add_option("--weights", o.weights, "cuda: weight type on the GPU, bf16 or f32 (exactness checks)")
      ->capture_default_str()
      ->check(CLI::IsMember({"bf16", "f32"}));
  cmd->add_option("--cpu-weights", o.cpu_weights,
                  "cpu: quantized weights kept in their blocks (products with 8-bit activations) or widened to f32")
      ->capture_default_str()
      ->check(CLI::IsMember({"blocks", "f32"}));
  cmd->add_option("--threads", o.threads, "CPU threads (OpenMP + OpenBLAS); 0 = all cores")->check(CLI::NonNegativeNumber);
  cmd->add_option("--kv-dtype", o.kv_dtype,
                  "KV cache storage: f32, bf16, int8 (8 bits and a scale per row: about a quarter of f32's bytes, "
                  "half of bf16's; cuda: full and retro with every layer on the GPU), fp8 (e4m3, the same bytes, "
                  "less accurate than int8 on the models measured; cpu only) or auto (cpu: f32; cuda: bf16)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16", "int8", "fp8", "auto"}));
  cmd->add_option("--prefill-chunk", o.prefill_chunk, "Tokens per prefill block; 0 = the device's default (cpu 512, cuda 2048)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  add_attention_options(cmd, o.attention);
  add_kv_placement_options(cmd, o.kv_placement);
}

void add_kv_placement_options(CLI::App* cmd, KvPlacementCliValues& v) {
  cmd->add_option("--kv-placement", v.placement,
                  "cuda: where the KV lives: auto (the GPU when it fits, else retro's layers split between the GPU "
                  "and pinned host memory, else refused), gpu, split (--gpu-layers on the GPU, the rest on the "
                  "host) or host (every layer's KV in host memory, the GPU keeping a block cache); host and split "
                  "are retro only. cpu: auto")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "gpu", "split", "host"}));
  cmd->add_option("--gpu-layers", v.gpu_layers, "split: layers whose KV stays on the GPU (-1: as many as fit)")
      ->capture_default_str();
  cmd->add_option("--cache-fraction", v.cache_fraction,
                  "Host-tier layers: GPU block cache per KV head as a fraction of the context")
      ->capture_default_str();
  cmd->add_option("--cache-page-tokens", v.cache_page_tokens,
                  "Host-tier layers: tokens per block-cache page; 0 = retro's tokens per cluster, at most 8 (a "
                  "cluster takes whole pages)")
      ->capture_default_str();
  cmd->add_option("--host-store", v.host_store,
                  "Host-tier layers: the store's element type, bf16, int8 (one scale per token row: half the PCIe "
                  "bytes per miss, bf16's accuracy) or int4 (one scale per 32 values of the row minus its cluster's "
                  "mean: 28% of bf16's bytes, near bf16's accuracy on the models measured; the means take ~6% of "
                  "the bf16 KV's bytes in GPU memory)")
      ->capture_default_str()
      ->check(CLI::IsMember({"bf16", "int8", "int4"}));
  cmd->add_option("--gpu-memory-limit", v.gpu_memory_gib,
                  "cuda: GiB of GPU memory for the session, weights excluded (0: free memory - 2 GiB)")
      ->check(CLI::Range(0.0, 1.0e6))  // GiB; the byte count must fit in int64
      ->capture_default_str();
  cmd->add_option("--host-memory-limit", v.host_memory_gib,
                  "cuda: GiB of pinned host memory for host-tier layers (0: 80% of MemAvailable)")
      ->check(CLI::Range(0.0, 1.0e6))
      ->capture_default_str();
}

std::string kv_placement_line(const KvPlacementReport& r) {
  char buf[256];
  int n = std::snprintf(buf, sizeof buf, "KV placement %s (%d GPU / %d host layers)",
                        std::string(buffer::kv_placement_name(r.placement)).c_str(), r.gpu_layers, r.host_layers);
  if (r.host_layers > 0 && n > 0 && n < int(sizeof buf))
    std::snprintf(buf + n, sizeof buf - n, ": block-cache hit ratio %.3f, %.1f MiB over PCIe in %lld decode steps",
                  r.cache_hit_ratio(), double(r.pcie_bytes) / double(1 << 20), static_cast<long long>(r.decode_steps));
  return buf;
}

KvPlacementOptions kv_placement_options(const KvPlacementCliValues& v, Device device) {
  constexpr double kGiB = double(int64_t{1} << 30);
  KvPlacementOptions kv;
  kv.placement = buffer::parse_kv_placement(v.placement);
  kv.gpu_layers = v.gpu_layers;
  kv.cache_fraction = v.cache_fraction;
  kv.page_tokens = v.cache_page_tokens;
  kv.host_store = parse_store_dtype(v.host_store);
  kv.gpu_memory_limit = static_cast<int64_t>(v.gpu_memory_gib * kGiB);
  kv.host_memory_limit = static_cast<int64_t>(v.host_memory_gib * kGiB);
  validate_kv_placement(kv, device);
  return kv;
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
  apply_attention_options(o.attention, so.attention);
  validate(so.attention);
  so.kv_placement = kv_placement_options(o.kv_placement, device);
  return so;
}

LoadedModel load_model(const ModelCliOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  LoadOptions lo;
  lo.engine.device = cli_device(o);  // a device that cannot run fails here, before the model is read
  lo.engine.weights = parse_device_weights(o.weights);
  lo.engine.prefix_gpu_bytes = o.prefix_gpu_bytes;
  lo.reserved_host_bytes = o.reserved_host_bytes;
  lo.cpu_weights = parse_weight_storage(o.cpu_weights);
  return retroinfer::load_model(locate_model(o.model), lo);
}

void calibrate_kv_keys(const LoadedModel& m, const SessionOptions& so, const char* command) {
  if (!is_scaled_8bit(so.kv_dtype) || m.engine->device() != Device::kCpu) return;
  const std::string dir = default_key_calibration_dir();
  const double t0 = now_s();
  std::fprintf(stderr, "retroinfer %s: the %s KV cache's key calibration", command,
               std::string(dtype_name(so.kv_dtype)).c_str());
  std::fflush(stderr);
  const KeyCalibrationLoad r = load_or_compute_key_calibration(*m.model, m.tokenizer.get(), dir);
  if (r.from_disk) {
    std::fprintf(stderr, " from %s\n", r.file.c_str());
  } else {
    std::fprintf(stderr, ": a %lld-token prefill, %.1f s", static_cast<long long>(Model::kKeyCalibrationTokens),
                 now_s() - t0);
    if (!r.file.empty() && r.warning.empty()) std::fprintf(stderr, ", kept in %s", r.file.c_str());
    std::fprintf(stderr, "\n");
  }
  if (!r.warning.empty()) std::fprintf(stderr, "retroinfer %s: %s\n", command, r.warning.c_str());
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
