// CudaModel: a model's weights in GPU memory, uploaded from a CPU model or generated on the device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cuda_check.h"
#include "kernels/model_kernels.h"
#include "model/cuda/model_weights.h"
#include "model/cuda/prefix_gpu_tier.h"
#include "model/weights.h"
#include "retroinfer/error.h"
#include "retroinfer/model.h"

namespace retroinfer::cuda {
namespace {

// Host f32 -> device bf16 conversion goes through a device staging buffer of at most this many floats
// (64 MiB), so that an 8B-parameter upload never holds a second full copy anywhere.
constexpr size_t kStagingFloats = size_t{16} << 20;
// Standard deviation of random weight matrices (Llama's initializer_range).
constexpr float kRandomStd = 0.02f;

size_t elem_bytes(WeightType t) { return t == WeightType::kBf16 ? 2 : 4; }

// Element counts of the tensors of a config.
struct Counts {
  int64_t embed = 0, qkv = 0, wo = 0, gate_up = 0, down = 0, hidden = 0;
  explicit Counts(const ModelConfig& c) {
    const int64_t h = c.hidden_size, d = c.head_dim;
    embed = int64_t{c.vocab_size} * h;
    qkv = (int64_t{c.num_heads_q} + 2 * c.num_heads_kv) * d;
    wo = h * c.num_heads_q * d;
    gate_up = 2 * int64_t{c.intermediate_size} * h;
    down = h * c.intermediate_size;
    hidden = h;
  }
  // Device bytes of all weights for storage type t (matrices in t, norms and biases f32).
  int64_t bytes(const ModelConfig& c, WeightType t) const {
    const int64_t eb = static_cast<int64_t>(elem_bytes(t));
    const int64_t per_layer = (qkv * hidden + wo + gate_up + down) * eb + (2 * hidden + (c.attention_bias ? qkv : 0)) * 4;
    return embed * eb * (c.tie_word_embeddings ? 1 : 2) + hidden * 4 + c.num_layers * per_layer;
  }
};

void check_fits(int64_t bytes, const char* who) {
  size_t free_b = 0, total_b = 0;
  RETROINFER_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  RETROINFER_CHECK(bytes <= static_cast<int64_t>(free_b), who, ": the weights need ", bytes >> 20, " MiB of GPU memory but only ",
                   free_b >> 20, " MiB of ", total_b >> 20, " MiB are free; use --weights bf16 or a smaller model");
}

}  // namespace

struct CudaModel::Impl {
  ModelConfig cfg;
  Weights w;
  std::vector<DeviceBuffer> buffers;  // every allocation the pointers in w point into
  int64_t bytes = 0;
  std::shared_ptr<GpuPrefixTier> prefix_tier;  // null: no GPU tier

