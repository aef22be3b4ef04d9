// The 8-bit KV cache's row kernels (kv_int8_kernels.h): one warp per (row, K or V), D / 32 values per lane,
// the row's absmax by a warp reduction. The per-value arithmetic is core/row_quant.h's (the functions
// themselves, host/device), so a row quantised here equals the CPU reference bit for bit.
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
  if constexpr (kQuantize) {
    float x[kPer];
    float amax = 0.0f;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      x[e] = bf16_to_f32(src[e]);
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
#pragma unroll
    for (int e = 0; e < kPer; ++e) src[e] = int8_widen_bf16(q[e], sc);
  }
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

}  // namespace retroinfer::cuda::detail
