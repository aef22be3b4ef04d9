#include "retroinfer/engine_model.h"

#include <algorithm>

#include "retroinfer/error.h"

#if RETROINFER_WITH_CUDA
#include "retroinfer/cuda_backend.h"
#include "retroinfer/cuda_model.h"
#endif

namespace retroinfer {

struct EngineModel::Impl {
#if RETROINFER_WITH_CUDA
  std::unique_ptr<cuda::CudaModel> cuda;  // set for Device::kCuda
#endif
};

std::string_view device_weights_name(DeviceWeights w) { return w == DeviceWeights::kF32 ? "f32" : "bf16"; }

DeviceWeights parse_device_weights(std::string_view s) {
  if (s == "bf16") return DeviceWeights::kBf16;
  if (s == "f32") return DeviceWeights::kF32;
  RETROINFER_FAIL("unknown weight type '", s, "' for the device: expected bf16 or f32");
}

bool cuda_backend_built() {
#if RETROINFER_WITH_CUDA
  return true;
#else
  return false;
#endif
}

Device resolve_device(std::string_view s) {
  if (s == "auto") {
#if RETROINFER_WITH_CUDA
    return cuda::device_available() ? Device::kCuda : Device::kCpu;
#else
    return Device::kCpu;
#endif
  }
  if (s == "cpu" || s == "cuda") return parse_device(s);
  RETROINFER_FAIL("unknown device '", s, "': expected cpu, cuda or auto");
}

void check_device(Device d) {
  if (d == Device::kCpu) return;
#if RETROINFER_WITH_CUDA
  RETROINFER_CHECK(cuda::device_available(), "device cuda: ", cuda::device_description(),
                   "; run on a machine with an NVIDIA GPU, or use --device cpu (or auto)");
#else
  RETROINFER_FAIL("device cuda: this build has no CUDA backend (configure with -DRETROINFER_CUDA=ON, e.g. "
                  "the cuda-release preset), or use --device cpu");
#endif
}

DType default_kv_dtype(Device d) { return d == Device::kCuda ? DType::kBF16 : DType::kF32; }

int default_prefill_chunk(Device d) { return d == Device::kCuda ? 2048 : 512; }

EngineModel::EngineModel(const Model& model, const EngineOptions& opt)
    : model_(model), opt_(opt), impl_(std::make_unique<Impl>()) {
  check_device(opt.device);
  RETROINFER_CHECK(opt.prefix_gpu_bytes >= 0, "the prefix cache's GPU tier needs a capacity >= 0, got ",
                   opt.prefix_gpu_bytes, " bytes (--prefix-cache-gpu-mb)");
  RETROINFER_CHECK(opt.prefix_gpu_bytes == 0 || opt.device == Device::kCuda,
                   "the prefix cache's GPU tier (--prefix-cache-gpu-mb) needs --device cuda; on the cpu the prefix "
                   "cache is in host memory only (--prefix-cache-mb)");
#if RETROINFER_WITH_CUDA
  if (opt.device == Device::kCuda) {
    impl_->cuda = cuda::CudaModel::upload(
        model, opt.weights == DeviceWeights::kF32 ? cuda::WeightType::kF32 : cuda::WeightType::kBf16);
    impl_->cuda->set_prefix_gpu_tier(opt.prefix_gpu_bytes);
  }
#endif
}

EngineModel::~EngineModel() = default;

std::optional<PrefixGpuTierStats> EngineModel::prefix_gpu_tier_stats() const {
#if RETROINFER_WITH_CUDA
  if (impl_->cuda != nullptr) return impl_->cuda->prefix_gpu_tier_stats();
#endif
  return std::nullopt;
}

int64_t EngineModel::device_weight_bytes() const {
#if RETROINFER_WITH_CUDA
  if (impl_->cuda) return impl_->cuda->weight_bytes();
#endif
  return 0;
}

std::string EngineModel::description() const {
#if RETROINFER_WITH_CUDA
  if (opt_.device == Device::kCuda)
    return "cuda: " + cuda::device_description() + ", " + std::string(device_weights_name(opt_.weights)) +
           " weights";
#endif
  return "cpu (" + std::to_string(num_threads()) + " threads)";
}

void validate_kv_placement(const KvPlacementOptions& kv, Device device) {
  const std::string_view name = buffer::kv_placement_name(kv.placement);
  RETROINFER_CHECK(device == Device::kCuda || kv.placement == KvPlacement::kAuto, "--kv-placement ", name,
                   " (kv_placement='", name, "') places the KV of the CUDA runner; the CPU runner keeps its whole ",
                   "KV cache in host memory. Use --device cuda, or --kv-placement auto (the default) on the CPU");
  RETROINFER_CHECK(kv.gpu_layers >= -1, "--gpu-layers (gpu_layers=) must be >= -1 (-1: as many as fit), got ",
                   kv.gpu_layers);
  RETROINFER_CHECK(kv.gpu_layers == -1 || kv.placement == KvPlacement::kSplit, "--gpu-layers ", kv.gpu_layers,
                   " (gpu_layers=) applies to --kv-placement split only, not ", name);
  RETROINFER_CHECK(kv.cache_fraction > 0.0 && kv.cache_fraction <= 1.0,
                   "--cache-fraction (cache_fraction=) must be in (0, 1], got ", kv.cache_fraction);
  RETROINFER_CHECK(kv.page_tokens >= 0, "--cache-page-tokens (cache_page_tokens=) must be >= 0 (0: the cluster size), got ",
                   kv.page_tokens);
  RETROINFER_CHECK(kv.gpu_memory_limit >= 0 && kv.host_memory_limit >= 0,
                   "--gpu-memory-limit / --host-memory-limit must be >= 0 (0: what is free)");
}

KvPlacementOptions method_kv_placement(const KvPlacementOptions& kv, AttentionKind kind) {
  KvPlacementOptions out = kv;
  if (kind != AttentionKind::kRetro && (kv.placement == KvPlacement::kHost || kv.placement == KvPlacement::kSplit)) {
    out.placement = KvPlacement::kGpu;
    out.gpu_layers = -1;
  }
  return out;
}

bool prefills_alone(const KvPlacementOptions& kv, AttentionKind kind) {
  return kind == AttentionKind::kRetro && (kv.placement == KvPlacement::kHost || kv.placement == KvPlacement::kSplit);
}

std::unique_ptr<SequenceSession> make_session(const EngineModel& model, const SessionOptions& opt) {
  validate(opt.attention);
  validate_kv_placement(opt.kv_placement, model.device());
  RETROINFER_CHECK(opt.prefill_chunk >= 1, "session: prefill_chunk must be >= 1, got ", opt.prefill_chunk);
  RETROINFER_CHECK(opt.max_context >= 0, "session: max_context must be >= 0, got ", opt.max_context);
  if (model.device() == Device::kCpu) return std::make_unique<Session>(model.cpu_model(), opt);
#if RETROINFER_WITH_CUDA
  RETROINFER_CHECK(opt.kv_dtype == DType::kBF16 || opt.kv_dtype == DType::kI8, "device cuda: the CUDA runner keeps ",
                   "the KV cache in bf16 or int8, not ", dtype_name(opt.kv_dtype), "; use --kv-dtype bf16 (or auto) or int8",
                   opt.kv_dtype == DType::kF8E4M3 ? " (fp8 KV runs on the CPU runner, --device cpu)" : "");
  RETROINFER_CHECK(model.impl().cuda != nullptr, "device cuda: the model was not uploaded");
  cuda::CudaSessionOptions co;
  co.attention = opt.attention;
  co.kv_dtype = opt.kv_dtype;
  co.max_context = opt.max_context;
  co.prefill_chunk = opt.prefill_chunk;
  co.exact_stats = opt.exact_attention_stats;
  co.cluster_trace = opt.cluster_trace;
  co.count_wave_traffic = true;  // the faces report the host tier's PCIe bytes (kv_placement_report)
  co.placement = opt.kv_placement.placement;
  co.gpu_layers = opt.kv_placement.gpu_layers;
  co.wave.cache_fraction = opt.kv_placement.cache_fraction;
  co.wave.page_tokens = opt.kv_placement.page_tokens > 0
                            ? opt.kv_placement.page_tokens
                            : std::clamp(opt.attention.tokens_per_cluster, 1, WaveBufferConfig{}.page_tokens);
  co.wave.store_dtype = opt.kv_placement.host_store;
  co.gpu_memory_limit = opt.kv_placement.gpu_memory_limit;
  co.host_memory_limit = opt.kv_placement.host_memory_limit;
  return std::make_unique<cuda::CudaSequenceSession>(*model.impl().cuda, co);
#else
  check_device(Device::kCuda);  // throws: no CUDA backend in this build
  return nullptr;
#endif
}

}  // namespace retroinfer
