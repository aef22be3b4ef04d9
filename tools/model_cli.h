// Options and helpers shared by the CLI commands that run a model (generate, eval, bench generate).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "attention_cli.h"
#include "retroinfer/engine_model.h"
#include "retroinfer/model.h"
#include "retroinfer/model_file.h"
#include "retroinfer/text_generate.h"
#include "retroinfer/tokenizer.h"

namespace CLI {
class App;
}

namespace retroinfer::cli {

// Where the CUDA runner keeps the KV (KvPlacementOptions, sequence_session.h), as given on the command line.
struct KvPlacementCliValues {
  std::string placement = "auto";  // auto | gpu | split | host
  int gpu_layers = -1;             // split: layers on the GPU (-1: as many as fit)
  double cache_fraction = WaveBufferConfig{}.cache_fraction;
  int cache_page_tokens = 0;  // 0: the cluster size, at most 8
  std::string host_store = "bf16";  // bf16 | int8 | int4
  double gpu_memory_gib = 0.0;   // 0: free memory minus the reserve
  double host_memory_gib = 0.0;  // 0: a share of MemAvailable
};

// Adds --kv-placement, --gpu-layers, --cache-fraction, --cache-page-tokens, --host-store, --gpu-memory-limit
// and --host-memory-limit to cmd.
void add_kv_placement_options(CLI::App* cmd, KvPlacementCliValues& v);
// The options for a session on `device`, checked (validate_kv_placement: an explicit gpu, split or host
// placement on the CPU is an Error naming --kv-placement).
KvPlacementOptions kv_placement_options(const KvPlacementCliValues& v, Device device);
// One line on where a session's KV lived: "KV placement host (0 GPU / 30 host layers)", with host-tier layers
// followed by ": block-cache hit ratio 0.650, 3.9 MiB over PCIe in 31 decode steps".
std::string kv_placement_line(const KvPlacementReport& r);

struct ModelCliOptions {
  std::string model = "smollm2";  // path or short name (see locate_model)
  // cpu | cuda | auto (auto: cuda when this build has the backend and a GPU is present). The default is
  // cpu for now: the CUDA runner is new; flip it to auto once it has been verified on the GPU machine.
  std::string device = "cpu";
  std::string weights = "bf16";   // cuda: weight type on the GPU (bf16 | f32)
  std::string cpu_weights = "blocks";  // cpu: block-type weights kept as blocks or widened (blocks | f32)
  int threads = 0;                // 0: OpenMP default
  std::string kv_dtype = "auto";  // f32 | bf16 | auto (f32 on cpu, bf16 on cuda)
  int prefill_chunk = 0;          // 0: the device's default (512 cpu, 2048 cuda)
  AttentionCliValues attention;  // the attention parameters given (attention_cli.h); the rest keep their defaults
  KvPlacementCliValues kv_placement;
  int64_t reserved_host_bytes = 0;  // not a flag: serve's prefix cache (LoadOptions::reserved_host_bytes)
  int64_t prefix_gpu_bytes = 0;     // not a flag: serve's --prefix-cache-gpu-mb (EngineOptions::prefix_gpu_bytes)
};

// Adds --model, --device, --weights, --threads, --kv-dtype, --prefill-chunk, the attention parameters
// (add_attention_options) and the KV placement (add_kv_placement_options) to cmd.
void add_model_options(CLI::App* cmd, ModelCliOptions& o);

// --device resolved (auto decided here) and checked: throws Error when the device cannot run in this
// build or on this machine (check_device), before any model is loaded.
Device cli_device(const ModelCliOptions& o);

// Session options for `kind` on the device of --device: --kv-dtype and --prefill-chunk "auto" resolved
// per device (default_kv_dtype, default_prefill_chunk), the KV placement checked against the device
// (kv_placement_options). head_dim > 0 (the loaded model's): without
// --tokens-per-cluster, the cluster size is default_tokens_per_cluster(head_dim). The attention parameters
// are validated here (validate(AttentionConfig)): a bad flag fails before any model is read.
SessionOptions make_session_options(const ModelCliOptions& o, AttentionKind kind, int head_dim = 0);

// Applies --threads, checks --device, locates, opens and loads the model and its tokenizer, and puts the
// model on the device (cuda: uploads the weights once): retroinfer::load_model (text_generate.h).
LoadedModel load_model(const ModelCliOptions& o);

// The CPU runner's 8-bit KV caches (--kv-dtype int8 | fp8) store keys relative to the model's key calibration
// (Model::key_calibration, a 2048-token prefill): loaded from the on-disk store or computed and kept there
// (load_or_compute_key_calibration, default_key_calibration_dir) before the first session, with a line on stderr;
// nothing for other storages or the CUDA runner. `command`: the line's prefix ("generate").
void calibrate_kv_keys(const LoadedModel& m, const SessionOptions& so, const char* command);

// A one-line prefill progress bar on stderr ("\r" updates).
class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  void update(int64_t done, int64_t total);
  void finish();

 private:
  std::string label_;
  double t0_;
  bool active_ = false;
};

}  // namespace retroinfer::cli
