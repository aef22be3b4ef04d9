// Element-wise and row kernels of the CUDA model runner (see model_kernels.h). Rounding follows the CPU
// runner (src/model/session.cpp) operation by operation where that is cheap: RMSNorm's mean of squares in
// f64, RoPE with separately rounded products (no FMA contraction, as the CPU's baseline x86-64 code), IEEE
// division and expf in SiLU, so the f32-weight path differs from the CPU only by GEMM summation order.
#include <cuda_bf16.h>

#include "kernels/common.cuh"
#include "kernels/model_kernels.h"
#include "kernels/silu.cuh"
#include "retroinfer/dtype.h"

namespace retroinfer::cuda::model {
namespace {

constexpr int kThreads = 256;

// Grid for a grid-stride loop over n elements: enough CTAs to fill the chip, capped (a grid-stride loop
// covers the rest).
// True when p is a multiple of `bytes` (null counts as aligned: nothing is accessed through it).
bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

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

// Scalar fallback (any width or alignment): one CTA of kThreads per row, two passes over x.
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
  for (int64_t i = threadIdx.x; i < p.hidden; i += blockDim.x) {
    const float v = p.w[i] * (x[i] * inv);
    if (p.y != nullptr) p.y[r * p.hidden + i] = v;
    if (p.y_bf16 != nullptr) p.y_bf16[r * p.hidden + i] = f32_to_bf16(v);
  }
}

// Sum of v over the CTA (blockDim.x a multiple of 32, at most 1024), returned to every thread.
__device__ __forceinline__ double block_sum(double v) {
  __shared__ double warp_part[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) warp_part[warp] = v;
  __syncthreads();
  double t = lane < warps ? warp_part[lane] : 0.0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  return t;  // every warp reduced the same 32 partials in the same order: the same value everywhere
}

// One pass: thread t holds float4 t, t + blockDim, ... (kVec of them) of its row in registers. hidden % 4 == 0
// and hidden / 4 <= kVec * blockDim.x (the launcher's choice).
template <int kVec>
__global__ void __launch_bounds__(1024) rms_norm_vec_kernel(RmsNormParams p) {
  const int64_t r = blockIdx.x;
  const int64_t h4 = p.hidden / 4;
  const float4* x = reinterpret_cast<const float4*>(p.x + r * p.x_stride);
  float4 v[kVec];
  double ss = 0.0;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * blockDim.x;
    v[j] = i < h4 ? x[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    ss += static_cast<double>(v[j].x) * v[j].x + static_cast<double>(v[j].y) * v[j].y +
          static_cast<double>(v[j].z) * v[j].z + static_cast<double>(v[j].w) * v[j].w;
  }
  ss = block_sum(ss);
  const float inv = 1.0f / sqrtf(static_cast<float>(ss / static_cast<double>(p.hidden)) + p.eps);
  const float4* w = reinterpret_cast<const float4*>(p.w);
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * blockDim.x;
    if (i >= h4) break;
    const float4 g = w[i];
    float4 o;
    o.x = g.x * (v[j].x * inv);
    o.y = g.y * (v[j].y * inv);
    o.z = g.z * (v[j].z * inv);
    o.w = g.w * (v[j].w * inv);
    if (p.y != nullptr) reinterpret_cast<float4*>(p.y + r * p.hidden)[i] = o;
    if (p.y_bf16 != nullptr) {
      uint2 b;
      b.x = uint32_t{f32_to_bf16(o.x)} | (uint32_t{f32_to_bf16(o.y)} << 16);
      b.y = uint32_t{f32_to_bf16(o.z)} | (uint32_t{f32_to_bf16(o.w)} << 16);
      reinterpret_cast<uint2*>(p.y_bf16 + r * p.hidden)[i] = b;
    }
  }
}

