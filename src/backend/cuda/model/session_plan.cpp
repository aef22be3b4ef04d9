// CudaSession's memory plan and the placements. This build implements KvPlacement::kGpu (and kAuto when
// kGpu fits); kHost / kSplit and fill_synthetic throw "not implemented in this build" (the benchdecode work
// replaces this file).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/model/session_state.h"
#include "retroinfer/error.h"
#include "retroinfer/model.h"

namespace retroinfer::cuda {
namespace {

// GPU memory kept free beside a session when no limit is given: the CUDA context, cuBLAS's workspace and
// allocator slack (measured context + cuBLAS handle on an H200: a few hundred MiB; 1 GiB leaves room).
constexpr int64_t kGpuReserveBytes = int64_t{1} << 30;
// Decode-attention workspace allowance per layer for full attention: DenseDecoder's split partials, at most
// (CTAs per SM <= 4) x (SMs <= 132 on an H200) x (group <= 8) x (8 + 4 * 128) bytes = 2.2 MB; 4 MiB covers it.
constexpr int64_t kFullAttentionBytesPerLayer = int64_t{4} << 20;

constexpr int64_t kMiB = int64_t{1} << 20;

int64_t resolve_max_context(const ModelConfig& cfg, const CudaSessionOptions& opt) {
  const int64_t model_max = model_max_context(cfg);
  RETROINFER_CHECK(opt.max_context >= 0, "CUDA session: max_context must be >= 0 (0 = the model's), got ",
                   opt.max_context);
  const int64_t m = opt.max_context > 0 ? opt.max_context : model_max;
  RETROINFER_CHECK(m != INT64_MAX, "CUDA session: the model states no maximum context; set max_context");
  RETROINFER_CHECK(m <= model_max, "CUDA session: max_context ", m, " exceeds the model's maximum context of ",
                   model_max, " tokens; use a shorter context");
  return m;
}

// Budget for everything on the GPU, weights included (they are resident already: the session checks its own
// bytes against what is left after them).
int64_t gpu_budget(const CudaSessionOptions& opt, int64_t weight_bytes) {
  if (opt.gpu_memory_limit > 0) return weight_bytes + opt.gpu_memory_limit;
  size_t free_b = 0, total_b = 0;
  RETROINFER_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return weight_bytes + std::max<int64_t>(static_cast<int64_t>(free_b) - kGpuReserveBytes, 0);
}

// Every layer's KV on the GPU. Throws when it does not fit.
CudaSessionPlan plan_gpu(const ModelConfig& cfg, const CudaSessionOptions& opt, int num_seqs, int64_t weight_bytes,
                         int64_t max_context) {
  CudaSessionPlan p;
  p.num_seqs = num_seqs;
  p.max_context = max_context;
  p.gpu_layers = cfg.num_layers;
  p.host_layers = 0;
  const int64_t kv = 2 * int64_t{cfg.num_layers} * num_seqs * cfg.num_heads_kv * max_context * cfg.head_dim * 2;
  const int64_t rows = session_rows(opt, max_context, num_seqs);
  const bool bf16_weights = true;  // the larger of the two (the bf16 GEMM workspace); weights' type is not known here
  const int64_t act = session_activation_bytes(cfg, rows, session_logit_rows(rows, num_seqs), num_seqs, bf16_weights);
  const int64_t attention = int64_t{cfg.num_layers} * kFullAttentionBytesPerLayer;
  p.gpu_bytes = weight_bytes + kv + act + attention;
  p.gpu_free_bytes = gpu_budget(opt, weight_bytes);
  RETROINFER_CHECK(p.gpu_bytes <= p.gpu_free_bytes, "CUDA session: ", num_seqs, " sequence(s) of ", max_context,
                   " tokens need ", p.gpu_bytes / kMiB, " MiB of GPU memory (weights ", weight_bytes / kMiB, ", KV ",
                   kv / kMiB, ", activations ", act / kMiB, ", attention ", attention / kMiB, ") but ",
                   p.gpu_free_bytes / kMiB, " MiB are available",
                   opt.gpu_memory_limit > 0 ? " (weights + gpu_memory_limit)" : " (weights + free memory - 1 GiB reserve)",
                   "; use fewer sequences or a shorter context");
  return p;
}

[[noreturn]] void placement_not_implemented(KvPlacement placement) {
  const char* name = placement == KvPlacement::kHost ? "host" : placement == KvPlacement::kSplit ? "split" : "auto";
  RETROINFER_FAIL("CUDA session: KV placement '", name,
                  "' (host-resident layers through the wave buffer) is not implemented in this build; use the "
                  "GPU placement");
}

}  // namespace

CudaSessionPlan CudaSession::plan(const ModelConfig& cfg, const CudaSessionOptions& opt, int num_seqs,
                                  int64_t weight_bytes) {
  RETROINFER_CHECK(num_seqs >= 1, "CUDA session: num_seqs must be >= 1, got ", num_seqs);
  RETROINFER_CHECK(opt.prefill_chunk >= 1, "CUDA session: prefill_chunk must be >= 1, got ", opt.prefill_chunk);
  RETROINFER_CHECK(weight_bytes >= 0, "CUDA session: weight_bytes must be >= 0, got ", weight_bytes);
  validate(cfg);
  const int64_t max_context = resolve_max_context(cfg, opt);
  switch (opt.placement) {
    case KvPlacement::kGpu:
      return plan_gpu(cfg, opt, num_seqs, weight_bytes, max_context);
    case KvPlacement::kAuto:
      // kGpu when it fits; the split placement that would follow is not in this build.
      try {
        return plan_gpu(cfg, opt, num_seqs, weight_bytes, max_context);
      } catch (const Error& e) {
        RETROINFER_FAIL(e.what(), " (KV placement 'auto': the split / host placements that would take over are not "
                        "implemented in this build)");
      }
    case KvPlacement::kHost:
    case KvPlacement::kSplit:
      break;
  }
  placement_not_implemented(opt.placement);
}

void CudaSession::fill_synthetic(int64_t tokens, uint64_t seed, const PrefillProgress& progress) {
  (void)tokens;
  (void)seed;
  (void)progress;
  RETROINFER_FAIL("CudaSession::fill_synthetic is not implemented in this build; use prefill");
}

}  // namespace retroinfer::cuda
