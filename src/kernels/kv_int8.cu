// The 8-bit KV cache's row kernels (kv_int8_kernels.h): one warp per (row, K or V), D / 32 values per lane,
// the row's absmax by a warp reduction. The per-value arithmetic is core/row_quant.h's (the functions
// themselves, host/device), so a row quantised here equals the CPU reference bit for bit; the key calibration's
// subtraction, division, multiplication and addition are the _rn intrinsics (one rounding each, never fused).
// The key calibration: three small kernels of one thread per channel (partial sums, partial maxima of
// |k - mean|, the reduction and the factors).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/row_quant.h"
#include "kernels/common.cuh"
#include "kernels/kv_int8_kernels.h"

namespace retroinfer::cuda::detail {
namespace {

constexpr int kWarps = 8;  // rows per CTA (of one flat head, K or V)

template <int D, bool kQuantize>
__global__ void __launch_bounds__(kWarps * 32) kv_int8_rows_kernel(const KvInt8RowsCopy p) {
  constexpr int kPer = D / 32;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r = int64_t{blockIdx.x} * kWarps + warp;
  if (r >= p.rows) return;
  const int h = blockIdx.y;
  const bool is_v = blockIdx.z == 1;
  uint16_t* src = const_cast<uint16_t*>(is_v ? p.src_v : p.src_k) +
                  (int64_t{h} * p.src_head_stride + r) * D + lane * kPer;
  const int64_t qr = int64_t{h} * p.q_head_stride + p.q_row0 + r;
  int8_t* q = (is_v ? p.q_v : p.q_k) + qr * D + lane * kPer;
  float* scale = (is_v ? p.scale_v : p.scale_k) + qr;
  const bool calibrated = !is_v && p.k_mean != nullptr;
  const float* mean = calibrated ? p.k_mean + int64_t{h} * D + lane * kPer : nullptr;
  const float* factor = calibrated ? p.k_factor + int64_t{h} * D + lane * kPer : nullptr;
  if constexpr (kQuantize) {
    float x[kPer];
    float amax = 0.0f;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      x[e] = bf16_to_f32(src[e]);
      if (calibrated) x[e] = __fdiv_rn(__fsub_rn(x[e], mean[e]), factor[e]);
      amax = fmaxf(amax, fabsf(x[e]));
    }
    amax = warp_max(amax);
    const float inv = int8_row_inverse(amax);
    uint32_t packed = 0;
#pragma unroll
    for (int e = 0; e < kPer; ++e) packed |= uint32_t{static_cast<uint8_t>(int8_quantize(x[e], inv))} << (8 * e);
    if constexpr (kPer == 4) *reinterpret_cast<uint32_t*>(q) = packed;
    else *reinterpret_cast<uint16_t*>(q) = static_cast<uint16_t>(packed);
    if (lane == 0) *scale = int8_row_scale(amax);
  } else {
    const float sc = *scale;
    if (calibrated) {
#pragma unroll
      for (int e = 0; e < kPer; ++e)
        src[e] = f32_to_bf16(__fadd_rn(__fmul_rn(__fmul_rn(static_cast<float>(q[e]), sc), factor[e]), mean[e]));
    } else {
#pragma unroll
      for (int e = 0; e < kPer; ++e) src[e] = int8_widen_bf16(q[e], sc);
    }
  }
}

// The rows [t0, t1) of head h's split `split` (kKeyStatSplits splits of ceil(n / kKeyStatSplits) rows).
__device__ __forceinline__ void split_rows(int64_t n, int split, int64_t& t0, int64_t& t1) {
  const int64_t per = (n + kKeyStatSplits - 1) / kKeyStatSplits;
  t0 = per * split < n ? per * split : n;
  t1 = t0 + per < n ? t0 + per : n;
}

// Channel d's mean over head h's rows: the splits' partial sums added in split order (every kernel that needs
// it computes the same float).
__device__ __forceinline__ float key_mean(const KvKeyCalibrationParams& p, int h, int d) {
  if (p.n <= 0) return 0.0f;
  const float* sums = p.partials + int64_t{h} * kKeyStatSplits * p.head_dim + d;
  double total = 0.0;
  for (int s = 0; s < kKeyStatSplits; ++s) total += static_cast<double>(sums[int64_t{s} * p.head_dim]);
  return static_cast<float>(total / static_cast<double>(p.n));
}

// Block (split, h), thread d: the split's sum of channel d.
__global__ void key_sum_kernel(const KvKeyCalibrationParams p) {
  const int split = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
  int64_t t0, t1;
  split_rows(p.n, split, t0, t1);
  const uint16_t* k = p.k + int64_t{h} * p.head_stride * p.head_dim + d;
  double acc = 0.0;
#pragma unroll 8  // eight rows' loads in flight per thread
  for (int64_t t = t0; t < t1; ++t) acc += static_cast<double>(bf16_to_f32(k[t * p.head_dim]));
  p.partials[(int64_t{h} * kKeyStatSplits + split) * p.head_dim + d] = static_cast<float>(acc);
}

// Block (split, h), thread d: the split's max |k - mean| of channel d.
__global__ void key_deviation_kernel(const KvKeyCalibrationParams p) {
  const int split = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
  int64_t t0, t1;
  split_rows(p.n, split, t0, t1);
  const float mean = key_mean(p, h, d);
  const uint16_t* k = p.k + int64_t{h} * p.head_stride * p.head_dim + d;
  float dev = 0.0f;
#pragma unroll 8
  for (int64_t t = t0; t < t1; ++t) dev = fmaxf(dev, fabsf(__fsub_rn(bf16_to_f32(k[t * p.head_dim]), mean)));
  const int64_t num_partials = int64_t{p.num_heads} * kKeyStatSplits * p.head_dim;
  p.partials[num_partials + (int64_t{h} * kKeyStatSplits + split) * p.head_dim + d] = dev;
}

// Block h, thread d: channel d's mean and factor.
__global__ void key_factor_kernel(const KvKeyCalibrationParams p) {
  __shared__ float head_max[128];
  const int h = blockIdx.x, d = threadIdx.x;
  const int64_t num_partials = int64_t{p.num_heads} * kKeyStatSplits * p.head_dim;
  const float* devs = p.partials + num_partials + int64_t{h} * kKeyStatSplits * p.head_dim + d;
  float dev = 0.0f;
  for (int s = 0; s < kKeyStatSplits; ++s) dev = fmaxf(dev, devs[int64_t{s} * p.head_dim]);
  head_max[d] = dev;
  __syncthreads();
  for (int w = p.head_dim / 2; w > 0; w /= 2) {
    if (d < w) head_max[d] = fmaxf(head_max[d], head_max[d + w]);
    __syncthreads();
  }
  const float top = head_max[0];
  const bool varies = top > 0.0f && isfinite(top);
  p.mean[int64_t{h} * p.head_dim + d] = key_mean(p, h, d);
  p.factor[int64_t{h} * p.head_dim + d] = varies ? sqrtf(fmaxf(dev, kKeyFactorFloor * top)) : 1.0f;
}

template <bool kQuantize>
cudaError_t launch_rows(const KvInt8RowsCopy& p, cudaStream_t s) {
  if (p.rows <= 0) return cudaSuccess;
  if (p.num_heads < 1 || p.rows > (int64_t{1} << 36)) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((p.rows + kWarps - 1) / kWarps), static_cast<unsigned>(p.num_heads), 2);
  if (p.head_dim == 128) kv_int8_rows_kernel<128, kQuantize><<<grid, kWarps * 32, 0, s>>>(p);
  else if (p.head_dim == 64) kv_int8_rows_kernel<64, kQuantize><<<grid, kWarps * 32, 0, s>>>(p);
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}

}  // namespace

cudaError_t kv_int8_quantize(const KvInt8RowsCopy& p, cudaStream_t s) { return launch_rows<true>(p, s); }
cudaError_t kv_int8_widen(const KvInt8RowsCopy& p, cudaStream_t s) { return launch_rows<false>(p, s); }

cudaError_t kv_int8_key_calibration(const KvKeyCalibrationParams& p, cudaStream_t s) {
  if (p.num_heads < 1 || p.n < 0 || (p.head_dim != 64 && p.head_dim != 128)) return cudaErrorInvalidValue;
  const dim3 grid(kKeyStatSplits, static_cast<unsigned>(p.num_heads));
  key_sum_kernel<<<grid, p.head_dim, 0, s>>>(p);
  key_deviation_kernel<<<grid, p.head_dim, 0, s>>>(p);
  key_factor_kernel<<<p.num_heads, p.head_dim, 0, s>>>(p);
  return cudaGetLastError();
}

}  // namespace retroinfer::cuda::detail