  void* alloc(size_t bytes_needed) {
    buffers.emplace_back(bytes_needed);
    bytes += static_cast<int64_t>(bytes_needed);
    return buffers.back().data();
  }
};

CudaModel::CudaModel() : impl_(new Impl) {}

void CudaModel::set_prefix_gpu_tier(int64_t capacity_bytes) {
  RETROINFER_CHECK(capacity_bytes >= 0, "CudaModel: the prefix cache's GPU tier needs a capacity >= 0 bytes, got ",
                   capacity_bytes);
  impl_->prefix_tier = capacity_bytes > 0 ? GpuPrefixTier::make(capacity_bytes) : nullptr;
}

GpuPrefixTier* CudaModel::prefix_gpu_tier() const { return impl_->prefix_tier.get(); }

std::optional<PrefixGpuTierStats> CudaModel::prefix_gpu_tier_stats() const {
  if (impl_->prefix_tier == nullptr) return std::nullopt;
  return impl_->prefix_tier->stats();
}
CudaModel::~CudaModel() = default;

const ModelConfig& CudaModel::config() const { return impl_->cfg; }
WeightType CudaModel::weight_type() const { return impl_->w.type; }
int64_t CudaModel::weight_bytes() const { return impl_->bytes; }
const CudaModel::Weights& CudaModel::weights() const { return impl_->w; }

std::unique_ptr<CudaModel> CudaModel::upload(const Model& model, WeightType type) {
  const ModelConfig& c = model.config();
  validate(c);
  const Counts n(c);
  check_fits(n.bytes(c, type), "CudaModel::upload");
  std::unique_ptr<CudaModel> m(new CudaModel());
  Impl& im = *m->impl_;
  im.cfg = c;
  im.w.type = type;
  const Model::Weights& src = model.weights();

  DeviceBuffer staging;     // f32 chunk on its way to bf16
  std::vector<float> host;  // one chunk of rows widened from the CPU model's storage (weight_matrix.h)
  auto matrix = [&](const ::retroinfer::model::WeightMatrix& w, int64_t count, const char* what) -> const void* {
    RETROINFER_CHECK(w.rows() * w.cols() == count, "CudaModel::upload: ", what, " has ", w.rows() * w.cols(),
                     " elements, expected ", count, " from the config");
    void* dst = im.alloc(static_cast<size_t>(count) * elem_bytes(type));
    if (type != WeightType::kF32 && staging.bytes() == 0) staging = DeviceBuffer(kStagingFloats * 4);
    const int64_t chunk_rows =
        std::max<int64_t>(1, static_cast<int64_t>(kStagingFloats) / std::max<int64_t>(1, w.cols()));
    for (int64_t r0 = 0; r0 < w.rows(); r0 += chunk_rows) {
      const int64_t rows = std::min(chunk_rows, w.rows() - r0);
      const size_t len = static_cast<size_t>(rows * w.cols()), off = static_cast<size_t>(r0 * w.cols());
      host.resize(len);
      w.widen_rows(r0, rows, host.data());
      if (type == WeightType::kF32) {
        RETROINFER_CUDA_CHECK(cudaMemcpy(static_cast<float*>(dst) + off, host.data(), len * 4, cudaMemcpyHostToDevice));
        continue;
      }
      // Synchronous copy into the staging buffer: the previous chunk's conversion (default stream) has
      // finished reading it before cudaMemcpy starts (legacy default-stream ordering).
      RETROINFER_CUDA_CHECK(cudaMemcpy(staging.data(), host.data(), len * 4, cudaMemcpyHostToDevice));
      detail::launch_check(model::f32_to_bf16_array(staging.as<float>(), static_cast<uint16_t*>(dst) + off, len, nullptr),
                           "f32_to_bf16(upload)", nullptr);
    }
    return dst;
  };
  auto vec_f32 = [&](const std::vector<float>& host, int64_t count, const char* what) -> const float* {
    RETROINFER_CHECK(static_cast<int64_t>(host.size()) == count, "CudaModel::upload: ", what, " has ", host.size(),
                     " elements, expected ", count);
    void* dst = im.alloc(host.size() * 4);
    RETROINFER_CUDA_CHECK(cudaMemcpy(dst, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    return static_cast<const float*>(dst);
  };

  im.w.embed = matrix(src.embed, n.embed, "embed");
  im.w.lm_head = src.lm_head.empty() ? im.w.embed : matrix(src.lm_head, n.embed, "lm_head");  // empty: tied
  im.w.final_norm = vec_f32(src.final_norm, n.hidden, "final_norm");
  RETROINFER_CHECK(static_cast<int>(src.layers.size()) == c.num_layers, "CudaModel::upload: ", src.layers.size(),
                   " layers, expected ", c.num_layers);
  for (const auto& L : src.layers) {
    Weights::Layer d;
    d.attn_norm = vec_f32(L.attn_norm, n.hidden, "attn_norm");
    d.wqkv = matrix(L.wqkv, n.qkv * n.hidden, "wqkv");
    if (!L.bqkv.empty()) d.bqkv = vec_f32(L.bqkv, n.qkv, "bqkv");
    d.wo = matrix(L.wo, n.wo, "wo");
    d.mlp_norm = vec_f32(L.mlp_norm, n.hidden, "mlp_norm");
    d.wgate_up = matrix(L.wgate_up, n.gate_up, "wgate_up");
    d.wdown = matrix(L.wdown, n.down, "wdown");
    im.w.layers.push_back(d);
  }
  synchronize(nullptr);
  return m;
}

std::unique_ptr<CudaModel> CudaModel::random(const ModelConfig& cfg, uint64_t seed, WeightType type) {
  validate(cfg);
  const Counts n(cfg);
  check_fits(n.bytes(cfg, type), "CudaModel::random");
  std::unique_ptr<CudaModel> m(new CudaModel());
  Impl& im = *m->impl_;
  im.cfg = cfg;
  im.w.type = type;
  uint64_t tensor = 0;  // each tensor draws from its own stream: seed * 2^20 + index
  auto matrix = [&](int64_t count, float stddev) -> const void* {
    void* dst = im.alloc(static_cast<size_t>(count) * elem_bytes(type));
    const uint64_t s = seed * (uint64_t{1} << 20) + tensor++;
    if (type == WeightType::kBf16)
      fill_random_bf16(static_cast<uint16_t*>(dst), static_cast<size_t>(count), s, stddev);
    else
      fill_random_f32(static_cast<float*>(dst), static_cast<size_t>(count), s, stddev);
    return dst;
  };
  auto ones = [&](int64_t count) -> const float* {
    auto* dst = static_cast<float*>(im.alloc(static_cast<size_t>(count) * 4));
    detail::launch_check(model::fill_f32(dst, static_cast<size_t>(count), 1.0f, nullptr), "fill_f32", nullptr);
    return dst;
  };
  im.w.embed = matrix(n.embed, kRandomStd);
  im.w.lm_head = cfg.tie_word_embeddings ? im.w.embed : matrix(n.embed, kRandomStd);
  im.w.final_norm = ones(n.hidden);
  for (int l = 0; l < cfg.num_layers; ++l) {
    Weights::Layer d;
    d.attn_norm = ones(n.hidden);
    d.wqkv = matrix(n.qkv * n.hidden, kRandomStd);
    if (cfg.attention_bias) {
      auto* b = static_cast<float*>(im.alloc(static_cast<size_t>(n.qkv) * 4));
      fill_random_f32(b, static_cast<size_t>(n.qkv), seed * (uint64_t{1} << 20) + tensor++, kRandomStd);
      d.bqkv = b;
    }
    d.wo = matrix(n.wo, kRandomStd);
    d.mlp_norm = ones(n.hidden);
    d.wgate_up = matrix(n.gate_up, kRandomStd);
    d.wdown = matrix(n.down, kRandomStd);
    im.w.layers.push_back(d);
  }
  synchronize(nullptr);
  return m;
}

}  // namespace retroinfer::cuda
