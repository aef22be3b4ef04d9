// Device helpers shared by the kernels of the CUDA backend (.cu files only).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kernels.h"
#include "retroinfer/dtype.h"

namespace retroinfer::cuda::detail {

// Two bf16 packed in a word -> two floats (low half is the lower element).
__device__ __forceinline__ float2 bf16x2_to_float2(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

// Eight bf16 (one 16-byte load) -> eight floats.
__device__ __forceinline__ void bf16x8_to_float(const uint4& w, float* f) {
  float2 a = bf16x2_to_float2(w.x), b = bf16x2_to_float2(w.y), c = bf16x2_to_float2(w.z),
         d = bf16x2_to_float2(w.w);
  f[0] = a.x; f[1] = a.y; f[2] = b.x; f[3] = b.y; f[4] = c.x; f[5] = c.y; f[6] = d.x; f[7] = d.y;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ int warp_sum_int(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Float -> unsigned key whose unsigned order is the float order (-inf smallest of the non-NaN).
__device__ __forceinline__ uint32_t float_order_key(float f) {
  // -0 and +0 get one key: they compare equal, so the CPU rule's sort (score desc, id asc) ties them.
  const uint32_t u = f == 0.0f ? 0u : __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
// x = hi + lo with hi = bf16(x), lo = bf16(x - hi): |x - hi - lo| <= 2^-18 |x|.
__device__ __forceinline__ void split_bf16(float x, float& hi, float& lo) {
  hi = __bfloat162float(__float2bfloat16_rn(x));
  lo = x - hi;
}

// D += A B on the tensor cores, m16n8k16, bf16 inputs, f32 accumulators (PTX fragment layouts).
__device__ __forceinline__ void mma_bf16_16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const void* smem) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, const void* smem) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
// cp.async of 16 bytes that writes zeros when `valid` is false (src-size 0).
__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* gmem, bool valid) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}

// L2 policy "evict first" for streamed data read once (its lines go before the ones other kernels reuse).
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
  return pol;
}
// cp_async16_zfill with an L2 cache policy (l2_evict_first_policy).
__device__ __forceinline__ void cp_async16_zfill_hint(void* smem, const void* gmem, bool valid, uint64_t pol) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(s), "l"(gmem), "r"(n),
               "l"(pol));
}

// Diagnostics (kernels.h kPhaseSlots): the global timer in ns (the same clock on every multiprocessor).
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Earliest / latest event of a head's CTAs into slot `slot` of phase (slots start at ~0; the latest is kept
// as the complement, so both are an atomicMin). Thread 0 only; phase may be null (off).
__device__ __forceinline__ void phase_first(uint64_t* phase, int h, int slot) {
  if (phase != nullptr && threadIdx.x == 0)
    atomicMin(reinterpret_cast<unsigned long long*>(phase + int64_t{h} * kPhaseSlots + slot), global_ns());
}
__device__ __forceinline__ void phase_last(uint64_t* phase, int h, int slot) {
  if (phase != nullptr && threadIdx.x == 0)
    atomicMin(reinterpret_cast<unsigned long long*>(phase + int64_t{h} * kPhaseSlots + slot), ~global_ns());
}

// One CTA's span into slots base .. base + 3 (kernels.h kSlotSpan): ~latest start, earliest end, the sum
// of the durations and the count (both added to the slots' ~0, so the reader adds 1). t0: this CTA's start
// (global_ns by thread 0). Thread 0 only; phase may be null (off).
__device__ __forceinline__ void phase_span(uint64_t* phase, int h, int base, uint64_t t0) {
  if (phase == nullptr || threadIdx.x != 0) return;
  const uint64_t t1 = global_ns();
  unsigned long long* s = reinterpret_cast<unsigned long long*>(phase + int64_t{h} * kPhaseSlots + base);
  atomicMin(s, ~t0);
  atomicMin(s + 1, t1);
  atomicAdd(s + 2, t1 - t0);
  atomicAdd(s + 3, 1ull);
}

// Hint: bring the line holding `p` into L2 (no register result, no wait).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }

// Programmatic dependent launch (sm_90; no-ops in a kernel launched without the attribute):
// wait = block until the grids this one depends on have completed and their writes are visible;
// launch_dependents = this CTA no longer holds back the launch of the next kernel's CTAs.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, s>>>(args...) through cudaLaunchKernelEx with one launch attribute.
template <typename... P, typename... A>
cudaError_t launch_with(cudaLaunchAttribute attr, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                        cudaStream_t s, const A&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

// kernel<<<grid, block, smem, s>>>(p), or with pdl the same launch as a programmatic dependent of the work
// before it on s (cudaLaunchAttributeProgrammaticStreamSerialization: the kernel's CTAs may start while
// that grid drains and wait in griddepcontrol.wait). Returns the launch status.
template <typename P>
cudaError_t launch_maybe_pdl(void (*kernel)(P), dim3 grid, dim3 block, size_t smem, cudaStream_t s, bool pdl,
                             const P& p) {
  if (!pdl) {
    kernel<<<grid, block, smem, s>>>(p);
    return cudaGetLastError();
  }
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  return launch_with(attr, kernel, grid, block, smem, s, p);
}

// kernel<<<grid, block, smem, s>>>(args...) as a cooperative launch (cudaLaunchAttributeCooperative: every CTA
// resident at once, so a grid-wide barrier inside the kernel cannot deadlock; the caller checks the grid
// fits). Returns the launch status.
template <typename... P, typename... A>
cudaError_t launch_cooperative(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                               const A&... args) {
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeCooperative;
  attr.val.cooperative = 1;
  return launch_with(attr, kernel, grid, block, smem, s, args...);
}

// The most CTAs of `threads` threads (and `smem` bytes of dynamic shared memory) one multiprocessor holds,
// 0 where the query fails (its error cleared). Callers cache it per kernel.
template <typename... P>
int max_ctas_per_sm(void (*kernel)(P...), int threads, size_t smem = 0) {
  int b = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, threads, smem) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return b;
}

}  // namespace retroinfer::cuda::detail
