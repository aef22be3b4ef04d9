// CudaSession::plan: the session's memory plan (buffer/session_planner.h does the arithmetic) against
// the memory free now. Uses nothing of CudaSession's internals, so it is also the constructor's check.
//
// weight_bytes (the model's device bytes) count toward the plan only against an explicit
// opt.gpu_memory_limit, which is then a budget for the weights and the session together. With no limit
// the free device memory is measured now, with the weights already resident, so they are not counted
// twice. Either way a caller may pass model.weight_bytes().
#include <cstdint>
#include <limits>

#include "buffer/memory_planner.h"
#include "buffer/session_planner.h"
#include "retroinfer/cuda_model.h"
#include "retroinfer/error.h"
#include "retroinfer/model.h"

namespace retroinfer::cuda {

namespace {
buffer::SessionPlacement to_buffer(KvPlacement p) {
  switch (p) {
    case KvPlacement::kGpu: return buffer::SessionPlacement::kGpu;
    case KvPlacement::kHost: return buffer::SessionPlacement::kHost;
    case KvPlacement::kSplit: return buffer::SessionPlacement::kSplit;
    case KvPlacement::kAuto: return buffer::SessionPlacement::kAuto;
  }
  return buffer::SessionPlacement::kGpu;
}
}  // namespace

CudaSessionPlan CudaSession::plan(const ModelConfig& cfg, const CudaSessionOptions& opt, int num_seqs,
                                  int64_t weight_bytes) {
  buffer::SessionPlanRequest r;
  buffer::set_model_shape(r, cfg);
  r.attention = opt.attention;
  r.wave = opt.wave;
  const int64_t model_max = model_max_context(cfg);
  r.max_context = opt.max_context > 0 ? opt.max_context : model_max;
  RETROINFER_CHECK(r.max_context < std::numeric_limits<int32_t>::max(), "CudaSession: max_context is not set and ",
                   "the model states no max_position_embeddings; set CudaSessionOptions::max_context");
  RETROINFER_CHECK(r.max_context <= model_max, "CudaSession: max_context ", r.max_context, " exceeds the model's ",
                   model_max, " positions");
  r.prefill_chunk = opt.prefill_chunk;
  r.num_seqs = num_seqs;
  r.placement = to_buffer(opt.placement);
  r.gpu_layers = opt.gpu_layers;
  r.weight_bytes = opt.gpu_memory_limit > 0 ? weight_bytes : 0;
  r.gpu_free_bytes = buffer::resolve_gpu_limit(opt.gpu_memory_limit, [] { return device_memory_info().first; });
  r.host_free_bytes = buffer::resolve_host_limit(opt.host_memory_limit, [] { return buffer::host_memory_available(); });
  const buffer::SessionPlanBreakdown b = buffer::plan_session(r);
  CudaSessionPlan p;
  p.num_seqs = b.num_seqs;
  p.max_context = b.max_context;
  p.gpu_layers = b.gpu_layers;
  p.host_layers = b.host_layers;
  p.gpu_bytes = b.gpu_bytes;
  p.host_bytes = b.host_bytes;
  p.gpu_free_bytes = b.gpu_free_bytes;
  p.host_free_bytes = b.host_free_bytes;
  return p;
}

}  // namespace retroinfer::cuda