__global__ void qkv_post_kernel(QkvPostParams p) {
  const int half = p.head_dim / 2;
  const int heads = p.num_heads_q + 2 * p.num_heads_kv;
  const int64_t width = static_cast<int64_t>(heads) * p.head_dim;
  const int64_t total = p.rows * heads * half;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    int i, hh;
    int64_t r;
    if (total <= INT32_MAX) {  // 32-bit division (decode and ordinary prefill chunks): far cheaper than 64-bit
      const int e32 = static_cast<int>(e);
      i = e32 % half;
      hh = (e32 / half) % heads;
      r = e32 / (half * heads);
    } else {
      i = static_cast<int>(e % half);
      hh = static_cast<int>((e / half) % heads);
      r = e / (int64_t{half} * heads);
    }
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
      const int64_t at = (r * p.num_heads_q + hh) * p.head_dim + i;
      p.q[at] = a;
      p.q[at + half] = b;
      if (p.q_bf16 != nullptr) {
        p.q_bf16[at] = f32_to_bf16(a);
        p.q_bf16[at + half] = f32_to_bf16(b);
      }
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

__global__ void kv_append_kernel(KvAppendParams p) {
  const int64_t per_row = int64_t{p.num_heads_kv} * p.head_dim, total = p.rows * per_row;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / per_row, rem = e % per_row;
    const int64_t h = rem / p.head_dim, i = rem % p.head_dim;
    const KvAppendRow d = p.dst[r];
    if (d.k == nullptr) continue;  // a host-tier layer of that row's session
    const int64_t at = (h * d.kv_stride + d.pos) * p.head_dim + i;
    d.k[at] = p.k_new[e];
    d.v[at] = p.v_new[e];
  }
}

__device__ __forceinline__ float gate_up_at(const SwiGluParams& p, int64_t i) {
  return p.gu != nullptr ? p.gu[i] : bf16_to_f32(p.gu_bf16[i]);
}

__global__ void swiglu_kernel(SwiGluParams p) {
  const int64_t total = p.rows * p.inter;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / p.inter, i = e % p.inter;
    const float v = silu_mul(gate_up_at(p, r * 2 * p.inter + i), gate_up_at(p, r * 2 * p.inter + p.inter + i));
    if (p.act != nullptr) p.act[e] = v;
    if (p.act_bf16 != nullptr) p.act_bf16[e] = f32_to_bf16(v);
  }
}

