#include "retroinfer/engine_model.h"

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
#if RETROINFER_WITH_CUDA
  if (opt.device == Device::kCuda)
    impl_->cuda = cuda::CudaModel::upload(
        model, opt.weights == DeviceWeights::kF32 ? cuda::WeightType::kF32 : cuda::WeightType::kBf16);
#endif
}

EngineModel::~EngineModel() = default;

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

std::unique_ptr<SequenceSession> make_session(const EngineModel& model, const SessionOptions& opt) {
  validate(opt.attention);
  RETROINFER_CHECK(opt.prefill_chunk >= 1, "session: prefill_chunk must be >= 1, got ", opt.prefill_chunk);
  RETROINFER_CHECK(opt.max_context >= 0, "session: max_context must be >= 0, got ", opt.max_context);
  if (model.device() == Device::kCpu) return std::make_unique<Session>(model.cpu_model(), opt);
#if RETROINFER_WITH_CUDA
  RETROINFER_CHECK(opt.kv_dtype == DType::kBF16, "device cuda: the CUDA runner keeps the KV cache in bf16, not ",
                   dtype_name(opt.kv_dtype), "; use --kv-dtype bf16 (or auto)");
  RETROINFER_CHECK(model.impl().cuda != nullptr, "device cuda: the model was not uploaded");
  cuda::CudaSessionOptions co;
  co.attention = opt.attention;
  co.max_context = opt.max_context;
  co.prefill_chunk = opt.prefill_chunk;
  co.exact_stats = opt.exact_attention_stats;
  co.cluster_trace = opt.cluster_trace;
  return std::make_unique<cuda::CudaSequenceSession>(*model.impl().cuda, co);
#else
  check_device(Device::kCuda);  // throws: no CUDA backend in this build
  return nullptr;
#endif
}

}  // namespace retroinfer
