// The reference causal attention kernel (see prefill_attention_ref.h).
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/common.cuh"
#include "kernels/cuda_check.h"
#include "kernels/prefill_attention_ref.h"
#include "retroinfer/dtype.h"
#include "retroinfer/error.h"

namespace retroinfer::cuda::model {
namespace {

constexpr int kWarps = 4;  // warps per CTA; one warp per (query row, query head)
constexpr int kPerLane = kRefMaxHeadDim / 32;

struct RefParams {
  RefAttentionArgs a;
  int num_heads_q = 0, num_heads_kv = 0, head_dim = 0;
  float scale = 0.0f;
};

// Lane l holds elements l, l + 32, ... of the head vector (those < head_dim).
__global__ void __launch_bounds__(kWarps * 32) ref_attention_kernel(RefParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t item = blockIdx.x * int64_t{kWarps} + (threadIdx.x >> 5);  // (row, query head)
  if (item >= p.a.n * p.num_heads_q) return;  // whole warps exit together
  const int64_t seq = blockIdx.y;
  const int64_t i = item / p.num_heads_q;
  const int h = static_cast<int>(item % p.num_heads_q);
  const int kvh = h / (p.num_heads_q / p.num_heads_kv);
  const int D = p.head_dim;
  const float* q = p.a.q + ((seq * p.a.n + i) * p.num_heads_q + h) * D;
  const int64_t head_base = (seq * p.num_heads_kv + kvh) * p.a.kv_stride * D;
  const uint16_t* K = p.a.k + head_base;
  const uint16_t* V = p.a.v + head_base;

  float qr[kPerLane], o[kPerLane];
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int j = lane + 32 * c;
    qr[c] = j < D ? q[j] : 0.0f;
    o[c] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int64_t last = p.a.pos0 + i;  // causal: keys [0, last]
  for (int64_t t = 0; t <= last; ++t) {
    const uint16_t* kr = K + t * D;
    float dot = 0.0f;
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) {
      const int j = lane + 32 * c;
      if (j < D) dot += qr[c] * bf16_to_f32(kr[j]);
    }
    const float sc = detail::warp_sum(dot) * p.scale;
    const float m_new = fmaxf(m, sc);
    const float a = expf(m - m_new);  // 0 for the first key (m = -inf)
    const float e = expf(sc - m_new);
    l = l * a + e;
    const uint16_t* vr = V + t * D;
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) {
      const int j = lane + 32 * c;
      if (j < D) o[c] = o[c] * a + e * bf16_to_f32(vr[j]);
    }
    m = m_new;
  }
  float* out = p.a.out + ((seq * p.a.n + i) * p.num_heads_q + h) * D;
  const float inv = 1.0f / l;  // l >= 1: the running max's own term is e^0
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int j = lane + 32 * c;
    if (j < D) out[j] = o[c] * inv;
  }
}

}  // namespace

void prefill_attention_reference(const AttentionShape& shape, const RefAttentionArgs& a, Stream s) {
  validate(shape);
  RETROINFER_CHECK(shape.head_dim % 2 == 0 && shape.head_dim <= kRefMaxHeadDim, "reference attention: head_dim ",
                   shape.head_dim, " must be even and <= ", kRefMaxHeadDim);
  RETROINFER_CHECK(a.q != nullptr && a.k != nullptr && a.v != nullptr && a.out != nullptr,
                   "reference attention: null q, k, v or out");
  RETROINFER_CHECK(a.n >= 1 && a.pos0 >= 0 && a.pos0 + a.n <= a.kv_stride, "reference attention: query rows [",
                   a.pos0, ", ", a.pos0 + a.n, ") do not fit the KV stride ", a.kv_stride);
  RETROINFER_CHECK(a.num_seqs >= 1 && a.num_seqs <= 65535, "reference attention: num_seqs ", a.num_seqs,
                   " outside [1, 65535]");
  const int64_t items = a.n * shape.num_heads_q;
  const int64_t blocks = (items + kWarps - 1) / kWarps;
  RETROINFER_CHECK(blocks < (int64_t{1} << 31), "reference attention: ", items, " (row, head) items are too many");
  RefParams p;
  p.a = a;
  p.num_heads_q = shape.num_heads_q;
  p.num_heads_kv = shape.num_heads_kv;
  p.head_dim = shape.head_dim;
  p.scale = a.scale != 0.0f ? a.scale : 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  auto st = static_cast<cudaStream_t>(s);
  ref_attention_kernel<<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(a.num_seqs)), kWarps * 32, 0, st>>>(p);
  detail::launch_check(cudaSuccess, "prefill_attention_reference", st);
}

}  // namespace retroinfer::cuda::model
