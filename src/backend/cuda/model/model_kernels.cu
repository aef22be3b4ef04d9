// Element-wise and row kernels of the CUDA model runner (see model_kernels.h). Rounding follows the CPU
// runner (src/model/session.cpp) operation by operation where that is cheap: RMSNorm's mean of squares in
// f64, RoPE with separately rounded products (no FMA contraction, as the CPU's baseline x86-64 code), IEEE
// division and expf in SiLU, so the f32-weight path differs from the CPU only by GEMM summation order.
#include <cuda_bf16.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/model/model_kernels.h"
#include "retroinfer/dtype.h"

namespace retroinfer::cuda::model {
namespace {

constexpr int kThreads = 256;

// Grid for a grid-stride loop over n elements: enough CTAs to fill the chip, capped (a grid-stride loop
// covers the rest).
int grid_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

__global__ void embed_kernel(EmbedParams p) {
  const int64_t total = p.rows * p.hidden;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / p.hidden, i = e % p.hidden;
    const int64_t src = static_cast<int64_t>(p.tokens[r]) * p.hidden + i;
    p.x[e] = p.bf16 ? bf16_to_f32(static_cast<const uint16_t*>(p.embed)[src]) : static_cast<const float*>(p.embed)[src];
  }
}

__global__ void rms_norm_kernel(RmsNormParams p) {
  const int64_t r = blockIdx.x;
  const float* x = p.x + r * p.x_stride;
  double ss = 0.0;
  for (int64_t i = threadIdx.x; i < p.hidden; i += blockDim.x) ss += static_cast<double>(x[i]) * x[i];
  __shared__ double part[kThreads];
  part[threadIdx.x] = ss;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  const float inv = 1.0f / sqrtf(static_cast<float>(part[0] / static_cast<double>(p.hidden)) + p.eps);
  float* y = p.y + r * p.hidden;
  for (int64_t i = threadIdx.x; i < p.hidden; i += blockDim.x) y[i] = p.w[i] * (x[i] * inv);
}

__global__ void qkv_post_kernel(QkvPostParams p) {
  const int half = p.head_dim / 2;
  const int heads = p.num_heads_q + 2 * p.num_heads_kv;
  const int64_t width = static_cast<int64_t>(heads) * p.head_dim;
  const int64_t total = p.rows * heads * half;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const int i = static_cast<int>(e % half);
    const int hh = static_cast<int>((e / half) % heads);
    const int64_t r = e / (int64_t{half} * heads);
    const int64_t col = static_cast<int64_t>(hh) * p.head_dim + i;
    float a = p.qkv[r * width + col], b = p.qkv[r * width + col + half];
    if (p.bias != nullptr) {
      a += p.bias[col];
      b += p.bias[col + half];
    }
    if (hh < p.num_heads_q + p.num_heads_kv) {  // q or k: rotate (products rounded separately, as the CPU)
      const float c = p.cos[r * half + i], s = p.sin[r * half + i];
      const float y0 = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
      const float y1 = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
      a = y0;
      b = y1;
    }
    if (hh < p.num_heads_q) {
      float* q = p.q + (r * p.num_heads_q + hh) * p.head_dim;
      q[i] = a;
      q[i + half] = b;
      continue;
    }
    const bool is_k = hh < p.num_heads_q + p.num_heads_kv;
    const int kvh = is_k ? hh - p.num_heads_q : hh - p.num_heads_q - p.num_heads_kv;
    const uint16_t ba = f32_to_bf16(a), bb = f32_to_bf16(b);
    uint16_t* cache = is_k ? p.k_cache : p.v_cache;
    if (cache != nullptr) {  // null: a host-tier layer in decode (the token goes to k_new / v_new only)
      const int64_t dst =
          ((static_cast<int64_t>(p.row_seq[r]) * p.num_heads_kv + kvh) * p.kv_stride + p.row_pos[r]) * p.head_dim + i;
      cache[dst] = ba;
      cache[dst + half] = bb;
    }
    uint16_t* nw = is_k ? p.k_new : p.v_new;
    if (nw != nullptr) {
      const int64_t n = (r * p.num_heads_kv + kvh) * p.head_dim + i;
      nw[n] = ba;
      nw[n + half] = bb;
    }
  }
}

__global__ void swiglu_kernel(SwiGluParams p) {
  const int64_t total = p.rows * p.inter;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / p.inter, i = e % p.inter;
    const float g = p.gu[r * 2 * p.inter + i], u = p.gu[r * 2 * p.inter + p.inter + i];
    p.act[e] = __fmul_rn(g / (1.0f + expf(-g)), u);
  }
}

__global__ void to_bf16_kernel(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    dst[i] = f32_to_bf16(src[i]);
}

__global__ void fill_kernel(float* dst, size_t n, float value) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    dst[i] = value;
}

// (value, index) better than (bv, bi): larger value, ties to the lower index; bi < 0 is "none yet".
__device__ __forceinline__ bool better(float v, int32_t i, float bv, int32_t bi) {
  return bi < 0 || v > bv || (v == bv && i < bi);
}

__global__ void argmax_kernel(ArgmaxParams p) {
  const float* row = p.logits + blockIdx.x * p.vocab;
  float bv = 0.0f;
  int32_t bi = -1;
  for (int64_t i = threadIdx.x; i < p.vocab; i += blockDim.x) {
    const float v = row[i];
    if (!isnan(v) && better(v, static_cast<int32_t>(i), bv, bi)) {
      bv = v;
      bi = static_cast<int32_t>(i);
    }
  }
  __shared__ float sv[kThreads];
  __shared__ int32_t si[kThreads];
  sv[threadIdx.x] = bv;
  si[threadIdx.x] = bi;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) {
      const int32_t oi = si[threadIdx.x + w];
      if (oi >= 0 && better(sv[threadIdx.x + w], oi, sv[threadIdx.x], si[threadIdx.x])) {
        sv[threadIdx.x] = sv[threadIdx.x + w];
        si[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) p.next[blockIdx.x] = si[0];
}

}  // namespace

cudaError_t embed_gather(const EmbedParams& p, cudaStream_t s) {
  embed_kernel<<<grid_for(p.rows * p.hidden), kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

cudaError_t rms_norm(const RmsNormParams& p, cudaStream_t s) {
  rms_norm_kernel<<<static_cast<unsigned>(p.rows), kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

cudaError_t qkv_post(const QkvPostParams& p, cudaStream_t s) {
  const int64_t total = p.rows * (p.num_heads_q + 2 * p.num_heads_kv) * (p.head_dim / 2);
  qkv_post_kernel<<<grid_for(total), kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

cudaError_t swiglu(const SwiGluParams& p, cudaStream_t s) {
  swiglu_kernel<<<grid_for(p.rows * p.inter), kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

cudaError_t f32_to_bf16_array(const float* src, uint16_t* dst, size_t count, cudaStream_t s) {
  to_bf16_kernel<<<grid_for(static_cast<int64_t>(count)), kThreads, 0, s>>>(src, dst, count);
  return cudaGetLastError();
}

cudaError_t fill_f32(float* dst, size_t count, float value, cudaStream_t s) {
  fill_kernel<<<grid_for(static_cast<int64_t>(count)), kThreads, 0, s>>>(dst, count, value);
  return cudaGetLastError();
}

cudaError_t argmax_rows(const ArgmaxParams& p, cudaStream_t s) {
  argmax_kernel<<<static_cast<unsigned>(p.rows), kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

}  // namespace retroinfer::cuda::model
