// CudaSession::plan: the session's memory plan (buffer/session_planner.h does the arithmetic) against the
// memory free now, and CudaSession::fill_synthetic (synthetic K/V, cuda_synthetic.h, for benchmarks).
//
// Plan conventions (as the CUDA runner's constructor uses them): gpu_bytes = weight_bytes + the session's
// bytes; gpu_free_bytes = weight_bytes + the session's limit (opt.gpu_memory_limit, or the device's free
// memory now less buffer::kGpuReserveBytes: the weights are resident already, so the free memory excludes
// them); the check is therefore the session's bytes against its limit. host_free_bytes: opt.host_memory_limit
// or kHostUsableFraction of MemAvailable. The activation figure is the runner's own (session_activation_bytes).
#include <algorithm>
#include <cstdint>
#include <limits>

#include "retroinfer/memory_planner.h"
#include "retroinfer/session_planner.h"
#include "retroinfer/cuda_model.h"
#include "retroinfer/error.h"
#include "retroinfer/model.h"

#include <cuda_runtime.h>

#include "kernels/cuda_check.h"
#include "kernels/kernels.h"
#include "kernels/kv_int8_kernels.h"
#include "model/cuda/session_state.h"
#include "retroinfer/cuda_synthetic.h"

namespace retroinfer::cuda {

static_assert(buffer::kInt8KvCalibrationFloats == 2 + 2 * detail::kKeyStatSplits,
              "the plan counts the 8-bit KV cache's key calibration as KvInt8Cache::bytes allocates it");

CudaSessionPlan CudaSession::plan(const ModelConfig& cfg, const CudaSessionOptions& opt, int num_seqs,
                                  int64_t weight_bytes) {
  validate(cfg);
  RETROINFER_CHECK(opt.max_context >= 0, "CudaSession: max_context must be >= 0 (0 = the model's), got ",
                   opt.max_context);
  RETROINFER_CHECK(weight_bytes >= 0, "CudaSession: weight_bytes must be >= 0, got ", weight_bytes);
  buffer::SessionPlanRequest r;
  buffer::set_model_shape(r, cfg);
  r.attention = opt.attention;
  r.wave = opt.wave;
  r.kv_dtype = opt.kv_dtype;
  const int64_t model_max = model_max_context(cfg);
  r.max_context = opt.max_context > 0 ? opt.max_context : model_max;
  RETROINFER_CHECK(r.max_context < std::numeric_limits<int32_t>::max(), "CudaSession: max_context is not set and ",
                   "the model states no max_position_embeddings; set CudaSessionOptions::max_context");
  RETROINFER_CHECK(r.max_context <= model_max, "CudaSession: max_context ", r.max_context, " exceeds the model's ",
                   model_max, " positions; use a shorter context");
  r.prefill_chunk = opt.prefill_chunk;
  r.num_seqs = num_seqs;
  r.placement = opt.placement;
  r.gpu_layers = opt.gpu_layers;
  r.weight_bytes = weight_bytes;
  r.gpu_free_bytes =
      weight_bytes + buffer::resolve_gpu_limit(opt.gpu_memory_limit, [&] {
        return std::max<int64_t>(0, device_memory_info().first - opt.gpu_held_back_bytes);
      });
  r.host_free_bytes = buffer::resolve_host_limit(opt.host_memory_limit, [] { return buffer::host_memory_available(); });
  if (num_seqs >= 1 && opt.prefill_chunk >= 1) {
    const int64_t rows = session_rows(opt, r.max_context, num_seqs);
    // The plan does not know the weight type: the larger of the two layouts (bf16 keeps GEMM inputs in bf16
    // plus a cuBLASLt workspace; f32 keeps them in f32).
    const int64_t logit_rows = session_logit_rows(rows, num_seqs);
    r.activation_bytes_override = std::max(session_activation_bytes(cfg, rows, logit_rows, num_seqs, /*bf16=*/true),
                                           session_activation_bytes(cfg, rows, logit_rows, num_seqs, /*bf16=*/false));
  }
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

namespace {
// Rows [0, tokens) of every (sequence, KV head) of src into dst, both [num_seqs, Hkv, kv_stride, D] bf16:
// one 1-D device copy per (sequence, head) (a head's rows are contiguous; 2-D copies would need pitches of
// kv_stride rows, beyond the 2-D copy limits at millions of tokens).
void copy_rows(uint16_t* dst, const uint16_t* src, int64_t heads, int64_t tokens, int64_t kv_stride, int head_dim,
               Stream s) {
  const size_t bytes = static_cast<size_t>(tokens) * head_dim * 2;
  for (int64_t f = 0; f < heads; ++f) {
    const size_t at = static_cast<size_t>(f) * kv_stride * head_dim;
    RETROINFER_CUDA_CHECK(
        cudaMemcpyAsync(dst + at, src + at, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(s)));
  }
}
}  // namespace

// Every layer's K/V of every sequence gets the same `tokens` tokens of synthetic K/V, layer by layer: the
// first filled buffer (layer 0's K/V, or the staging buffer when layer 0 is host-tier) comes from the
// generator's pinned host copy; every other GPU-tier layer is a device copy of it; the host-tier layers all
// read the staging buffer, which prefill_done only reads, so it is filled once. After each layer its
// prefill_done builds the index (a host-tier layer copies the staging buffer into its store), then the
// progress call.
void CudaSession::fill_synthetic(int64_t tokens, uint64_t seed, const PrefillProgress& progress) {
  Impl& im = *impl_;
  const ModelConfig& c = im.model.config();
  RETROINFER_CHECK(!im.prefilled, "CudaSession::fill_synthetic: the session already holds tokens (prefill or "
                   "fill_synthetic runs once per session)");
  RETROINFER_CHECK(tokens >= 1 && tokens <= im.max_context, "CudaSession::fill_synthetic: ", tokens,
                   " tokens do not fit the session's ", im.max_context, " per sequence");
  im.check_host_tier_length(tokens, "fill_synthetic");
  SyntheticKvShape sh;
  sh.num_heads_kv = c.num_heads_kv;
  sh.head_dim = c.head_dim;
  sh.tokens = tokens;
  sh.seed = seed;
  sh.rope_theta = c.rope_theta;
  sh.rope_llama3_factor = c.rope_scaling.type == "llama3" ? std::max(1.0f, c.rope_scaling.factor) : 1.0;
  const SyntheticKv syn(sh);  // throws (before touching the session) on a context the generator refuses
  const int L = c.num_layers;
  const int64_t heads = int64_t{im.num_seqs} * c.num_heads_kv;
  im.pos.assign(size_t(im.num_seqs), tokens);
  im.index_build_s = 0.0;
  im.make_attention();
  const uint16_t* src_k = nullptr;  // the first filled layer's K/V (device)
  const uint16_t* src_v = nullptr;
  bool staged = false;  // the staging buffer holds the synthetic K/V
  for (int l = 0; l < L; ++l) {
    uint16_t* dk = im.prefill_k(l);
    uint16_t* dv = im.prefill_v(l);
    if (src_k == nullptr) {
      syn.fill(dk, dv, im.num_seqs, im.max_context, im.stream);
      src_k = dk;
      src_v = dv;
      staged = im.owns_kv(l);
    } else if (dk != src_k && !(im.owns_kv(l) && staged)) {
      copy_rows(dk, src_k, heads, tokens, im.max_context, c.head_dim, im.stream);
      copy_rows(dv, src_v, heads, tokens, im.max_context, c.head_dim, im.stream);
      staged = staged || im.owns_kv(l);
    }
    im.timed_prefill_done(l);  // synchronises
    if (progress) progress(tokens * (l + 1) / L, tokens);
  }
  synchronize(im.stream);  // the copies read syn's pinned memory, freed on return
  im.prefilled = true;
  im.drop_decode_graphs();  // a (re)fill may have reallocated buffers the graphs captured
}

}  // namespace retroinfer::cuda
