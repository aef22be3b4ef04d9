// A model ready to run on one device, and the factory of its sequence sessions: `--device cpu|cuda|auto`
// of the CLI ends here, and generation (generate.h), the accuracy harness (`retroinfer eval`) and `bench
// generate` take a SequenceSession (sequence_session.h) from make_session instead of building a CPU
// Session themselves.
//
//   cpu   the CPU runner (Session, model.h) over the loaded Model's f32 weights;
//   cuda  the CUDA runner (cuda::CudaSequenceSession, cuda_model.h) over a CudaModel uploaded once from
//         the CPU Model (bf16 or f32 weights). Only in a build with the CUDA backend
//         (RETROINFER_WITH_CUDA); elsewhere asking for it throws Error.
//
// Threading contract: an EngineModel is immutable after construction; any number of threads may call
// make_session on it at once (each session is then used by one thread at a time).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "retroinfer/dtype.h"
#include "retroinfer/model.h"
#include "retroinfer/sequence_session.h"

namespace retroinfer {

// Weight precision of the CUDA runner (mirrors cuda::WeightType without naming the CUDA headers' types):
// bf16 for speed (the default), f32 for exactness comparisons against the CPU runner.
enum class DeviceWeights : uint8_t { kBf16, kF32 };
std::string_view device_weights_name(DeviceWeights w);  // "bf16" | "f32"
DeviceWeights parse_device_weights(std::string_view s);  // "bf16" | "f32" (throws Error otherwise)

// True when this binary was built with the CUDA backend (RETROINFER_WITH_CUDA).
bool cuda_backend_built();
// "cpu" | "cuda" | "auto" -> a device; auto = cuda when the build has the backend and a usable device is
// present, else cpu. Throws Error for any other string. Does not check that cuda is usable (see
// check_device).
Device resolve_device(std::string_view s);
// Throws Error when `d` cannot run here: cuda on a build without the CUDA backend ("this build has no
// CUDA backend ..."), or on a CUDA build with no usable device (naming cuda::device_description()).
void check_device(Device d);

// Defaults that differ per device: the KV cache storage (the CPU runner's f32; the CUDA runner keeps K/V
// in bf16 only) and the prefill block (tokens per chunk: 512 bounds the CPU's activation memory, 2048
// fills the GPU's matrix units).
DType default_kv_dtype(Device d);
int default_prefill_chunk(Device d);

struct EngineOptions {
  Device device = Device::kCpu;
  DeviceWeights weights = DeviceWeights::kBf16;  // cuda only: the uploaded weights' type
  // cuda only: GPU bytes for device copies of the prefix cache's blocks (its GPU tier, docs/prefix-cache.md;
  // 0: none). Sessions leave this room free. An Error on cpu when > 0.
  int64_t prefix_gpu_bytes = 0;
};

class EngineModel {
 public:
  // Borrows `model` (it must outlive this object; the CPU runner reads its weights, and the tokenizer
  // side keeps needing its config). For cuda, checks the device (check_device) and uploads the weights
  // once; throws Error when that fails.
  explicit EngineModel(const Model& model, const EngineOptions& opt = {});
  ~EngineModel();
  EngineModel(const EngineModel&) = delete;
  EngineModel& operator=(const EngineModel&) = delete;

  Device device() const { return opt_.device; }
  const EngineOptions& options() const { return opt_; }
  const Model& cpu_model() const { return model_; }
  const ModelConfig& config() const { return model_.config(); }
  // Bytes of the device-resident weights (0 on cpu).
  int64_t device_weight_bytes() const;
  // One line for logs and reports: "cpu (8 threads)" or "cuda: NVIDIA H200 (sm_90, 139 GiB), bf16 weights".
  std::string description() const;

  // The prefix cache's GPU tier (EngineOptions::prefix_gpu_bytes) in numbers; nullopt without one.
  std::optional<PrefixGpuTierStats> prefix_gpu_tier_stats() const;

  struct Impl;  // the uploaded CUDA model (engine_model.cpp); empty on cpu
  const Impl& impl() const { return *impl_; }

 private:
  const Model& model_;
  EngineOptions opt_;
  std::unique_ptr<Impl> impl_;
};

// Throws Error when the KV placement options are out of range (gpu_layers < -1, or given without kSplit;
// cache_fraction outside (0, 1]; page_tokens < 1; negative memory limits) or do not apply to `device`: the
// CPU runner keeps its KV in host memory and takes kAuto only, so an explicit gpu, split or host placement
// on the CPU is refused, naming the flag (--kv-placement) and the keyword (kv_placement=).
void validate_kv_placement(const KvPlacementOptions& kv, Device device);

// Commands that run several methods on one prompt (eval, bench generate) prefill once with full attention
// and fork a session per method (fork_session), which needs every layer's KV on the GPU; only retro has a
// host tier (the planner refuses the other methods off the GPU). So:
//   method_kv_placement  the placement a method's session takes: kv as given for retro; for the other
//                        methods kGpu (gpu_layers -1) when kv asks for host or split, else kv;
//   prefills_alone       true for retro with an explicit host or split placement: its session prefills the
//                        prompt itself (a host-tier session cannot be forked from the GPU prefill).
KvPlacementOptions method_kv_placement(const KvPlacementOptions& kv, AttentionKind kind);
bool prefills_alone(const KvPlacementOptions& kv, AttentionKind kind);

// A fresh session of one sequence on the model's device.
//   opt.attention      the decode attention method (validated);
//   opt.max_context    tokens it will hold (prompt + generated; 0 = the model's maximum);
//   opt.prefill_chunk  tokens per prefill block (>= 1);
//   opt.kv_dtype       cpu: f32 or bf16; cuda: must be bf16 (throws Error otherwise: default_kv_dtype);
//   opt.kv_placement   cuda: where the KV lives (validate_kv_placement; kAuto: the GPU when it fits, else a
//                      GPU / host split for retro, else refused with the numbers); cpu: kAuto only.
// Memory and context checks of the device's runner apply (Error before allocating when it cannot fit).
std::unique_ptr<SequenceSession> make_session(const EngineModel& model, const SessionOptions& opt);

}  // namespace retroinfer