// Four bf16 values (8 bytes) widened to f32 (common.cuh's pair widening).
__device__ __forceinline__ float4 widen4(uint2 b) {
  const float2 lo = detail::bf16x2_to_float2(b.x), hi = detail::bf16x2_to_float2(b.y);
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// Four elements per thread: inter % 4 == 0 and the alignments checked by the launcher.
__global__ void swiglu_vec_kernel(SwiGluParams p) {
  const int64_t inter4 = p.inter / 4, total = p.rows * inter4;
  const float4* gu = reinterpret_cast<const float4*>(p.gu);
  const uint2* gu16 = reinterpret_cast<const uint2*>(p.gu_bf16);
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / inter4, i = e % inter4;
    const int64_t gi = r * 2 * inter4 + i, ui = gi + inter4;
    const float4 g = gu != nullptr ? gu[gi] : widen4(gu16[gi]), u = gu != nullptr ? gu[ui] : widen4(gu16[ui]);
    float4 o;
    o.x = silu_mul(g.x, u.x);
    o.y = silu_mul(g.y, u.y);
    o.z = silu_mul(g.z, u.z);
    o.w = silu_mul(g.w, u.w);
    if (p.act != nullptr) reinterpret_cast<float4*>(p.act)[e] = o;
    if (p.act_bf16 != nullptr) {
      uint2 b;
      b.x = uint32_t{f32_to_bf16(o.x)} | (uint32_t{f32_to_bf16(o.y)} << 16);
      b.y = uint32_t{f32_to_bf16(o.z)} | (uint32_t{f32_to_bf16(o.w)} << 16);
      reinterpret_cast<uint2*>(p.act_bf16)[e] = b;
    }
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

// One CTA of kArgmaxThreads per row: an LM-head row is 128K floats at Llama-3's vocabulary, so the row
// must be read with many loads in flight (a 256-thread scalar loop took 47 us per row on the H200, ncu;
// float4 loads from 1024 threads keep ~64 KiB in flight). Ties go to the lower index in every order of
// reduction (better() compares indices), NaN never wins, a row without a number gives -1.
constexpr int kArgmaxThreads = 1024;

__device__ __forceinline__ void keep_better(float v, int32_t i, float& bv, int32_t& bi) {
  if (!isnan(v) && better(v, i, bv, bi)) {
    bv = v;
    bi = i;
  }
}

__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(ArgmaxParams p) {
  const float* row = p.logits + blockIdx.x * p.vocab;
  float bv = 0.0f;
  int32_t bi = -1;
  const bool vec = p.vocab % 4 == 0 && (reinterpret_cast<uintptr_t>(row) & 15) == 0;
  if (vec) {
    const float4* r4 = reinterpret_cast<const float4*>(row);
    const int64_t n4 = p.vocab / 4;
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < n4; i += kArgmaxThreads) {
      const float4 x = __ldg(r4 + i);
      const int32_t base = static_cast<int32_t>(4 * i);
      keep_better(x.x, base, bv, bi);
      keep_better(x.y, base + 1, bv, bi);
      keep_better(x.z, base + 2, bv, bi);
      keep_better(x.w, base + 3, bv, bi);
    }
  } else {
    for (int64_t i = threadIdx.x; i < p.vocab; i += kArgmaxThreads) keep_better(row[i], static_cast<int32_t>(i), bv, bi);
  }
  // Warp, then across the 32 warps.
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_down_sync(0xffffffffu, bv, off);
    const int32_t oi = __shfl_down_sync(0xffffffffu, bi, off);
    if (oi >= 0 && better(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
  __shared__ float sv[kArgmaxThreads / 32];
  __shared__ int32_t si[kArgmaxThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sv[warp] = bv;
    si[warp] = bi;
  }
  __syncthreads();
  if (warp == 0) {
    bv = sv[lane];
    bi = si[lane];
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_down_sync(0xffffffffu, bv, off);
      const int32_t oi = __shfl_down_sync(0xffffffffu, bi, off);
      if (oi >= 0 && better(ov, oi, bv, bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (lane == 0) p.next[blockIdx.x] = bi;
  }
}

}  // namespace

cudaError_t embed_gather(const EmbedParams& p, cudaStream_t s) {
  embed_kernel<<<grid_for(p.rows * p.hidden), kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

bool rms_norm_vectorised(const RmsNormParams& p) {
  return p.hidden % 4 == 0 && p.hidden >= 4 && p.hidden <= kRmsNormMaxVecHidden && p.x_stride % 4 == 0 &&
         aligned(p.x, 16) && aligned(p.w, 16) && aligned(p.y, 16) && aligned(p.y_bf16, 8);
}

cudaError_t rms_norm(const RmsNormParams& p, cudaStream_t s) {
  if (p.rows < 1) return cudaSuccess;
  if (p.rows > 0x7fffffff) return cudaErrorInvalidValue;  // one CTA per row (grid x limit 2^31 - 1)
  const auto grid = static_cast<unsigned>(p.rows);
  if (!rms_norm_vectorised(p)) {
    rms_norm_kernel<<<grid, kThreads, 0, s>>>(p);
    return cudaGetLastError();
  }
  // The fewest float4 per thread with at most 1024 threads per row: many threads per row, so that a few
  // decode rows still issue many loads in parallel (hidden 4096: 1024 threads of one float4 each).
  const int64_t h4 = p.hidden / 4;
  const int vec = h4 <= 1024 ? 1 : h4 <= 2048 ? 2 : h4 <= 4096 ? 4 : 8;
  const int64_t per = (h4 + vec - 1) / vec;
  const unsigned threads = static_cast<unsigned>((per + 31) / 32 * 32);
  switch (vec) {
    case 1: rms_norm_vec_kernel<1><<<grid, threads, 0, s>>>(p); break;
    case 2: rms_norm_vec_kernel<2><<<grid, threads, 0, s>>>(p); break;
    case 4: rms_norm_vec_kernel<4><<<grid, threads, 0, s>>>(p); break;
    default: rms_norm_vec_kernel<8><<<grid, threads, 0, s>>>(p); break;
  }
  return cudaGetLastError();
}

cudaError_t qkv_post(const QkvPostParams& p, cudaStream_t s) {
  const int64_t total = p.rows * (p.num_heads_q + 2 * p.num_heads_kv) * (p.head_dim / 2);
  qkv_post_kernel<<<grid_for(total), kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

cudaError_t kv_append_rows(const KvAppendParams& p, cudaStream_t s) {
  kv_append_kernel<<<grid_for(p.rows * p.num_heads_kv * p.head_dim), kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

cudaError_t swiglu(const SwiGluParams& p, cudaStream_t s) {
  if (p.rows * p.inter < 1) return cudaSuccess;
  if ((p.gu == nullptr) == (p.gu_bf16 == nullptr)) return cudaErrorInvalidValue;
  if (p.inter % 4 == 0 && aligned(p.gu, 16) && aligned(p.gu_bf16, 8) && aligned(p.act, 16) && aligned(p.act_bf16, 8)) {
    swiglu_vec_kernel<<<grid_for(p.rows * p.inter / 4), kThreads, 0, s>>>(p);
    return cudaGetLastError();
  }
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
  argmax_kernel<<<static_cast<unsigned>(p.rows), kArgmaxThreads, 0, s>>>(p);
  return cudaGetLastError();
}

}  // namespace retroinfer::cuda::model
