// Dependent-load latency probe: one thread walks N addresses at a stride (each load's address depends on the
// previous value, which is 0), timing with globaltimer. Cold (after touching a 256 MiB buffer to evict L2 and
// TLBs) and warm (second walk).
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
__device__ __forceinline__ uint64_t gns() { uint64_t t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__global__ void walk(const char* base, size_t stride, int n, uint64_t* out) {
  uint64_t dep = 0, t0 = gns();
  for (int i = 0; i < n; ++i) {
    unsigned v;
    const unsigned* p = reinterpret_cast<const unsigned*>(base + size_t(i) * stride + dep);
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p));
    dep = v;  // 0: the buffer is zeroed
  }
  uint64_t t1 = gns();
  out[0] = t1 - t0; out[1] = dep;
}
__global__ void touch(const int4* p, size_t n, int* sink) {
  int acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) acc ^= p[i].x;
  if (acc == 12345) *sink = acc;
}
int main() {
  const size_t big = size_t(4) << 30, flushb = size_t(512) << 20;
  char *buf, *fl; int* sink; uint64_t* out;
  cudaMalloc(&buf, big); cudaMalloc(&fl, flushb); cudaMalloc(&sink, 4); cudaMalloc(&out, 16);
  cudaMemset(buf, 0, big); cudaMemset(fl, 1, flushb);
  struct C { const char* name; size_t stride; int n; } cases[] = {
      {"same 2MB page, 4 KB apart (L2 misses)", 4096, 256},
      {"64 KB apart", 65536, 256},
      {"2 MB apart (a new 2 MB page each)", size_t(2) << 20, 512},
      {"32 MB apart", size_t(32) << 20, 120},
  };
  for (auto& c : cases) {
    for (int rep = 0; rep < 3; ++rep) {
      touch<<<1024, 256>>>(reinterpret_cast<const int4*>(fl), flushb / 16, sink);  // evict L2 (and TLB entries?)
      walk<<<1, 1>>>(buf + 128, c.stride, c.n, out);
      uint64_t h[2]; cudaMemcpy(h, out, 16, cudaMemcpyDeviceToHost);
      walk<<<1, 1>>>(buf + 128, c.stride, c.n, out);  // warm TLB, L2 hit
      uint64_t w[2]; cudaMemcpy(w, out, 16, cudaMemcpyDeviceToHost);
      std::printf("%-40s cold %.0f ns/load, warm (L2 hit) %.0f ns/load\n", c.name, double(h[0]) / c.n, double(w[0]) / c.n);
    }
  }
  // The same after a flush that only touches 64 MiB (like --flush read's 128 MiB dense decode)
  return 0;
}
